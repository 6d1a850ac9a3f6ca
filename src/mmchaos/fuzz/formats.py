"""Just enough parsing of image containers to mutate them past their own integrity checks.

PNG chunks (with CRCs recomputed on rebuild), JPEG marker segments, TIFF/EXIF image file
directories, ICC profile headers and RIFF (WebP) chunks. Parsers are lenient and total: they
return ``None`` for what they cannot split, never raise, so a mutator can fall back to bytes.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

__all__ = [
    "PNG_SIGNATURE",
    "IfdEntry",
    "JpegSegment",
    "PngChunk",
    "build_jpeg",
    "build_png",
    "build_riff",
    "exif_block",
    "icc_profile",
    "parse_ifd",
    "parse_jpeg",
    "parse_png",
    "parse_riff",
    "png_chunk_bytes",
    "sniff",
]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def sniff(data: bytes) -> str:
    """The container format by magic bytes: png, jpeg, gif, webp, tiff, or bytes."""
    if data.startswith(PNG_SIGNATURE):
        return "png"
    if data.startswith(b"\xff\xd8"):
        return "jpeg"
    if data[:4] in (b"GIF8",):
        return "gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    return "bytes"


# -- PNG -----------------------------------------------------------------------------------------


@dataclass
class PngChunk:
    tag: bytes
    data: bytes
    crc: int | None = None
    """An explicit (possibly wrong) CRC; None means compute the right one."""


def png_chunk_bytes(chunk: PngChunk) -> bytes:
    crc = zlib.crc32(chunk.tag + chunk.data) & 0xFFFFFFFF if chunk.crc is None else chunk.crc
    return struct.pack(">I", len(chunk.data)) + chunk.tag + chunk.data + struct.pack(">I", crc)


def parse_png(data: bytes) -> tuple[list[PngChunk], bytes] | None:
    """The chunks of a PNG and whatever trails the last complete one; None if not a PNG."""
    if not data.startswith(PNG_SIGNATURE):
        return None
    chunks: list[PngChunk] = []
    pos = len(PNG_SIGNATURE)
    while pos + 12 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        end = pos + 12 + length
        if end > len(data):
            break
        chunks.append(PngChunk(data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]))
        pos = end
    return chunks, data[pos:]


def build_png(chunks: list[PngChunk], tail: bytes = b"") -> bytes:
    return PNG_SIGNATURE + b"".join(png_chunk_bytes(c) for c in chunks) + tail


# -- JPEG ----------------------------------------------------------------------------------------

_STANDALONE = {0xD8, 0xD9, 0x01, *range(0xD0, 0xD8)}


@dataclass
class JpegSegment:
    marker: int
    payload: bytes
    """The segment's bytes after its length field; for SOS, also the entropy-coded data."""
    scan: bytes = b""


def parse_jpeg(data: bytes) -> list[JpegSegment] | None:
    """Marker segments after SOI (SOS keeps its scan data); None if not a JPEG."""
    if not data.startswith(b"\xff\xd8"):
        return None
    segments: list[JpegSegment] = []
    pos = 2
    n = len(data)
    while pos + 1 < n:
        if data[pos] != 0xFF:
            return segments  # junk between segments: stop here, the rest is dropped
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker in _STANDALONE:
            segments.append(JpegSegment(marker, b""))
            pos += 2
            if marker == 0xD9:
                return segments
            continue
        if pos + 4 > n:
            return segments
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        body = data[pos + 4 : pos + 2 + length]
        pos = pos + 2 + length
        if marker != 0xDA:
            segments.append(JpegSegment(marker, body))
            continue
        start = pos
        while pos + 1 < n and not (data[pos] == 0xFF and data[pos + 1] not in (0x00, *range(0xD0, 0xD8))):
            pos += 1
        if pos + 1 >= n:
            pos = n
        segments.append(JpegSegment(marker, body, data[start:pos]))
    return segments


def build_jpeg(segments: list[JpegSegment]) -> bytes:
    out = bytearray(b"\xff\xd8")
    for seg in segments:
        out += bytes((0xFF, seg.marker))
        if seg.marker in _STANDALONE:
            continue
        out += struct.pack(">H", min(0xFFFF, len(seg.payload) + 2)) + seg.payload + seg.scan
    return bytes(out)


# -- TIFF / EXIF ---------------------------------------------------------------------------------


@dataclass
class IfdEntry:
    offset: int
    """Where the 12-byte entry starts in the TIFF block."""
    tag: int
    type: int
    count: int
    value: int
    """The first 4 bytes of the value field, read as an unsigned integer (inline values)."""


def parse_ifd(block: bytes) -> tuple[str, int, list[IfdEntry]] | None:
    """(byte order, IFD0 offset, IFD0 entries) of a TIFF structure; None if it has none."""
    if len(block) < 8 or block[:2] not in (b"II", b"MM"):
        return None
    bo = "<" if block[:2] == b"II" else ">"
    (ifd,) = struct.unpack(bo + "I", block[4:8])
    if ifd + 2 > len(block):
        return bo, ifd, []
    (count,) = struct.unpack(bo + "H", block[ifd : ifd + 2])
    entries = []
    for i in range(min(count, 256)):
        off = ifd + 2 + 12 * i
        if off + 12 > len(block):
            break
        tag, typ, cnt = struct.unpack(bo + "HHI", block[off : off + 8])
        (value,) = struct.unpack(bo + "I", block[off + 8 : off + 12])
        if typ == 3 and cnt == 1:  # a SHORT sits in the first two bytes
            (value,) = struct.unpack(bo + "H", block[off + 8 : off + 10])
        entries.append(IfdEntry(off, tag, typ, cnt, value))
    return bo, ifd, entries


def exif_block(
    orientation: int = 1, *, big_endian: bool = False, extra: tuple[tuple[int, int, int, int], ...] = ()
) -> bytes:
    """A TIFF-structured EXIF block with IFD0 = Orientation plus ``extra`` (tag, type, count, value)."""
    bo = ">" if big_endian else "<"
    entries = [(0x0112, 3, 1, orientation), *extra]
    out = (b"MM\x00*" if big_endian else b"II*\x00") + struct.pack(bo + "I", 8) + struct.pack(bo + "H", len(entries))
    for tag, typ, cnt, value in entries:
        if typ == 3 and cnt == 1:
            out += struct.pack(bo + "HHIHH", tag, typ, cnt, value & 0xFFFF, 0)
        else:
            out += struct.pack(bo + "HHII", tag, typ, cnt, value & 0xFFFFFFFF)
    return out + struct.pack(bo + "I", 0)


# -- ICC -----------------------------------------------------------------------------------------


def icc_profile(colour_space: bytes = b"RGB ", tags: int = 0, size: int | None = None) -> bytes:
    """A 128-byte ICC header plus a tag table of ``tags`` entries pointing at 12-byte 'XYZ ' blocks."""
    table = struct.pack(">I", tags)
    data_start = 128 + 4 + 12 * tags
    body = b""
    for i in range(tags):
        table += b"wtpt" + struct.pack(">II", data_start + 20 * i, 20)
        body += b"XYZ \x00\x00\x00\x00" + struct.pack(">iii", 63190, 65536, 54061)
    total = 128 + len(table) + len(body)
    header = struct.pack(">I", total if size is None else size) + b"mmcz" + b"\x04\x30\x00\x00" + b"mntr"
    header += colour_space + b"XYZ " + b"\x00" * 12 + b"acsp" + b"\x00" * (128 - 40 - 4)
    return header[:128] + table + body


# -- RIFF (WebP) ---------------------------------------------------------------------------------


def parse_riff(data: bytes) -> list[tuple[bytes, bytes]] | None:
    if len(data) < 12 or data[:4] != b"RIFF":
        return None
    chunks = []
    pos = 12
    while pos + 8 <= len(data):
        tag = data[pos : pos + 4]
        (size,) = struct.unpack("<I", data[pos + 4 : pos + 8])
        body = data[pos + 8 : pos + 8 + size]
        chunks.append((tag, body))
        pos += 8 + size + (size & 1)
    return chunks


def build_riff(chunks: list[tuple[bytes, bytes]], form: bytes = b"WEBP") -> bytes:
    body = form
    for tag, data in chunks:
        body += tag + struct.pack("<I", len(data)) + data + (b"\x00" if len(data) & 1 else b"")
    return b"RIFF" + struct.pack("<I", len(body)) + body
