"""Pixels an image declares, read from its header before anything is decoded.

The admission budget needs the size of every image of a request before the request gets a slot.
Only the first bytes of a data URL are base64-decoded (the whole payload only when the header
lies deeper, e.g. a JPEG's frame header after a large EXIF block), and Pillow's per-format header
parsers read the size without touching the pixel data. An image whose size cannot be read counts
as zero here: Preflight refuses it when it is decoded, without allocating its pixels.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Iterable

from PIL import Image

__all__ = ["declared_pixels"]

_PREFIX_CHARS = 64 * 1024  # base64 characters tried first: 48 KiB of image, a multiple of 4


def _payload(url: str) -> str | None:
    head, sep, payload = url.partition(",")
    if not sep or head[:5].lower() != "data:" or not head.lower().endswith(";base64"):
        return None
    return payload


def _size(data: bytes, formats: Iterable[str]) -> tuple[int, int] | None:
    prefix = data[:16]
    fp = io.BytesIO(data)
    for fmt in formats:
        entry = Image.OPEN.get(fmt)
        if entry is None:
            continue
        factory, accept = entry
        if accept is not None and not accept(prefix):
            continue
        fp.seek(0)
        try:
            im = factory(fp, "")
        except Exception:  # a truncated or corrupt header: try the next format, then give up
            continue
        width, height = im.size
        return int(width), int(height)
    return None


def declared_pixels(url: str, formats: Iterable[str]) -> int:
    """Width x height that the image in data URL ``url`` declares, or 0 when it cannot be read."""
    payload = _payload(url)
    if payload is None:
        return 0
    allowed = sorted(formats)
    Image.init()  # register every format's header parser (Image.OPEN) once
    try:
        head = base64.b64decode(payload[:_PREFIX_CHARS], validate=True)
    except (binascii.Error, ValueError):
        return 0
    size = _size(head, allowed)
    if size is None and len(payload) > _PREFIX_CHARS:
        try:
            size = _size(base64.b64decode(payload, validate=True), allowed)
        except (binascii.Error, ValueError):
            return 0
    return 0 if size is None else size[0] * size[1]
