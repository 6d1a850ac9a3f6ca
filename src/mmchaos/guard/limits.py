"""Declared-size limits, checked from a shape alone, in 64-bit arithmetic, before any allocation.

The 000 incident: ``h * w * c`` computed in 32-bit wrapped past 2**31 - 1 and a kernel wrote
out of bounds. The cure is to multiply the *declared* dimensions (an image header, a request's
``width``/``height``, an array's shape) in wide arithmetic and refuse the input before anything
is allocated.

This is the one rule set: the targets' decoders and array checks and :class:`~mmchaos.guard.Preflight`
all call :func:`check_declared_size`, so the same input is refused with the same code everywhere
(:data:`SIZE_CODES`). Pure standard library (and the code table), so the runtime guards can import it
without numpy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mmchaos.error_codes import statuses

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "PILLOW_MAX_IMAGE_PIXELS",
    "SIZE_CODES",
    "SizeLimits",
    "SizeProblem",
    "check_declared_size",
    "declared_elements",
    "int32_wrapped_product",
    "working_channels",
]

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

PILLOW_MAX_IMAGE_PIXELS = 89_478_485
"""Pillow's own default bomb threshold (about 0.25 GB of 24-bit pixels): the targets' default."""

#: Every code :func:`check_declared_size` gives, and the HTTP status a server answers with it (from
#: :mod:`mmchaos.error_codes`).
SIZE_CODES: Mapping[str, int] = statuses(
    "shape_negative", "element_count_overflow", "image_too_large", "image_too_small", "bad_aspect_ratio"
)

# Bands per Pillow mode (without importing Pillow); unknown modes count as 4.
_MODE_BANDS = {
    "1": 1, "L": 1, "P": 1, "I": 1, "F": 1, "I;16": 1, "I;16L": 1, "I;16B": 1, "I;16N": 1,
    "LA": 2, "La": 2, "PA": 2,
    "RGB": 3, "YCbCr": 3, "LAB": 3, "HSV": 3,
    "RGBA": 4, "RGBa": 4, "RGBX": 4, "CMYK": 4,
}  # fmt: skip
_ALPHA_MODES = frozenset({"LA", "La", "PA", "RGBA", "RGBa"})


@dataclass(frozen=True)
class SizeLimits:
    """What a declared shape may be; ``None`` means no limit on that quantity."""

    max_elements: int | None = INT32_MAX
    max_pixels: int | None = None
    max_side: int | None = None
    max_bytes: int | None = None
    min_side: int | None = None
    max_aspect_ratio: float | None = None


@dataclass(frozen=True)
class SizeProblem:
    """Why a declared shape is refused.

    ``code`` is stable (it becomes the error code, see :data:`SIZE_CODES`); ``reason`` says
    which quantity broke (``int32_elements``, ``int64_elements``, ``elements``, ``pixels``,
    ``side``, ``bytes``, ``min_side``, ``aspect_ratio``, ``negative``); ``detail`` holds the
    numbers behind it, ready for an error body.
    """

    code: str
    message: str
    elements: int
    reason: str = ""
    detail: Mapping[str, Any] = field(default_factory=dict)


def declared_elements(shape: Sequence[int]) -> int:
    """The element count of ``shape``, exact (Python ints never wrap); dimensions must be >= 0."""
    total = 1
    for dim in shape:
        d = int(dim)
        if d < 0:
            raise ValueError(f"negative dimension {d} in declared shape {tuple(shape)}")
        total *= d
    return total


def int32_wrapped_product(shape: Sequence[int]) -> int:
    """What ``prod(shape)`` gives in two's-complement 32-bit arithmetic: the bug being guarded."""
    total = 1
    for dim in shape:
        total = (total * int(dim)) & 0xFFFFFFFF
    return total - (1 << 32) if total >= 1 << 31 else total


def working_channels(mode: str) -> int:
    """Channels of the widest array a decode to RGB holds for a Pillow ``mode``.

    RGBA while compositing alpha (palette images may carry transparency), else at least the
    three of the RGB output; an unknown mode counts as four.
    """
    if mode in _ALPHA_MODES or mode == "P":
        return 4
    return max(_MODE_BANDS.get(mode, 4), 3)


def check_declared_size(
    shape: Sequence[int], limits: SizeLimits | None = None, *, itemsize: int = 1
) -> SizeProblem | None:
    """The first limit that ``shape`` (H, W[, C]) breaks, or None when it is acceptable.

    Element counts are compared against int32 and int64 limits in exact arithmetic, so a shape
    whose product wraps in 32 bits is caught even when every single dimension is small. The order
    is fixed (elements, then side and pixels, then bytes, then the lower bounds), so every caller
    reports the same code for the same shape.
    """
    limits = limits or SizeLimits()
    dims = tuple(int(d) for d in shape)
    where = f"declared shape {'x'.join(str(d) for d in dims)}"
    if any(d < 0 for d in dims):
        return SizeProblem("shape_negative", f"{where} has a negative dimension", 0, "negative", {"shape": list(dims)})
    elements = declared_elements(dims)
    height, width = (dims[0], dims[1]) if len(dims) >= 2 else (dims[0] if dims else 1, 1)
    numbers: dict[str, Any] = {"height": height, "width": width, "elements": elements}
    if elements > INT64_MAX:
        return SizeProblem(
            "element_count_overflow",
            f"{where} has {elements:,} elements, over 2**63-1",
            elements,
            "int64_elements",
            {**numbers, "limit": INT64_MAX},
        )
    if limits.max_elements is not None and elements > limits.max_elements:
        wrapped = int32_wrapped_product(dims)
        return SizeProblem(
            "element_count_overflow",
            f"{where}: {elements:,} elements exceed {limits.max_elements:,}"
            + (f" (32-bit arithmetic would give {wrapped:,})" if elements > INT32_MAX else ""),
            elements,
            "int32_elements" if elements > INT32_MAX else "elements",
            {**numbers, "limit": limits.max_elements},
        )
    pixels = height * width
    too_large = {**numbers, "max_pixels": limits.max_pixels, "max_side": limits.max_side}
    if limits.max_side is not None and max(height, width) > limits.max_side:
        message = f"{where}: side {max(height, width):,} exceeds {limits.max_side:,}"
        return SizeProblem("image_too_large", message, elements, "side", too_large)
    if limits.max_pixels is not None and pixels > limits.max_pixels:
        message = f"{where}: {pixels:,} pixels exceed {limits.max_pixels:,}"
        return SizeProblem("image_too_large", message, elements, "pixels", too_large)
    if limits.max_bytes is not None and elements * itemsize > limits.max_bytes:
        message = f"{where}: {elements * itemsize:,} bytes exceed {limits.max_bytes:,}"
        return SizeProblem("image_too_large", message, elements, "bytes", {**numbers, "max_bytes": limits.max_bytes})
    if limits.min_side is not None and min(height, width) < limits.min_side:
        message = f"{where}: side {min(height, width):,} is below {limits.min_side:,}"
        return SizeProblem("image_too_small", message, elements, "min_side", {**numbers, "min_side": limits.min_side})
    ratio = limits.max_aspect_ratio
    if ratio is not None and max(height, width) > ratio * min(height, width):
        message = f"{where} is more elongated than {ratio:g}:1"
        return SizeProblem(
            "bad_aspect_ratio", message, elements, "aspect_ratio", {**numbers, "max_aspect_ratio": ratio}
        )
    return None
