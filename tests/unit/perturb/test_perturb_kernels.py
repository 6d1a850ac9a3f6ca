"""The vectorised kernels against straightforward re-statements of the reference formulas.

The references below are written the way ImageNet-C's code computes (loops, colorsys, SciPy),
small enough to run in a test; the kernels must agree with them exactly or to interpolation
precision. Statistical kernels (noise) are checked on their moments.
"""

from __future__ import annotations

import colorsys
import math

import cv2
import numpy as np
import pytest

from mmchaos import perturb
from mmchaos.perturb import _ops
from mmchaos.perturb._slic import slic
from mmchaos.perturb.deployment import exif_transform, text_boxes
from mmchaos.perturb.textures import FROST_STYLES, frost_texture

RNG = np.random.default_rng(0)
IMG = RNG.integers(0, 256, (40, 48, 3), dtype=np.uint8)


def _reference_motion_blur(x: np.ndarray, radius: int, sigma: float, angle: float) -> np.ndarray:
    """imagecorruptions' _motion_blur: shifted copies with replicated edges, one-sided weights."""
    width = radius * 2 + 1
    k = np.exp(-(np.arange(width) ** 2) / (2 * sigma**2))
    k /= k.sum()
    point = (width * math.sin(math.radians(angle)), width * math.cos(math.radians(angle)))
    hypot = math.hypot(*point)
    out = np.zeros_like(x, dtype=np.float64)
    h, w = x.shape[:2]
    for i in range(width):
        dy = -math.ceil(((i * point[0]) / hypot) - 0.5)
        dx = -math.ceil(((i * point[1]) / hypot) - 0.5)
        rows = np.clip(np.arange(h) - dy, 0, h - 1)
        cols = np.clip(np.arange(w) - dx, 0, w - 1)
        out += k[i] * x[rows][:, cols]
    return out


@pytest.mark.parametrize("angle", [-45.0, -10.0, 0.0, 33.3, 45.0])
def test_motion_blur_kernel_equals_shift_and_add(angle: float) -> None:
    x = IMG.astype(np.float32)
    ours = _ops.motion_blur(x, 5, 3.0, angle)
    assert np.allclose(ours, _reference_motion_blur(x, 5, 3.0, angle), atol=1e-3)


def test_clipped_zoom_matches_scipy_zoom() -> None:
    """Up to a sub-pixel offset: OpenCV aligns pixel centres, SciPy corners (smooth image)."""
    import cv2

    scizoom = pytest.importorskip("scipy.ndimage").zoom

    x = cv2.GaussianBlur(IMG.astype(np.float32), (0, 0), 3)
    for z in (1.05, 1.17, 1.3):
        h, w = x.shape[:2]
        ch0, ch1 = math.ceil(h / z), math.ceil(w / z)
        t0, t1 = (h - ch0) // 2, (w - ch1) // 2
        ref = scizoom(x[t0 : t0 + ch0, t1 : t1 + ch1], (z, z, 1), order=1)[:h, :w]
        diff = np.abs(_ops.clipped_zoom(x, z) - ref)
        assert diff.mean() < 1.0 and diff.max() < 6


def test_brightness_and_saturate_follow_hsv_exactly() -> None:
    pixels = np.concatenate([IMG.reshape(-1, 3)[:200], [[0, 0, 0], [255, 255, 255], [10, 10, 10]]]).astype(np.uint8)
    img = pixels.reshape(1, -1, 3)
    bright = perturb.get("brightness")([img], severity=3, rng=0)[0][0].reshape(-1, 3)
    sat = perturb.get("saturate")([img], severity=4, rng=0)[0][0].reshape(-1, 3)
    for p, b, s in zip(pixels, bright, sat, strict=True):
        h, sv, v = colorsys.rgb_to_hsv(*(p / 255.0))
        ref_b = np.clip(np.array(colorsys.hsv_to_rgb(h, sv, min(1.0, v + 0.3))), 0, 1) * 255
        ref_s = np.clip(np.array(colorsys.hsv_to_rgb(h, min(1.0, sv * 5 + 0.1), v)), 0, 1) * 255
        assert np.all(np.abs(b.astype(float) - np.floor(ref_b)) <= 1), (p, b, ref_b)
        assert np.all(np.abs(s.astype(float) - np.floor(ref_s)) <= 1), (p, s, ref_s)


@pytest.mark.parametrize("severity", [1, 2, 5])
def test_contrast_is_the_per_channel_formula(severity: int) -> None:
    """The reference's values, truncated as it truncates: equal but where the channel means, summed
    in another order, put a value on the other side of a level (a scaling pass then a rounded
    offset, used before, was a level off on many pixels)."""
    factor = (0.4, 0.3, 0.2, 0.1, 0.05)[severity - 1]
    out = perturb.get("contrast")([IMG], severity=severity, rng=0)[0][0].astype(float)
    x = IMG / 255.0
    ref = np.floor(np.clip((x - x.mean(axis=(0, 1))) * factor + x.mean(axis=(0, 1)), 0, 1) * 255)
    assert np.abs(out - ref).max() <= 1 and (out != ref).mean() < 0.001


def test_noise_moments_match_the_tables() -> None:
    flat = np.full((128, 128, 3), 128, np.uint8)
    out = perturb.get("impulse_noise")([flat], severity=5, rng=0)[0][0]
    assert (out == 0).mean() == pytest.approx(0.135, abs=0.01) and (out == 255).mean() == pytest.approx(0.135, abs=0.01)
    out = perturb.get("shot_noise")([flat], severity=1, rng=0)[0][0]
    counts = out.astype(float) / 255 * 60
    assert counts.mean() == pytest.approx(128 / 255 * 60, abs=0.5) and counts.var() == pytest.approx(30, rel=0.1)
    out = perturb.get("gaussian_noise")([flat], severity=5, rng=0)[0][0]
    assert 0.3 < (out.astype(float) - 128).std() / 255 < 0.4  # clipping trims the tails a little


def test_glass_blur_displacement_statistics() -> None:
    p = perturb.get("glass_blur")
    params = p.sample(IMG, 5, np.random.default_rng(0))
    assert params["shift_std"] == 4.7 and (params["sigma"], params["max_delta"], params["iterations"]) == (1.5, 4, 2)


def test_frost_texture_matches_the_reference_statistics() -> None:
    for style, (means, stds) in enumerate(FROST_STYLES):
        tex = frost_texture(224, 224, style, seed=style)
        assert np.allclose(tex.mean(axis=(0, 1)), means, atol=4)
        assert np.allclose(tex.std(axis=(0, 1)), stds, rtol=0.15)
    assert np.array_equal(frost_texture(50, 60, 1, 7), frost_texture(50, 60, 1, 7))


def test_plasma_fractal_is_a_normalised_height_map() -> None:
    m = _ops.plasma_fractal(64, 2.0, np.random.default_rng(0))
    assert m.shape == (64, 64) and m.min() == 0 and m.max() == 1
    with pytest.raises(ValueError):
        _ops.plasma_fractal(60, 2.0, np.random.default_rng(0))


def test_exif_transforms_are_the_eight_orientations() -> None:
    x = np.arange(6).reshape(2, 3)
    outs = {o: exif_transform(x, o) for o in range(1, 9)}
    assert np.array_equal(outs[1], x) and np.array_equal(outs[3], x[::-1, ::-1])
    assert {o.shape for o in outs.values()} == {(2, 3), (3, 2)}
    assert len({o.tobytes() + bytes(o.shape) for o in outs.values()}) == 8


def test_slic_makes_compact_superpixels_that_follow_edges() -> None:
    img = np.zeros((64, 64, 3), np.uint8)
    img[:, 32:] = (255, 0, 0)
    labels = slic(img, n_segments=16)
    assert labels.shape == (64, 64) and 8 <= len(np.unique(labels)) <= 16
    left, right = set(np.unique(labels[:, :30])), set(np.unique(labels[:, 34:]))
    assert not left & right, "no superpixel straddles the colour edge"


def test_text_boxes_find_words_on_a_text_line() -> None:
    from mmchaos.data.textlines import make_textline

    sample = make_textline(0, 3)
    boxes = text_boxes(sample.image)
    words = len((sample.text or "").split())
    assert 1 <= len(boxes) <= 3 * words


@pytest.mark.parametrize("border", [cv2.BORDER_REFLECT_101, cv2.BORDER_REPLICATE])
@pytest.mark.parametrize("shape", [(40, 48, 3), (33, 61)], ids=["colour", "grey"])
def test_the_dft_path_is_filter2d_of_an_asymmetric_kernel(border: int, shape: tuple[int, ...]) -> None:
    """A correlation with the anchor at the centre, as filter2D's, whatever the kernel's symmetry,
    the image's channels and the border (a flipped or shifted kernel, or a wrap into the image,
    moves values by whole pixels, far past the float error allowed here)."""
    img = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
    kernel = np.random.default_rng(2).random((13, 15)).astype(np.float32)
    kernel /= kernel.sum()
    ref = cv2.filter2D(img.astype(np.float32), -1, kernel, borderType=border)
    assert np.abs(_ops.dft_correlate(img, kernel, border) - ref).max() < 1e-3


@pytest.mark.parametrize("radius, alias", [(6, 0.5), (10, 0.5)])
def test_defocus_of_a_large_disk_through_the_dft_equals_the_direct_filter(radius: int, alias: float) -> None:
    """Large disks (>= DFT_TAPS) go through the cached-spectrum DFT: the truncated values of filter2D
    on float32, a level apart only where float error crosses a level."""
    kernel = _ops.disk(float(radius), alias)
    assert kernel.size >= _ops.DFT_TAPS
    img = np.random.default_rng(3).integers(0, 256, (96, 128, 3), dtype=np.uint8)
    ref = _ops.truncate_u8(cv2.filter2D(img.astype(np.float32), -1, kernel, borderType=cv2.BORDER_REFLECT_101))
    out = perturb.get("defocus_blur").apply(img, {"radius": radius, "alias_blur": alias})
    diff = np.abs(out.astype(int) - ref)
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3
