"""Encoders of the hostile corpus: Pillow in memory, and a PNG writer for what Pillow will not write.

The PNG writer builds files from their chunks (valid CRCs), so a header may declare any size:
decompression bombs stream their zeros through zlib, header-only files hold one row, and 48-bit
RGB exists without Pillow supporting it. Nothing here allocates the size a file declares.
"""

from __future__ import annotations

import io
import struct
import zlib
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "as_rgb",
    "bomb_png_1bit",
    "header_only_png",
    "last_frame_rgb",
    "plain_rgb",
    "png16_rgb",
    "png_raw",
    "save",
    "to_pil",
]

U8 = npt.NDArray[np.uint8]


def save(img: Any, fmt: str, **kw: Any) -> bytes:
    """A Pillow image encoded as ``fmt``, in memory."""
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def to_pil(arr: U8) -> Any:
    """A Pillow image of an array (contiguous first: Pillow refuses negative strides)."""
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(arr))


def plain_rgb(blob: bytes) -> U8:
    """Pillow's decode of the stored pixels, no orientation applied (the reference decoder)."""
    from PIL import Image

    with Image.open(io.BytesIO(blob)) as img:
        img.load()
        return np.asarray(img.convert("RGB"), dtype=np.uint8)


def _png_chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def png_raw(width: int, height: int, bit_depth: int, colour_type: int, idat: bytes) -> bytes:
    """A PNG from its IHDR fields and raw IDAT: headers Pillow would never write (16-bit RGB, lies)."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def _zero_rows_zlib(row_bytes: int, rows: int) -> bytes:
    """zlib of ``rows`` filter-0 scanlines of zeros, streamed (never held uncompressed)."""
    comp = zlib.compressobj(9)
    row = b"\x00" * (1 + row_bytes)
    chunk = 512
    parts = [comp.compress(row * min(chunk, rows - i)) for i in range(0, rows, chunk)]
    parts.append(comp.flush())
    return b"".join(parts)


def bomb_png_1bit(side: int) -> bytes:
    """A genuine, complete 1-bit PNG of ``side`` x ``side`` black pixels: kilobytes on disk."""
    return png_raw(side, side, 1, 0, _zero_rows_zlib((side + 7) // 8, side))


def header_only_png(width: int, height: int, colour_type: int = 2) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` but whose data holds one row."""
    channels = {0: 1, 2: 3, 6: 4}[colour_type]
    first_row = zlib.compress(b"\x00" + b"\x00" * min(width * channels, 4096))
    return png_raw(width, height, 8, colour_type, first_row)


def png16_rgb(arr8: U8) -> bytes:
    """A 48-bit RGB PNG (Pillow cannot write one) holding ``arr8 * 257``: 16 bits per channel."""
    h, w, _ = arr8.shape
    wide = (arr8.astype(">u2") * 257).reshape(h, w * 3)
    raw = b"".join(b"\x00" + wide[y].tobytes() for y in range(h))
    return png_raw(w, h, 16, 2, zlib.compress(raw, 9))


def as_rgb(mode_img: Any) -> U8:
    """A Pillow image of any mode as RGB uint8, the way Pillow converts it."""
    return np.asarray(mode_img.convert("RGB"), dtype=np.uint8)


def last_frame_rgb(blob: bytes) -> U8:
    """The last frame of an animated file as RGB (what a decoder that seeks to the end shows)."""
    from PIL import Image

    with Image.open(io.BytesIO(blob)) as img:
        img.seek(getattr(img, "n_frames", 1) - 1)
        return np.asarray(img.convert("RGB"), dtype=np.uint8)
