"""Perturbations that use context (the target, the class names) and the multimodal ones in detail."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mmchaos import perturb
from mmchaos.data.shapes import make_shapes
from mmchaos.perturb.base import BindContext, MultimodalSample
from mmchaos.perturb.multimodal import IMAGE_FILLS
from mmchaos.targets.base import Capability, Target
from tests.fakes import targets as fakes

DATA = make_shapes(8, seed=5)
IMAGES = [s.image for s in DATA]


def _foreground(img: np.ndarray) -> np.ndarray:
    bg = np.median(np.concatenate([img[0], img[-1], img[:, 0], img[:, -1]]), axis=0)
    dist = np.linalg.norm(img.astype(float) - bg, axis=2)
    return dist > 0.5 * dist.max()


def _covered(params: dict[str, Any], shape: tuple[int, ...]) -> np.ndarray:
    mask = np.zeros(shape[:2], bool)
    for top, left, h, w in params["boxes"]:
        mask[top : top + h, left : left + w] = True
    return mask


def test_unbound_saliency_uses_spectral_residual_and_covers_the_share() -> None:
    p = perturb.get("saliency_occlusion")
    out, rec = p(IMAGES, severity=3, rng=0)
    for img, o, params in zip(IMAGES, out, rec.items, strict=True):
        assert params["method"] == "spectral_residual" and len(params["cells"]) == 13  # ceil(0.2 * 64)
        covered = _covered(params, img.shape)
        assert covered.mean() == pytest.approx(13 / 64, abs=0.03)
        assert np.array_equal(o[~covered], img[~covered])


def test_black_box_saliency_strikes_where_the_model_looks() -> None:
    p = perturb.get("saliency_occlusion").bind(BindContext(target=fakes.ShapeColourTarget()))
    _, rec = p(IMAGES, severity=1, rng=0)
    for img, params in zip(IMAGES, rec.items, strict=True):
        assert params["method"] == "occlusion"
        assert (_covered(params, img.shape) & _foreground(img)).any(), "the occluded cells hit the shape"
    assert np.array_equal(perturb.get("saliency_occlusion").replay(IMAGES, rec)[0], p.replay(IMAGES, rec)[0])


class _ReaderTarget(Target):
    """Reads 'ink' in the left half only: occluding the right half changes nothing."""

    uri = "py:reader"
    capabilities = frozenset({Capability.READ_TEXT})

    def read_text(self, images: Any) -> list[str]:
        return [" ".join(str(int(v)) for v in i[:, : i.shape[1] // 2].mean(axis=(1, 2))) for i in images]


def test_black_box_saliency_on_a_reader_uses_the_transcription() -> None:
    p = perturb.get("saliency_occlusion").bind(BindContext(target=_ReaderTarget()))
    _, rec = p(IMAGES[:2], severity=2, rng=0)
    for params in rec.items:
        assert params["method"] == "occlusion"
        covered = _covered(params, IMAGES[0].shape)
        assert covered[:, :32].sum() > 2 * covered[:, 32:].sum(), "only the left half matters to this reader"


def _white_box() -> Target:
    """A white-box target whose tiny torch model looks only at the top-left quarter of the image."""
    torch = pytest.importorskip("torch")

    class Tiny(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.proj = torch.nn.Linear(3 * 8 * 8, 16)

        def get_image_features(self, pixel_values: Any) -> Any:
            return self.proj(pixel_values[:, :, :8, :8].flatten(1))

    class WhiteBox(Target):
        uri = "py:white-box"
        capabilities = frozenset({Capability.EMBED_IMAGE, Capability.TORCH_MODULE})

        def __init__(self) -> None:
            self.model = Tiny()

        def preprocess_images(self, images: Any) -> Any:
            small = [np.asarray(i[::4, ::4], dtype=np.float32) / 255 for i in images]  # 64 -> 16
            return torch.as_tensor(np.stack(small)).permute(0, 3, 1, 2)

        def embed_images(self, images: Any) -> Any:
            with torch.no_grad():
                return self.model.get_image_features(self.preprocess_images(images)).numpy()

        def torch_module(self) -> Any:
            return self.model

    return WhiteBox()


def test_white_box_saliency_uses_gradients() -> None:
    white_box = _white_box()

    class Wrapped(Target):  # as the runner wraps targets to time them
        def __init__(self, inner: Target) -> None:
            self.inner, self.uri, self.capabilities = inner, inner.uri, inner.capabilities

        def torch_module(self) -> Any:
            return self.inner.torch_module()

    p = perturb.get("saliency_occlusion").bind(BindContext(target=Wrapped(white_box)))
    _, rec = p(IMAGES[:3], severity=1, rng=0)
    for params in rec.items:
        assert params["method"] == "gradient"
        assert all(top < 32 and left < 32 for top, left, _, _ in params["boxes"]), "the model looks top-left"


def test_gradient_saliency_is_model_time_of_the_timed_target() -> None:
    """The forward and backward passes of gradient saliency are model work: the runner's timed
    wrapper counts them (they ran outside its model calls, so the report's model time left them out)."""
    from mmchaos.runner import TimedTarget

    timed = TimedTarget(_white_box())
    p = perturb.get("saliency_occlusion").bind(BindContext(target=timed))
    _, rec = p(IMAGES[:3], severity=1, rng=0)
    assert [params["method"] for params in rec.items] == ["gradient"] * 3
    assert timed.calls == 1, "one model call for the batch's gradients"
    assert timed.seconds > 0


def test_typographic_writes_a_class_name_when_bound() -> None:
    p = perturb.get("typographic").bind(BindContext(labels=("blue square", "red circle")))
    _, rec = p(IMAGES, severity=5, rng=0)
    assert {item["word"] for item in rec.items} <= {"blue square", "red circle"}
    _, rec = perturb.get("typographic")(IMAGES, severity=5, rng=0)
    assert all(item["word"] for item in rec.items)


def _word_blended_over_the_whole_image(item: np.ndarray, params: dict[str, Any]) -> np.ndarray:
    """Typographic's blend written plainly: the word's layer over every pixel of the image."""
    from PIL import Image, ImageDraw

    from mmchaos.perturb.typographic import _font

    layer = Image.new("RGBA", (item.shape[1], item.shape[0]), (0, 0, 0, 0))
    ImageDraw.Draw(layer).text(
        (params["x"], params["y"]), params["word"], font=_font(int(params["size"])), fill=(*params["fill"], 255),
        stroke_width=int(params["stroke_width"]), stroke_fill=(*params["stroke"], 255),
    )  # fmt: skip
    rgba = np.asarray(layer, dtype=np.float32)
    alpha = rgba[..., 3:] * np.float32(float(params["opacity"]) / 255.0)
    out = item.astype(np.float32) * (1 - alpha) + rgba[..., :3] * alpha
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def test_typographic_blends_only_where_the_word_is_and_gives_the_whole_image_blend() -> None:
    gen = np.random.default_rng(3)
    images = [gen.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((64, 64), (40, 120), (120, 33))]
    typographic = perturb.get("typographic")
    for severity in (1, 3, 5):
        out, rec = typographic(images, severity=severity, rng=severity)
        for item, got, params in zip(images, out, rec.items, strict=True):
            assert np.array_equal(got, _word_blended_over_the_whole_image(item, params))
            assert not np.array_equal(got, item), "the word is written"
    off = dict(rec.items[0], x=10_000)  # a word drawn outside the image leaves it as it was
    assert np.array_equal(typographic.apply(images[0], off), images[0])


def _samples(n: int = 6) -> list[MultimodalSample]:
    frames = tuple(np.full((8, 8, 3), k * 10, np.uint8) for k in range(10))
    return [
        MultimodalSample(
            image=IMAGES[i % len(IMAGES)], text=f"caption {i}", frames=frames, boxes=((2.0, 2.0, 40.0, 50.0),)
        )
        for i in range(n)
    ]


def test_caption_mismatch_is_a_derangement_of_the_chosen_share() -> None:
    batch = _samples(8)
    for sev, share in ((1, 0.1), (5, 1.0)):
        out, rec = perturb.get("caption_mismatch")(batch, severity=sev, rng=1)
        moved = [i for i, p in enumerate(rec.items) if p["caption_of"] is not None]
        assert all(out[i].text != batch[i].text for i in moved), "nobody keeps their own caption"
        assert sorted(out[i].text for i in moved) == sorted(batch[i].text for i in moved)
        if share == 1.0:
            assert len(moved) == 8
    assert perturb.REGISTRY.get("caption_mismatch").expects_change


def test_missing_modality_blanks_images_or_empties_texts() -> None:
    out, rec = perturb.get("missing_modality")(_samples(12), severity=5, rng=0)
    dropped = {p["drop"] for p in rec.items}
    assert dropped <= {"image", "text"} and len(rec.items) == 12 and None not in dropped
    for o, p in zip(out, rec.items, strict=True):
        if p["drop"] == "image":
            assert p["fill"] in IMAGE_FILLS and o.image.shape == IMAGES[0].shape
        else:
            assert o.text is not None and not o.text.strip()
    only_images = [MultimodalSample(image=i) for i in IMAGES]
    _, rec = perturb.get("missing_modality")(only_images, severity=5, rng=0)
    assert {p["drop"] for p in rec.items} == {"image"}


def test_frame_offset_and_drop() -> None:
    batch = _samples(1)
    out, rec = perturb.get("frame_offset")(batch, severity=3, rng=0)
    k = rec.items[0]["offset"]
    values = [int(f[0, 0, 0]) // 10 for f in out[0].frames]
    assert abs(k) == 3 and values == [min(9, max(0, i - k)) for i in range(10)]
    out, rec = perturb.get("frame_drop")(batch, severity=5, rng=0)
    values = [int(f[0, 0, 0]) // 10 for f in out[0].frames]
    assert values[0] == 0 and values == sorted(values) and len(values) == 10
    assert {i for i in range(10) if i not in values} <= set(rec.items[0]["dropped"])


def test_bbox_shift_moves_boxes_within_the_image() -> None:
    batch = _samples(3)
    out, rec = perturb.get("bbox_shift")(batch, severity=5, rng=0)
    for o in out:
        ((x0, y0, x1, y1),) = o.boxes or ()
        assert 0 <= x0 <= x1 <= 64 and 0 <= y0 <= y1 <= 64
        assert (x0, y0, x1, y1) != (2.0, 2.0, 40.0, 50.0)
