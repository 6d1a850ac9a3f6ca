"""The speed work on the perturbations keeps their results: batched = per-image, fast paths = slow paths.

Speed itself is measured in benchmarks/perturb_speed.py, never asserted here.
"""

from __future__ import annotations

import math
from typing import Any

import cv2
import numpy as np
import pytest

from mmchaos import perturb
from mmchaos.perturb import Applied, _ops
from mmchaos.perturb.base import ImagePerturbation, rgb_stack
from tests.fakes import targets as fakes

RNG = np.random.default_rng(11)
STACK = RNG.integers(0, 256, (5, 24, 20, 3), dtype=np.uint8)
STACK_KERNELS = [
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "speckle_noise",
    "brightness",
    "contrast",
    "saturate",
]


def _one_by_one(pert: Any, images: Any, applied: Applied) -> list[Any]:
    """The per-image path: each image replayed alone with its own recorded parameters."""
    return [
        pert.replay([image], Applied(applied.name, applied.severity, (p,)))[0]
        for image, p in zip(images, applied.items)
    ]


@pytest.mark.parametrize("name", STACK_KERNELS)
def test_images_of_a_chunk_each_run_alone_with_the_bytes_of_the_stacked_path(name: str) -> None:
    """Above half a chunk apply_batch skips the stack: the result is still each image replayed alone,
    and the bytes of the stacked path (forced here by a chunk that holds the whole batch)."""
    from mmchaos.perturb import _stack

    big = np.ascontiguousarray(np.repeat(np.repeat(STACK[:3], 10, axis=1), 10, axis=2))  # 3 x 240 x 200 x 3
    assert 2 * big[0].size > _stack.CHUNK_VALUES
    pert = perturb.get(name)
    out, applied = pert(list(big), 3, rng=5)
    assert all(np.array_equal(b, a) for b, a in zip(out, _one_by_one(pert, big, applied), strict=True))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_stack, "CHUNK_VALUES", 4 * big[0].size)
        stacked, again = pert(list(big), 3, rng=5)
    assert again == applied and all(np.array_equal(b, a) for b, a in zip(out, stacked, strict=True))


def test_the_pointwise_and_noise_kernels_are_stack_kernels() -> None:
    for name in STACK_KERNELS:
        pert = perturb.get(name)
        assert isinstance(pert, ImagePerturbation) and pert.stack_kernel, name


@pytest.mark.parametrize("name", STACK_KERNELS)
@pytest.mark.parametrize("severity", [1, 5])
def test_a_batch_gives_the_bytes_each_image_gives_alone(name: str, severity: int) -> None:
    pert = perturb.get(name)
    batch, applied = pert(STACK, severity, rng=3)
    alone = _one_by_one(pert, STACK, applied)
    assert all(np.array_equal(b, a) for b, a in zip(batch, alone, strict=True))
    as_list, _ = pert(list(STACK), severity, rng=3)
    assert all(np.array_equal(b, a) for b, a in zip(batch, as_list, strict=True))


@pytest.mark.parametrize("name", STACK_KERNELS)
def test_a_record_mixing_severities_replays_each_item_with_its_own_parameters(name: str) -> None:
    pert = perturb.get(name)
    items = tuple(pert(STACK[i : i + 1], 1 + 2 * (i % 3), rng=i)[1].items[0] for i in range(len(STACK)))
    mixed = Applied(name, 3, items)
    batch = pert.replay(STACK, mixed)
    assert all(np.array_equal(b, a) for b, a in zip(batch, _one_by_one(pert, STACK, mixed), strict=True))


def test_a_batch_bigger_than_one_chunk_matches_too(monkeypatch: pytest.MonkeyPatch) -> None:
    from mmchaos.perturb import _stack

    pert = perturb.get("gaussian_noise")
    whole, applied = pert(STACK, 4, rng=1)
    monkeypatch.setattr(_stack, "CHUNK_VALUES", STACK[0].size * 2)  # chunks of two images
    assert np.array_equal(pert.replay(STACK, applied), whole)
    items = tuple(pert(STACK[i : i + 1], 1 + 2 * (i % 3), rng=i)[1].items[0] for i in range(len(STACK)))
    mixed = Applied(pert.name, 3, items)  # groups inside chunks
    assert all(np.array_equal(b, a) for b, a in zip(pert.replay(STACK, mixed), _one_by_one(pert, STACK, mixed)))


def test_mixed_layouts_fall_back_to_the_per_image_path() -> None:
    pert = perturb.get("gaussian_noise")
    gray = RNG.integers(0, 256, (24, 20), dtype=np.uint8)
    rgba = RNG.integers(0, 256, (24, 20, 4), dtype=np.uint8)
    out, applied = pert([STACK[0], gray, rgba], 3, rng=0)
    assert [o.shape for o in out] == [(24, 20, 3), (24, 20), (24, 20, 4)]
    assert np.array_equal(out[0], _one_by_one(pert, [STACK[0]], Applied(applied.name, 3, applied.items[:1]))[0])
    assert np.array_equal(out[2][..., 3], rgba[..., 3])


def test_a_stacked_batch_is_used_in_place_and_never_returned_as_the_input() -> None:
    same = rgb_stack(list(STACK))
    assert same is not None and np.shares_memory(same, STACK) and np.array_equal(same, STACK)
    reordered = rgb_stack(list(STACK[::-1]))  # not consecutive rows: a copy
    assert reordered is not None and not np.shares_memory(reordered, STACK)
    assert np.array_equal(reordered, STACK[::-1])
    assert not np.shares_memory(rgb_stack(list(STACK[:, ::2])), STACK)  # not contiguous rows: a copy
    out, _ = perturb.get("channel_swap")(STACK, 0, rng=0)
    assert not np.shares_memory(out, STACK) and np.array_equal(out, STACK)


class _Identity(ImagePerturbation):
    """Returns its input unchanged, without a copy (a lazy plug-in might)."""

    name = "identity_for_test"
    stack_kernel = True

    def sample(self, item: Any, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {}

    def apply_stack(self, stack: Any, params: Any) -> Any:
        return stack


def test_a_kernel_returning_its_input_does_not_alias_the_callers_batch() -> None:
    out, _ = _Identity()(STACK, 3, rng=0)
    assert np.array_equal(out, STACK) and not np.shares_memory(out, STACK)


# --- _ops.filter2d ------------------------------------------------------------------------------


@pytest.mark.parametrize("radius,alias", [(3, 0.1), (6, 0.5), (10, 0.5)])
def test_filter2d_gives_the_values_of_the_float32_input_path(radius: float, alias: float) -> None:
    """Truncated to uint8 as the reference does, whichever OpenCV path the kernel's size picks
    (direct under 130 taps, the DFT above): the float32-input values."""
    image = np.ascontiguousarray(cv2.GaussianBlur(RNG.integers(0, 256, (90, 70, 3), dtype=np.uint8), (0, 0), 2))
    kernel = _ops.disk(float(radius), alias)
    ours = _ops.filter2d(image, kernel)
    before = cv2.filter2D(image.astype(np.float32), -1, kernel, borderType=cv2.BORDER_REFLECT_101)
    before = np.clip(before, 0, 255).astype(np.uint8)
    assert ours.dtype == np.uint8 and ours.shape == image.shape
    diff = ours.astype(int) - before
    # Only sums within float32 rounding of an integer may land on the other side of it.
    assert np.abs(diff).max() <= 1 and (diff != 0).mean() < 0.02
    rounded = cv2.filter2D(image, -1, kernel, borderType=cv2.BORDER_REFLECT_101)  # plain uint8: rounds
    assert (ours != rounded).mean() > 0.2  # truncated as before, not rounded


def test_filter2d_correlates_as_filter2d_on_any_kernel_and_channel_count() -> None:
    """A lopsided kernel of over 130 taps (OpenCV's DFT path) and a 4-channel image: filter2D's
    correlation with its border, truncated; a second call gives the same bytes."""
    image = np.ascontiguousarray(cv2.GaussianBlur(RNG.integers(0, 256, (41, 57, 4), dtype=np.uint8), (0, 0), 1))
    kernel = np.zeros((13, 13), np.float32)
    kernel[2, 9], kernel[6, 6], kernel[11, 1] = 0.5, 0.25, 0.25
    ours = _ops.filter2d(image, kernel)
    expected = cv2.filter2D(image.astype(np.float32), -1, kernel, borderType=cv2.BORDER_REFLECT_101)
    diff = ours.astype(int) - np.clip(expected, 0, 255).astype(np.uint8)
    assert ours.shape == image.shape and np.abs(diff).max() <= 1 and (diff != 0).mean() < 0.02
    assert np.array_equal(_ops.filter2d(image, kernel), ours)


# --- shot noise by inverse CDF --------------------------------------------------------------------


@pytest.mark.parametrize("photons", [60, 25, 12, 5, 3])
def test_shot_noise_table_has_the_poisson_distribution(photons: int) -> None:
    """Every level of every ImageNet-C table: the mean within 0.05 levels and the variance within
    1.5% (or two levels squared, for the rare bright outcomes of dark levels) of the exact
    distribution's: 2**12 quantiles move each outcome's probability by at most 1/8192."""
    table = _ops.poisson_level_table(float(photons))
    assert table.shape == (256, 1 << _ops.POISSON_BITS)  # [level, quantile]
    k = np.arange(0, 4 * photons + 40)
    values = np.clip((k * (255.0 / photons)).astype(np.float32), 0, 255).astype(np.uint8).astype(float)
    log_fact = np.array([math.lgamma(i + 1) for i in k])
    for level in range(256):
        rate = level * photons / 255.0
        # The exact distribution of the output level, from the Poisson pmf, next to the table's.
        pmf = np.exp(k * math.log(rate) - rate - log_fact) if rate > 0 else (k == 0) * 1.0
        row = table[level].astype(float)
        mean = float((pmf * values).sum())
        var = float((pmf * (values - mean) ** 2).sum())
        assert row.mean() == pytest.approx(mean, abs=0.05), level
        assert row.var() == pytest.approx(var, rel=0.015, abs=2.0), level


def test_shot_noise_past_the_table_uses_the_normal_approximation() -> None:
    flat = np.full((64, 64, 3), 128, np.uint8)
    fields = _ops.uniform16(np.random.default_rng(0), flat.shape)
    out = _ops.poisson_levels(flat, fields, 5000.0).astype(float)
    counts = out / 255 * 5000
    assert counts.mean() == pytest.approx(128 / 255 * 5000, rel=0.01)
    assert counts.var() == pytest.approx(128 / 255 * 5000, rel=0.15)


# --- superpixels and saliency maps are computed once per image ---------------------------------


def test_a_second_severity_does_not_recompute_superpixels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even from a new perturbation instance (the drift check and Ray work units make one per severity)."""
    from mmchaos.perturb import _slic

    calls: list[tuple[int, ...]] = []
    real = _slic._slic

    def counting(rgb: Any, *args: Any) -> Any:
        calls.append(rgb.shape)
        return real(rgb, *args)

    monkeypatch.setattr(_slic, "_slic", counting)
    monkeypatch.setattr(_slic, "SEGMENTS", _slic.SegmentCache())
    images = [RNG.integers(0, 256, (120, 100, 3), dtype=np.uint8) for _ in range(3)]
    first, _ = perturb.get("superpixel_occlusion")(images, 1, rng=0)
    assert len(calls) == 3  # one segmentation an image, shared by sampling and applying
    for severity in (2, 3, 5):
        perturb.get("superpixel_occlusion")(images, severity, rng=0)
    assert len(calls) == 3
    changed = images[0].copy()
    changed[0, 0] ^= 1
    perturb.get("superpixel_occlusion")([changed], 1, rng=0)
    assert len(calls) == 4  # keyed on the bytes: another image is segmented


def test_cached_superpixels_are_the_computed_ones_and_the_cache_is_bounded() -> None:
    from mmchaos.perturb._slic import SegmentCache, slic

    image = RNG.integers(0, 256, (150, 130, 3), dtype=np.uint8)
    cache = SegmentCache()
    fresh = slic(image, cache=None)
    assert np.array_equal(slic(image, cache=cache), fresh) and np.array_equal(slic(image, cache=cache), fresh)
    assert (cache.misses, cache.hits) == (1, 1)
    out = slic(image, cache=cache)
    out[:] = 0  # the caller's copy: the cached labels stay as they were
    assert np.array_equal(slic(image, cache=cache), fresh)
    small = SegmentCache(max_bytes=3 * 96 * 84 * 4)
    for i in range(6):
        slic(np.roll(image, i, axis=0), cache=small)
    assert len(small) == 3


def _nearest_by_gather(centres: np.ndarray, cand: np.ndarray, feats: np.ndarray, weight: np.float32) -> np.ndarray:
    """SLIC's assignment step written plainly: a (pixels, 9, 5) gather, the distance, argmin."""
    diff = centres[cand] - feats[:, None, :]
    d2 = (diff[..., :3] ** 2).sum(-1) + weight * (diff[..., 3:] ** 2).sum(-1)
    return np.asarray(cand[np.arange(len(cand)), d2.argmin(axis=1)])


def test_superpixel_assignment_is_the_plain_gather_and_argmin_ties_to_the_first() -> None:
    from mmchaos.perturb._slic import _nearest

    gen = np.random.default_rng(7)
    centres = gen.uniform(0, 100, (64, 5)).astype(np.float32)
    centres[9] = centres[3]  # exact ties: the earlier candidate wins, as argmin's first minimum
    cand = gen.integers(0, 64, (5000, 9))
    cand[:100, 2], cand[:100, 6] = 9, 3  # a tie between columns 2 and 6 in that order, ...
    cand[100:200, 1], cand[100:200, 5] = 3, 9  # ... and in the other
    feats = np.concatenate([centres[3:4] + gen.normal(0, 0.01, (200, 5)), gen.uniform(0, 100, (4800, 5))])
    feats = feats.astype(np.float32)
    weight = np.float32(0.7)
    got = _nearest(centres, np.ascontiguousarray(cand.T), [np.ascontiguousarray(feats[:, k]) for k in range(5)], weight)
    assert np.array_equal(got, _nearest_by_gather(centres, cand, feats, weight))
    tied = np.isin(cand[:200], [3, 9])  # the rows near centre 3 (= centre 9): the first of the two
    assert np.array_equal(got[:200], cand[:200][np.arange(200), tied.argmax(axis=1)]), "the first of equals"


def test_a_second_severity_does_not_recompute_saliency() -> None:

    class Counting(fakes.ShapeColourTarget):
        def __init__(self) -> None:
            super().__init__()
            self.embedded = 0

        def embed_images(self, images: Any) -> Any:
            self.embedded += len(images)
            return super().embed_images(images)

    from mmchaos.data.shapes import make_shapes

    images = [s.image for s in make_shapes(4, seed=2)]
    target = Counting()
    pert = perturb.get("saliency_occlusion").bind(perturb.BindContext(target=target))
    pert(images, 1, rng=0)
    first = target.embedded
    assert first >= 4 * 16  # every image and its occluded variants
    for severity in (2, 3, 4, 5):
        pert(images, severity, rng=0)
    assert target.embedded == first


@pytest.mark.parametrize("shape", [(1,), (3,), (5, 7), (24, 20, 3), (33, 17, 3)])
def test_uniform16_is_numpys_16_bit_integers(shape: tuple[int, ...]) -> None:
    """The fast draw gives NumPy's bytes, so noise records made before it replay unchanged."""
    expected = np.random.default_rng(99).integers(0, 65536, size=shape, dtype=np.uint16)
    assert np.array_equal(_ops.uniform16(np.random.default_rng(99), shape), expected)


# --- one noise stream a batch -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise"])
def test_a_batch_draws_its_noise_from_one_stream_and_each_item_replays_alone(name: str) -> None:
    pert = perturb.get(name)
    flat = np.full((4, 16, 12, 3), 128, np.uint8)
    out, applied = pert(flat, 5, rng=8)
    seeds = {p["seed"] for p in applied.items}
    words = _ops.uniform16_words(flat.shape[1:])
    assert len(seeds) == 1 and [p["offset"] for p in applied.items] == [0, words, 2 * words, 3 * words]
    assert len({o.tobytes() for o in out}) == 4  # four different fields, not one repeated
    assert all(np.array_equal(b, a) for b, a in zip(out, _one_by_one(pert, flat, applied), strict=True))


def test_uniform16_stack_reads_each_item_at_its_offset() -> None:
    shape = (5, 7, 3)  # 105 values: 27 outputs, the last one's spare words dropped
    words = _ops.uniform16_words(shape)
    stream = np.random.PCG64(4).random_raw(3 * words).astype("<u8").view("<u2").reshape(3, words * 4)
    expected = stream[:, : 5 * 7 * 3].reshape(3, *shape)
    assert np.array_equal(_ops.uniform16_stack([4, 4, 4], shape, [0, words, 2 * words]), expected)
    assert np.array_equal(_ops.uniform16_stack([4], shape, [words])[0], expected[1])  # one item alone
    # A record without an offset (one item sampled alone, or made before offsets) starts the stream.
    assert np.array_equal(_ops.uniform16_stack([9], shape)[0], _ops.uniform16(np.random.default_rng(9), shape))


def test_a_grey_or_rgba_item_in_a_mixed_batch_replays_with_its_offset() -> None:
    pert = perturb.get("gaussian_noise")
    grey = RNG.integers(0, 256, (24, 20), dtype=np.uint8)
    rgba = RNG.integers(0, 256, (24, 20, 4), dtype=np.uint8)
    out, applied = pert([STACK[0], grey, rgba], 3, rng=0)
    for i, item in enumerate([STACK[0], grey, rgba]):
        alone = pert.replay([item], Applied(applied.name, 3, (applied.items[i],)))[0]
        assert np.array_equal(alone, out[i])
    assert not np.array_equal(out[1], pert.replay([grey], Applied(applied.name, 3, (applied.items[0],)))[0])


# --- pixelate as Pillow's BOX, truncation in one pass ---------------------------------------------


@pytest.mark.parametrize("factor", [0.6, 0.5, 0.4, 0.3, 0.25])
def test_pixelate_downscale_is_pillows_box_within_one_level(factor: float) -> None:
    """Pillow averages runs of whole pixels; OpenCV's INTER_AREA, used before, weighed fractional
    footprints and was up to 56 levels off on natural images."""
    image_mod = pytest.importorskip("PIL.Image")
    image = np.ascontiguousarray(cv2.GaussianBlur(RNG.integers(0, 256, (97, 131, 3), dtype=np.uint8), (0, 0), 1.0))
    size = (int(131 * factor), int(97 * factor))
    pillow = np.asarray(image_mod.fromarray(image).resize(size, image_mod.BOX)).astype(int)
    ours = _ops.box_downscale(image, *size).astype(int)
    assert ours.shape == pillow.shape and np.abs(ours - pillow).max() <= 1


def test_truncate_u8_truncates_clips_and_keeps_whole_levels() -> None:
    values = np.array([0.0, 0.2, 0.999, 1.0, 1.5, 2.0, 3.0, 127.0, 254.99, 255.0, 300.0], np.float32)
    assert _ops.truncate_u8(values).tolist() == [0, 0, 0, 1, 1, 2, 3, 127, 254, 255, 255]
    rand = RNG.random(10_000).astype(np.float32) * 255
    assert np.array_equal(_ops.truncate_u8(rand), rand.astype(np.uint8))
    assert np.array_equal(_ops.truncate_u8(rand, 0.5), (rand * np.float32(0.5)).astype(np.uint8))


# --- brightness: black pixels become grey, with or without the lift ------------------------------


@pytest.mark.parametrize("severity", [1, 3, 5])
def test_brightness_makes_black_pixels_grey_and_scales_the_rest_by_v_prime_over_v(severity: int) -> None:
    """The kernel lifts black pixels only in images that have one: both kinds of image give
    ImageNet-C's value (V raised by the offset, hue and saturation kept) within one level."""
    pert = perturb.get("brightness")
    offset = pert.TABLE[severity - 1] * 255  # type: ignore[attr-defined]
    no_black = np.maximum(STACK[:2], 1)
    with_black = no_black.copy()
    with_black[:, 3:6, 4:9] = 0
    for images in (no_black, with_black):
        out, _ = pert(images, severity, rng=0)
        v = images.max(axis=3, keepdims=True).astype(float)
        expected = np.where(v > 0, images * np.minimum(v + offset, 255) / np.maximum(v, 1), min(offset, 255))
        assert np.abs(out.astype(float) - expected).max() <= 1.0
    assert (out[:, 3:6, 4:9] == round(offset)).all()
