"""The target's image path as a differentiable torch function: pixels in [0, 1] -> image features.

White-box attacks must go through the preprocessing a deployment runs, not around it. A target
gives that path in one of two ways:

- it defines ``image_torch_path() -> ImagePath`` (duck-typed; the test targets and any user target
  that owns a torch preprocessing do this);
- it is a transformers contrastive model (``model.get_image_features`` and an ``image_processor``
  with CLIP-style settings): the processor's resize, centre crop, rescale and normalisation are
  mirrored in torch.

Where the mirror of the resize cannot match the processor's own (PIL bicubic vs torch bicubic on a
size change), the attack runs on the pixels *after* the processor's resize (the image is resized
once with the processor's own PIL code, then attacked at model resolution): :attr:`ImagePath.mode`
says which, and the checks write it into their findings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from mmchaos._lazy import require
from mmchaos.targets.base import Target
from mmchaos.targets.wrappers import unwrap

__all__ = [
    "DIFFERENTIABLE",
    "PIXELS_AFTER_RESIZE",
    "ImagePath",
    "ProcessorMirror",
    "image_path",
    "not_pixel_grid",
    "processor_mirror",
    "to_images",
    "to_tensor",
]

Tensor = Any
ImageArray = npt.NDArray[np.uint8]

DIFFERENTIABLE = "differentiable preprocessing"
PIXELS_AFTER_RESIZE = "pixels after resize"
MIRROR_TOLERANCE = 2e-3
"""Largest difference (normalised units) between the torch mirror and the processor's output
that still counts as "the same preprocessing"."""


@dataclass
class ImagePath:
    """A differentiable image path of a target.

    ``features`` maps ``(B, 3, H, W)`` pixels in [0, 1] to image features ``(B, D)``;
    ``prepare`` turns the clean uint8 images into the pixels the attack perturbs (themselves, or
    resized like the processor when ``mode`` is :data:`PIXELS_AFTER_RESIZE`); ``logit_scale`` is
    the model's contrastive temperature (CLIP's ``exp(logit_scale)``), 100 when unknown.
    """

    features: Callable[[Tensor], Tensor]
    mode: str = DIFFERENTIABLE
    note: str = ""
    prepare: Callable[[ImageArray], ImageArray] | None = None
    logit_scale: float = 100.0
    device: str = "cpu"

    def inputs(self, images: Sequence[ImageArray]) -> list[ImageArray]:
        return [self.prepare(i) if self.prepare is not None else i for i in images]

    def describe(self) -> dict[str, Any]:
        return {"mode": self.mode, "note": self.note, "logit_scale": self.logit_scale}


def to_tensor(images: Sequence[ImageArray], device: str = "cpu") -> Tensor:
    """Same-shape RGB uint8 images -> ``(B, 3, H, W)`` float32 in [0, 1]."""
    torch = require("torch")
    arr = np.stack([np.asarray(i, dtype=np.uint8) for i in images])
    return torch.from_numpy(arr).to(device).permute(0, 3, 1, 2).float().div(255.0)


def to_images(x: Tensor) -> list[ImageArray]:
    """``(B, 3, H, W)`` in [0, 1] -> uint8 images, rounded: what an upload can carry."""
    arr = (x.detach().clamp(0, 1) * 255.0).round().to("cpu").permute(0, 2, 3, 1).numpy().astype(np.uint8)
    return [np.ascontiguousarray(a) for a in arr]


def image_path(target: Target, sample: ImageArray | None = None, *, exact: bool = True) -> ImagePath | None:
    """The target's differentiable image path, or None when it gives no white-box access.

    ``sample`` (a clean image) lets the HF mirror check itself against the processor's output on
    real data; without one it checks a plain grey picture of the model's input size. With
    ``exact=False`` (a surrogate, whose images are replayed elsewhere) the torch mirror is used
    even where its resize deviates from the processor's, and the deviation is noted.
    """
    inner = unwrap(target)
    own = getattr(inner, "image_torch_path", None)
    if callable(own):
        path = own()
        return path if isinstance(path, ImagePath) else None
    model = getattr(inner, "model", None)
    processor = getattr(inner, "image_processor", None)
    if model is None or processor is None or not hasattr(model, "get_image_features"):
        return None
    return _hf_path(inner, model, processor, sample, exact)


def not_pixel_grid(target: Target) -> str | None:
    """Why ``target``'s image inputs are no pixel grid a white-box attack can differentiate through,
    or None when they are ``(batch, channels, H, W)``.

    SigLIP 2 (NaFlex) and similar processors cut an image into a sequence of flattened patches with a
    patch mask and grid shapes: there is no mean/std normalisation over channels to redo in torch,
    and the tower takes pixels only with the mask and shapes beside them.
    """
    preprocess = getattr(unwrap(target), "preprocess_images", None)
    if preprocess is None:
        return None
    try:
        shape = tuple(int(d) for d in preprocess([np.full((32, 32, 3), 127, np.uint8)]).shape)
    except Exception:  # the attack's own path decides; this only names patch inputs
        return None
    if len(shape) == 4:
        return None
    return (
        f"the target's processor gives image inputs of shape {shape} (flattened patch sequences, with a patch "
        "mask and grid shapes, as SigLIP 2 does), not (batch, 3, H, W) pixels: there is no pixel grid to "
        "differentiate through"
    )


def _size(value: Any, key: str) -> Any:
    if value is None:
        return None
    if isinstance(value, dict):
        return value.get(key)
    return getattr(value, key, None)


@dataclass
class ProcessorMirror:
    """A CLIP-style image processor in torch: ``pixels(x)`` is its ``pixel_values`` for images
    ``x`` (B, 3, H, W) in [0, 1], differentiable; ``output_hw`` the size it resizes ``(h, w)`` to."""

    pixels: Callable[[Tensor], Tensor]
    normalise: Callable[[Tensor], Tensor]
    output_hw: Callable[[int, int], tuple[int, int]]
    crop_hw: tuple[int, int] | None
    resample: int


def processor_mirror(proc: Any, device: str = "cpu") -> ProcessorMirror | None:
    """The torch mirror of a CLIP-style image processor (resize to the shortest edge or a fixed
    size, centre crop, rescale, normalise), or None for processors it does not know (patch budgets)."""
    torch = require("torch")
    functional = require("torch.nn.functional")
    size = getattr(proc, "size", None)
    shortest = _size(size, "shortest_edge")
    fixed = (_size(size, "height"), _size(size, "width"))
    crop = getattr(proc, "crop_size", None)
    crop_raw = (_size(crop, "height"), _size(crop, "width")) if getattr(proc, "do_center_crop", False) else None
    crop_hw = (int(crop_raw[0]), int(crop_raw[1])) if crop_raw and all(crop_raw) else None
    if not shortest and not all(fixed):
        return None
    do_resize = bool(getattr(proc, "do_resize", True))
    factor = float(getattr(proc, "rescale_factor", 1 / 255)) if getattr(proc, "do_rescale", True) else 1.0
    if getattr(proc, "do_normalize", True):
        mean = torch.tensor(list(proc.image_mean), dtype=torch.float32, device=device).view(1, -1, 1, 1)
        std = torch.tensor(list(proc.image_std), dtype=torch.float32, device=device).view(1, -1, 1, 1)
    else:
        mean = torch.zeros((1, 3, 1, 1), device=device)
        std = torch.ones((1, 3, 1, 1), device=device)
    scale = 255.0 * factor  # the processor rescales 0..255 by factor; our pixels are already /255

    def output_hw(h: int, w: int) -> tuple[int, int]:
        if not do_resize:
            return h, w
        if shortest:
            short, long = (h, w) if h <= w else (w, h)
            new_long = int(int(shortest) * long / short)
            return (int(shortest), new_long) if h <= w else (new_long, int(shortest))
        return int(fixed[0]), int(fixed[1])

    def normalise(x: Tensor) -> Tensor:
        return (x * scale - mean) / std

    def pixels(x: Tensor) -> Tensor:
        h, w = int(x.shape[-2]), int(x.shape[-1])
        th, tw = output_hw(h, w)
        if (th, tw) != (h, w):
            x = functional.interpolate(x, size=(th, tw), mode="bicubic", align_corners=False, antialias=True)
        if crop_hw is not None:
            ch, cw = crop_hw
            top, left = max(0, (x.shape[-2] - ch) // 2), max(0, (x.shape[-1] - cw) // 2)
            x = x[..., top : top + ch, left : left + cw]
        return normalise(x)

    return ProcessorMirror(pixels, normalise, output_hw, crop_hw, int(getattr(proc, "resample", 3)))


def _hf_path(inner: Any, model: Any, proc: Any, sample: ImageArray | None, exact: bool = True) -> ImagePath | None:
    device = str(getattr(inner, "device", "cpu"))
    mirror = processor_mirror(proc, device)
    if mirror is None:
        return None

    def features_from_normalised(pixels: Tensor) -> Tensor:
        out = model.get_image_features(pixel_values=pixels)
        return out if hasattr(out, "detach") else out.pooler_output

    def features(x: Tensor) -> Tensor:
        return features_from_normalised(mirror.pixels(x))

    logit = getattr(model, "logit_scale", None)
    logit_scale = float(logit.detach().exp()) if logit is not None else 100.0
    probe = sample if sample is not None else np.full((97, 131, 3), 127, np.uint8)
    real = inner.preprocess_images([probe]).float()
    mine = mirror.pixels(to_tensor([probe], device))
    gap = float((real - mine).abs().max()) if real.shape == mine.shape else float("inf")
    if gap <= MIRROR_TOLERANCE or not exact:
        return ImagePath(
            features=features,
            mode=DIFFERENTIABLE,
            note=f"the processor's resize/crop/rescale/normalise mirrored in torch (max deviation {gap:.2g})",
            logit_scale=logit_scale,
            device=device,
        )

    # The mirror's resize differs from the processor's: attack the pixels after the processor's resize.
    def prepare(image: ImageArray) -> ImageArray:
        from PIL import Image

        h, w = image.shape[:2]
        th, tw = mirror.output_hw(h, w)
        out = np.asarray(Image.fromarray(image).resize((tw, th), resample=mirror.resample))
        if mirror.crop_hw is not None:
            ch, cw = mirror.crop_hw
            top, left = max(0, (th - ch) // 2), max(0, (tw - cw) // 2)
            out = out[top : top + ch, left : left + cw]
        return np.ascontiguousarray(out)

    def features_after_resize(x: Tensor) -> Tensor:
        return features_from_normalised(mirror.normalise(x))

    return ImagePath(
        features=features_after_resize,
        mode=PIXELS_AFTER_RESIZE,
        note=f"the torch resize differs from the processor's by {gap:.2g}: the attack perturbs the pixels after "
        "the processor's own resize and crop, and the target is sent those model-size images",
        prepare=prepare,
        logit_scale=logit_scale,
        device=device,
    )
