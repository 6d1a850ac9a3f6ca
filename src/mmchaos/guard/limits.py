"""Declared-size limits, checked from a shape alone, in 64-bit arithmetic, before any allocation.

The 000 incident: ``h * w * c`` computed in 32-bit wrapped past 2**31 - 1 and a kernel wrote
out of bounds. The cure is to multiply the *declared* dimensions (an image header, a request's
``width``/``height``, an array's shape) in wide arithmetic and refuse the input before anything
is allocated. Pure standard library, so the runtime guards can import it without numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "SizeLimits",
    "SizeProblem",
    "check_declared_size",
    "declared_elements",
    "int32_wrapped_product",
]

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class SizeLimits:
    """What a declared shape may be; ``None`` means no limit on that quantity."""

    max_elements: int | None = INT32_MAX
    max_pixels: int | None = None
    max_side: int | None = None
    max_bytes: int | None = None


@dataclass(frozen=True)
class SizeProblem:
    """Why a declared shape is refused; ``code`` is stable (it becomes an error code)."""

    code: str
    message: str
    elements: int


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


def check_declared_size(
    shape: Sequence[int], limits: SizeLimits | None = None, *, itemsize: int = 1
) -> SizeProblem | None:
    """The first limit that ``shape`` (H, W[, C]) breaks, or None when it is acceptable.

    Element counts are compared against int32 and int64 limits in exact arithmetic, so a shape
    whose product wraps in 32 bits is caught even when every single dimension is small.
    """
    limits = limits or SizeLimits()
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        return SizeProblem("shape_negative", f"declared shape {dims} has a negative dimension", 0)
    elements = declared_elements(dims)
    where = f"declared shape {'x'.join(str(d) for d in dims)}"
    if elements > INT64_MAX:
        return SizeProblem("element_count_int64_overflow", f"{where} has {elements:,} elements, over 2**63-1", elements)
    if limits.max_elements is not None and elements > limits.max_elements:
        wrapped = int32_wrapped_product(dims)
        code = "element_count_int32_overflow" if limits.max_elements == INT32_MAX else "too_many_elements"
        return SizeProblem(
            code,
            f"{where}: {elements:,} elements exceed {limits.max_elements:,}"
            + (f" (32-bit arithmetic would give {wrapped:,})" if elements > INT32_MAX else ""),
            elements,
        )
    if limits.max_side is not None and dims[:2] and max(dims[:2]) > limits.max_side:
        return SizeProblem("side_too_large", f"{where}: side {max(dims[:2]):,} exceeds {limits.max_side:,}", elements)
    if limits.max_pixels is not None and len(dims) >= 2:
        pixels = dims[0] * dims[1]
        if pixels > limits.max_pixels:
            return SizeProblem("too_many_pixels", f"{where}: {pixels:,} pixels exceed {limits.max_pixels:,}", elements)
    if limits.max_bytes is not None and elements * itemsize > limits.max_bytes:
        return SizeProblem(
            "too_many_bytes", f"{where}: {elements * itemsize:,} bytes exceed {limits.max_bytes:,}", elements
        )
    return None
