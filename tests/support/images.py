"""Hand-built image bytes for tests that must not decode a real image."""

from __future__ import annotations

import struct
import zlib


def png_declaring(width: int, height: int, color_type: int = 2) -> bytes:
    """A valid-looking PNG whose header declares ``width x height`` but holds almost no data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
