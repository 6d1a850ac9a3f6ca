"""The default decoding path of targets: encoded bytes -> RGB ``uint8`` array, or a typed error.

What a careful server does with an uploaded image, in order: refuse empty payloads, read only the
header, refuse declared sizes over the limits (64-bit arithmetic, before any pixel is decoded),
decode the first frame, apply the EXIF orientation, and convert every mode that occurs in the
wild to 8-bit RGB without silently clipping 16-bit data. Every refusal is a
:class:`~mmchaos.errors.TargetCallError` with a stable code.
"""

from __future__ import annotations

import io
import logging
import warnings
from typing import Any

import numpy as np
import numpy.typing as npt

from mmchaos.errors import TargetCallError
from mmchaos.guard.limits import PILLOW_MAX_IMAGE_PIXELS, SizeLimits, check_declared_size, working_channels

__all__ = ["DEFAULT_MAX_IMAGE_PIXELS", "check_image_array", "decode_image_bytes", "decode_text_bytes", "pil_to_rgb"]

log = logging.getLogger(__name__)

DEFAULT_MAX_IMAGE_PIXELS = PILLOW_MAX_IMAGE_PIXELS
"""Pillow's own default bomb threshold (about 0.25 GB of 24-bit pixels)."""

_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
_SIXTEEN_BIT = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})


def _rgb3(gray: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    return np.ascontiguousarray(np.repeat(gray[:, :, None], 3, axis=2))


def pil_to_rgb(img: Any) -> npt.NDArray[np.uint8]:
    """A decoded Pillow image as ``(H, W, 3)`` RGB uint8; transparency is composited on white.

    16-bit grey (``I;16*``, and ``I``, which Pillow uses for 16-bit data) keeps its high byte
    instead of being clipped to white, which is what ``Image.convert("RGB")`` would do.
    Float images (``F``) have no agreed range and are refused.
    """
    from PIL import Image

    mode = img.mode
    if mode in _SIXTEEN_BIT:
        arr16 = np.asarray(img).astype(np.uint32)
        return _rgb3((arr16 >> 8).astype(np.uint8))
    if mode == "I":
        arr32 = np.clip(np.asarray(img).astype(np.int64), 0, 65535)
        return _rgb3((arr32 >> 8).astype(np.uint8))
    if mode == "F":
        raise TargetCallError(
            "float (mode F) images have no agreed value range; convert to 8 or 16 bits first",
            code="image_unsupported_mode",
        )
    try:
        if mode in _ALPHA_MODES or "transparency" in img.info:
            rgba = img.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return np.asarray(Image.alpha_composite(white, rgba).convert("RGB"), dtype=np.uint8)
        return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (ValueError, OSError) as exc:
        raise TargetCallError(f"cannot convert a {mode} image to RGB: {exc}", code="image_unsupported_mode") from exc


def _bomb_error(exc: Exception) -> TargetCallError:
    """Pillow refuses giant headers itself, before our check runs; keep the int32 diagnosis."""
    import re

    found = re.search(r"\((\d+) pixels\)", str(exc))
    pixels = int(found.group(1)) if found else 0
    problem = check_declared_size((pixels, 3)) if pixels else None
    if problem is not None:
        return TargetCallError(
            f"image refused before decoding: {pixels:,} pixels x 3 channels = {problem.elements:,} elements, "
            "past 2**31-1 (a decompression bomb)",
            code=problem.code,
        )
    return TargetCallError(f"image refused as a decompression bomb: {exc}", code="image_too_large")


def decode_image_bytes(
    blob: bytes, *, max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS, max_side: int | None = None
) -> npt.NDArray[np.uint8]:
    """Decode an encoded image (PNG, JPEG, GIF, WebP, TIFF, ...) to RGB uint8, or raise typed."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if not isinstance(blob, bytes | bytearray | memoryview):
        raise TargetCallError(f"expected encoded image bytes, got {type(blob).__name__}", code="image_not_bytes")
    if len(blob) == 0:
        raise TargetCallError("empty image payload (0 bytes)", code="image_empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(bytes(blob)))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise _bomb_error(exc) from exc
    except UnidentifiedImageError as exc:
        raise TargetCallError(
            f"not an image in a known format ({len(blob)} bytes, starts {bytes(blob[:8])!r})",
            code="image_undecodable",
        ) from exc
    except (OSError, SyntaxError, ValueError) as exc:
        raise TargetCallError(f"corrupt image header: {exc}", code="image_undecodable") from exc
    with img:
        width, height = img.size
        problem = check_declared_size(
            (height, width, working_channels(img.mode)), SizeLimits(max_pixels=max_pixels, max_side=max_side)
        )
        if problem is not None:
            raise TargetCallError(f"image refused before decoding: {problem.message}", code=problem.code)
        try:
            img.load()
        except (OSError, SyntaxError, ValueError, EOFError) as exc:
            code = "image_truncated" if "truncated" in str(exc) else "image_undecodable"
            raise TargetCallError(f"cannot decode the {img.format} image: {exc}", code=code) from exc
        try:
            upright = ImageOps.exif_transpose(img) or img
        except Exception as exc:  # a corrupt EXIF block must not reject an otherwise good picture
            log.warning("ignoring unreadable EXIF orientation: %s", exc)
            upright = img
        return pil_to_rgb(upright)


def decode_text_bytes(blob: bytes) -> str:
    """Strict UTF-8; invalid bytes are a typed refusal, never silently replaced."""
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise TargetCallError(f"expected encoded text bytes, got {type(blob).__name__}", code="text_not_bytes")
    try:
        return bytes(blob).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TargetCallError(
            f"text is not valid UTF-8: {exc.reason} at byte {exc.start} ({bytes(blob[exc.start : exc.end])!r})",
            code="text_invalid_utf8",
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
