"""The default decoding path of targets: encoded bytes -> RGB ``uint8`` array, or a typed error.

Images go through the one shared loader (:mod:`mmchaos.data.images`: header-only size check
with the :mod:`mmchaos.guard.limits` rules, first frame, EXIF orientation, every mode to 8-bit
RGB); arrays through the same size rules. Every refusal is a
:class:`~mmchaos.errors.TargetCallError` with a stable code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from mmchaos.data.images import ImageLoadError, load_image
from mmchaos.errors import TargetCallError
from mmchaos.guard.limits import PILLOW_MAX_IMAGE_PIXELS, SizeLimits, check_declared_size

__all__ = ["DEFAULT_MAX_IMAGE_PIXELS", "check_image_array", "decode_image_bytes", "decode_text_bytes"]

DEFAULT_MAX_IMAGE_PIXELS = PILLOW_MAX_IMAGE_PIXELS
"""Pillow's own default bomb threshold (about 0.25 GB of 24-bit pixels)."""


def decode_image_bytes(
    blob: bytes, *, max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS, max_side: int | None = None
) -> npt.NDArray[np.uint8]:
    """Decode an encoded image (PNG, JPEG, GIF, WebP, TIFF, ...) to RGB uint8, or raise typed.

    The loader is :func:`mmchaos.data.images.load_image` (the one shared by datasets and the
    CLI); its refusals come back as :class:`TargetCallError` with the same code.
    """
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise TargetCallError(f"expected encoded image bytes, got {type(blob).__name__}", code="image_not_bytes")
    try:
        return load_image(blob, max_pixels=max_pixels, max_side=max_side)
    except ImageLoadError as exc:
        raise TargetCallError(exc.message, code=exc.code) from exc


def decode_text_bytes(blob: bytes) -> str:
    """Strict UTF-8; invalid bytes are a typed refusal, never silently replaced."""
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise TargetCallError(f"expected encoded text bytes, got {type(blob).__name__}", code="text_not_bytes")
    try:
        return bytes(blob).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TargetCallError(
            f"text is not valid UTF-8: {exc.reason} at byte {exc.start} ({bytes(blob[exc.start : exc.end])!r})",
            code="bad_utf8",
        ) from exc


def check_image_array(
    image: Any, index: int = 0, *, max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS, max_side: int | None = None
) -> None:
    """Refuse, with a typed error, an array that is not an ``(H, W, 3)`` uint8 picture of sane size.

    For adapters' ``embed_images``/``read_text``: the declared shape is checked in 64-bit
    arithmetic before anything is copied, so a zero-stride giant view is refused, not allocated.
    """
    shape = tuple(int(d) for d in getattr(image, "shape", ()))
    dtype = getattr(image, "dtype", None)
    if len(shape) != 3 or shape[2] != 3:
        raise TargetCallError(f"image {index}: expected shape (H, W, 3), got {shape}", code="image_bad_shape")
    if dtype != np.uint8:
        raise TargetCallError(f"image {index}: expected dtype uint8, got {dtype}", code="image_bad_dtype")
    if shape[0] == 0 or shape[1] == 0:
        raise TargetCallError(f"image {index} is empty: {shape}", code="image_empty")
    problem = check_declared_size(shape, SizeLimits(max_pixels=max_pixels, max_side=max_side))
    if problem is not None:
        raise TargetCallError(f"image {index}: {problem.message}", code=problem.code)
