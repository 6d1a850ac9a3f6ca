"""Structure-aware and generic mutators of encoded inputs, seeded and pure.

A mutator takes a ``numpy.random.Generator``, the input bytes and donor inputs (for splices) and
returns new bytes, or ``None`` when it does not apply (a PNG mutator on a JPEG). Structure-aware
mutators edit one field of a container (a PNG chunk, a JPEG SOF, an EXIF orientation, an ICC size)
and rebuild the rest correctly (PNG CRCs, segment lengths), so the mutation reaches the decoder
instead of dying at the first integrity check. The same generator state replays the same bytes.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from mmchaos.fuzz.formats import (
    JpegSegment,
    PngChunk,
    build_jpeg,
    build_png,
    build_riff,
    exif_block,
    icc_profile,
    parse_ifd,
    parse_jpeg,
    parse_png,
    parse_riff,
    sniff,
)

__all__ = ["MUTATORS", "MutatorSpec", "mutate", "mutators_for"]

Rng = np.random.Generator
T = TypeVar("T")
MutatorFn = Callable[[Rng, bytes, Sequence[bytes]], "bytes | None"]


@dataclass(frozen=True)
class MutatorSpec:
    name: str
    formats: frozenset[str]
    """Formats (see :func:`~mmchaos.fuzz.formats.sniff`, plus ``text``) it applies to; empty = any."""
    fn: MutatorFn


def _pick(rng: Rng, items: Sequence[T]) -> T:
    return items[int(rng.integers(len(items)))]


# Values that break size arithmetic and table lookups.
EDGE_U32 = (0, 1, 2, 255, 256, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 46_341, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)
EDGE_U16 = (0, 1, 2, 255, 256, 0x7FFF, 0x8000, 0xFFFF)
ORIENTATIONS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 255, 256, 0x7FFF, 0xFFFF)
"""EXIF orientation values: the legal 1..8 and the out-of-range ones decoders index tables with."""

MAX_LEN = 1 << 17
"""The longest input a mutation may produce (128 KiB): seeds are a few KiB."""

# -- generic bytes -------------------------------------------------------------------------------


def bit_flip(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    if not data:
        return None
    out = bytearray(data)
    for _ in range(int(rng.integers(1, 5))):
        i = int(rng.integers(len(out)))
        out[i] ^= 1 << int(rng.integers(8))
    return bytes(out)


def byte_interesting(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    if not data:
        return None
    out = bytearray(data)
    i = int(rng.integers(len(out)))
    width = _pick(rng, (1, 2, 4))
    value = int(_pick(rng, EDGE_U32))
    fmt = _pick(rng, ("<", ">"))
    packed = struct.pack(f"{fmt}{'BHI'[(1, 2, 4).index(width)]}", value & ((1 << (8 * width)) - 1))
    out[i : i + width] = packed
    return bytes(out)


def block_delete(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    if len(data) < 2:
        return None
    i = int(rng.integers(len(data)))
    n = int(rng.integers(1, max(2, min(len(data) - i, 64) + 1)))
    return data[:i] + data[i + n :]


def block_duplicate(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    if not data:
        return None
    i = int(rng.integers(len(data)))
    n = int(rng.integers(1, min(len(data) - i, 256) + 1))
    j = int(rng.integers(len(data) + 1))
    return data[:j] + data[i : i + n] * int(rng.integers(1, 4)) + data[j:]


def truncate(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    if len(data) < 2:
        return None
    return data[: int(rng.integers(0, len(data)))]


def splice(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    others = [d for d in donors if d and d != data]
    if not data or not others:
        return None
    other = others[int(rng.integers(len(others)))]
    i = int(rng.integers(len(data)))
    j = int(rng.integers(len(other)))
    return data[:i] + other[j:]


# -- PNG -----------------------------------------------------------------------------------------


def _ancillary(rng: Rng) -> PngChunk:
    """One ancillary (or unknown) chunk with a plausible or edge-case body."""
    kind = str(_pick(rng, _PNG_EXTRA))
    edge = int(_pick(rng, EDGE_U32))
    body: bytes
    if kind == "tEXt":
        body = b"Comment\x00" + b"A" * int(rng.integers(0, 4096))
    elif kind == "zTXt":
        body = b"Comment\x00\x00" + zlib.compress(b"\x00" * int(rng.integers(1, 1 << 20)))
    elif kind == "iTXt":
        body = b"Title\x00\x00\x00en\x00\x00" + "ü\u202e\u0301".encode() * int(rng.integers(1, 200))
    elif kind == "eXIf":
        body = exif_block(int(_pick(rng, ORIENTATIONS)), big_endian=bool(rng.integers(2)))
    elif kind == "iCCP":
        body = b"icc\x00\x00" + zlib.compress(_icc(rng))
    elif kind == "sPLT":
        body = b"palette\x00" + bytes([int(_pick(rng, (8, 16, 0, 255)))]) + b"\x00" * (6 * int(rng.integers(0, 8)))
    elif kind == "gAMA":
        body = struct.pack(">I", edge)
    elif kind == "cHRM":
        body = struct.pack(">8I", *([edge] * 8))
    elif kind == "sRGB":
        body = bytes([int(rng.integers(256))])
    elif kind == "pHYs":
        body = struct.pack(">IIB", edge, edge, int(rng.integers(256)))
    elif kind == "tIME":
        body = struct.pack(">HBBBBB", int(rng.integers(65536)), *(int(x) for x in rng.integers(0, 256, 5)))
    elif kind == "bKGD":
        body = struct.pack(">HHH", *(int(x) for x in rng.integers(0, 65536, 3)))
    elif kind == "tRNS":
        body = bytes(int(x) for x in rng.integers(0, 256, int(rng.integers(0, 300))))
    elif kind == "sBIT":
        body = bytes(int(x) for x in rng.integers(0, 256, 3))
    elif kind == "PLTE":
        body = bytes(int(x) for x in rng.integers(0, 256, 3 * int(rng.integers(0, 300))))
    elif kind == "acTL":
        body = struct.pack(">II", edge, int(rng.integers(0, 3)))
    elif kind == "fcTL":
        body = struct.pack(">IIIIIHHBB", 0, edge, edge, 0, 0, 1, 1, 0, 0)
    elif kind == "oFFs":
        body = struct.pack(">iiB", -1, 1 << 30, 0)
    else:  # an unknown chunk, critical (upper-case first letter) or not, possibly empty
        body = bytes(int(x) for x in rng.integers(0, 256, int(rng.integers(0, 32))))
    return PngChunk(kind.encode("latin-1"), body)


_PNG_EXTRA = (
    "tEXt", "zTXt", "iTXt", "eXIf", "iCCP", "sPLT", "gAMA", "cHRM", "sRGB", "pHYs", "tIME", "bKGD", "tRNS",
    "sBIT", "PLTE", "acTL", "fcTL", "oFFs", "prIV", "ZZZZ",
)  # fmt: skip


def _png_edit(data: bytes, fn: Callable[[list[PngChunk]], bool]) -> bytes | None:
    parsed = parse_png(data)
    if parsed is None or not parsed[0]:
        return None
    chunks, tail = parsed
    return build_png(chunks, tail) if fn(chunks) else None


def png_chunk_insert(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    def edit(chunks: list[PngChunk]) -> bool:
        chunks.insert(int(rng.integers(1, len(chunks) + 1)), _ancillary(rng))
        return True

    return _png_edit(data, edit)


def png_chunk_duplicate(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    def edit(chunks: list[PngChunk]) -> bool:
        i = int(rng.integers(len(chunks)))
        chunks.insert(int(rng.integers(len(chunks) + 1)), PngChunk(chunks[i].tag, chunks[i].data))
        return True

    return _png_edit(data, edit)


def png_chunk_remove(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    def edit(chunks: list[PngChunk]) -> bool:
        del chunks[int(rng.integers(len(chunks)))]
        return True

    return _png_edit(data, edit)


def png_chunk_reorder(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    def edit(chunks: list[PngChunk]) -> bool:
        if len(chunks) < 2:
            return False
        i, j = (int(x) for x in rng.choice(len(chunks), 2, replace=False))
        chunks[i], chunks[j] = chunks[j], chunks[i]
        return True

    return _png_edit(data, edit)


def png_chunk_data(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    """Flip bytes inside one chunk's data; the CRC is recomputed so the change is decoded."""

    def edit(chunks: list[PngChunk]) -> bool:
        c = chunks[int(rng.integers(len(chunks)))]
        if not c.data:
            return False
        body = bytearray(c.data)
        for _ in range(int(rng.integers(1, 4))):
            body[int(rng.integers(len(body)))] = int(rng.integers(256))
        c.data = bytes(body)
        return True

    return _png_edit(data, edit)


def png_ihdr(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    """Width, height, bit depth, colour type or interlace set to an edge value (CRC kept valid)."""

    def edit(chunks: list[PngChunk]) -> bool:
        c = next((c for c in chunks if c.tag == b"IHDR" and len(c.data) == 13), None)
        if c is None:
            return False
        w, h, depth, colour, comp, filt, inter = struct.unpack(">IIBBBBB", c.data)
        field = int(rng.integers(5))
        if field == 0:
            w = int(_pick(rng, EDGE_U32))
        elif field == 1:
            h = int(_pick(rng, EDGE_U32))
        elif field == 2:
            depth = int(_pick(rng, (0, 1, 2, 4, 8, 16, 3, 32, 255)))
        elif field == 3:
            colour = int(_pick(rng, (0, 2, 3, 4, 6, 1, 5, 7, 255)))
        else:
            inter, comp, filt = int(rng.integers(3)), int(rng.integers(2)), int(rng.integers(2))
        c.data = struct.pack(">IIBBBBB", w, h, depth, colour, comp, filt, inter)
        return True

    return _png_edit(data, edit)


def png_idat(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    """Decompress the image data, corrupt scanline filters or pixels or its length, recompress."""

    def edit(chunks: list[PngChunk]) -> bool:
        idats = [c for c in chunks if c.tag == b"IDAT"]
        if not idats:
            return False
        try:
            raw = bytearray(zlib.decompress(b"".join(c.data for c in idats)))
        except zlib.error:
            return False
        how = int(rng.integers(4))
        if how == 0 and raw:  # an invalid filter type on some scanline starts
            for _ in range(int(rng.integers(1, 4))):
                raw[int(rng.integers(len(raw)))] = int(_pick(rng, (5, 6, 127, 255)))
        elif how == 1:
            raw = raw[: int(rng.integers(0, len(raw) + 1))]  # too little pixel data, valid zlib
        elif how == 2:
            raw += b"\x00" * int(rng.integers(1, 1 << 16))  # too much
        comp = zlib.compress(bytes(raw), int(rng.integers(0, 10)))
        # how == 3: many tiny IDAT chunks
        parts = ([comp[i : i + 7] for i in range(0, len(comp), 7)] or [b""]) if how == 3 else [comp]
        first = chunks.index(idats[0])
        rest = [c for c in chunks if c.tag != b"IDAT"]
        rest[first:first] = [PngChunk(b"IDAT", p) for p in parts]
        chunks[:] = rest
        return True

    return _png_edit(data, edit)


def png_bad_length_or_crc(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    """A length field that lies, or a wrong CRC, on one chunk."""
    parsed = parse_png(data)
    if parsed is None or not parsed[0]:
        return None
    chunks, tail = parsed
    i = int(rng.integers(len(chunks)))
    if rng.integers(2):
        chunks[i].crc = int(rng.integers(1 << 32))
        return build_png(chunks, tail)
    out = bytearray(build_png(chunks, tail))
    pos = 8 + sum(12 + len(c.data) for c in chunks[:i])
    out[pos : pos + 4] = struct.pack(">I", int(_pick(rng, EDGE_U32)))
    return bytes(out)


# -- JPEG ----------------------------------------------------------------------------------------

_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg_edit(data: bytes, fn: Callable[[list[JpegSegment]], bool]) -> bytes | None:
    segments = parse_jpeg(data)
    if not segments:
        return None
    return build_jpeg(segments) if fn(segments) else None


def jpeg_sof(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    """SOF height/width to an edge value, or a different component count or sampling factors."""

    def edit(segments: list[JpegSegment]) -> bool:
        sof = next((s for s in segments if s.marker in _SOF and len(s.payload) >= 6), None)
        if sof is None:
            return False
        p = bytearray(sof.payload)
        how = int(rng.integers(4))
        if how < 2:
            p[1 + 2 * how : 3 + 2 * how] = struct.pack(">H", int(_pick(rng, EDGE_U16)))
        elif how == 2:
            p[5] = int(_pick(rng, (0, 1, 2, 3, 4, 255)))
        elif len(p) > 7:
            p[7] = int(_pick(rng, (0x11, 0x22, 0x44, 0x41, 0x14, 0x00, 0xFF)))
        sof.payload = bytes(p)
        if rng.integers(4) == 0:  # and sometimes a different frame type
            sof.marker = int(_pick(rng, sorted(_SOF)))
        return True

    return _jpeg_edit(data, edit)


def jpeg_tables(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    """Quantisation tables with zeros or a bad id/precision; Huffman tables with impossible counts."""

    def edit(segments: list[JpegSegment]) -> bool:
        tables = [s for s in segments if s.marker in (0xDB, 0xC4) and s.payload]
        if not tables:
            return False
        s = tables[int(rng.integers(len(tables)))]
        p = bytearray(s.payload)
        if s.marker == 0xDB:
            if rng.integers(2):
                p[0] = int(_pick(rng, (0x00, 0x10, 0x04, 0xFF)))
            else:
                for i in range(1, min(len(p), 65)):
                    p[i] = 0 if rng.integers(2) else p[i]
        else:
            if rng.integers(2):
                p[0] = int(_pick(rng, (0x00, 0x10, 0x04, 0x1F, 0xFF)))
            else:
                for i in range(1, min(len(p), 17)):
                    p[i] = int(rng.integers(256)) if rng.integers(3) == 0 else p[i]
        s.payload = bytes(p)
        return True

    return _jpeg_edit(data, edit)


def jpeg_truncate(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    """Cut at a segment boundary or mid-scan, or drop EOI."""

    def edit(segments: list[JpegSegment]) -> bool:
        how = int(rng.integers(3))
        if how == 0:
            del segments[int(rng.integers(1, len(segments) + 1)) :]
        elif how == 1:
            sos = next((s for s in segments if s.marker == 0xDA), None)
            if sos is None:
                return False
            sos.scan = sos.scan[: int(rng.integers(0, len(sos.scan) + 1))]
            segments[:] = segments[: segments.index(sos) + 1]
        else:
            segments[:] = [s for s in segments if s.marker != 0xD9]
        return True

    return _jpeg_edit(data, edit)


def jpeg_segments(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    """Insert an APPn (JFIF, Adobe, ICC, junk), duplicate, drop or reorder a segment."""

    def edit(segments: list[JpegSegment]) -> bool:
        how = int(rng.integers(4))
        if how == 0:
            app = int(_pick(rng, (0xE0, 0xE1, 0xE2, 0xEE, 0xED, 0xEF, 0xFE)))
            body = {
                0xE0: b"JFIF\x00\x01\x02" + bytes([int(rng.integers(4))]) + struct.pack(">HH", 0, 0) + b"\x00\x00",
                0xEE: b"Adobe\x00\x64\x00\x00\x00\x00" + bytes([int(rng.integers(4))]),
                0xE2: b"ICC_PROFILE\x00" + bytes([int(rng.integers(3)), int(rng.integers(3))]) + _icc(rng),
            }.get(app, bytes(int(x) for x in rng.integers(0, 256, int(rng.integers(0, 512)))))
            segments.insert(int(rng.integers(0, len(segments) + 1)), JpegSegment(app, body))
        elif how == 1:
            s = segments[int(rng.integers(len(segments)))]
            segments.insert(int(rng.integers(len(segments) + 1)), JpegSegment(s.marker, s.payload, s.scan))
        elif how == 2:
            del segments[int(rng.integers(len(segments)))]
        else:
            if len(segments) < 2:
                return False
            i, j = (int(x) for x in rng.choice(len(segments), 2, replace=False))
            segments[i], segments[j] = segments[j], segments[i]
        return True

    return _jpeg_edit(data, edit)


def jpeg_segment_length(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    """A segment length field that lies (too short, too long, 0, 1)."""
    segments = parse_jpeg(data)
    if not segments:
        return None
    out = bytearray(build_jpeg(segments))
    starts = [
        i for i in range(2, len(out) - 3) if out[i] == 0xFF and out[i + 1] in (0xDB, 0xC4, 0xC0, 0xC2, 0xDA, 0xE0, 0xE1)
    ]
    if not starts:
        return None
    i = starts[int(rng.integers(len(starts)))]
    out[i + 2 : i + 4] = struct.pack(">H", int(_pick(rng, (0, 1, 2, 3, 0xFFFF, 0x8000))))
    return bytes(out)


# -- EXIF (JPEG APP1, PNG eXIf, WebP EXIF) and ICC -------------------------------------------------


def _mutate_ifd(rng: Rng, block: bytes) -> bytes:
    """Orientation to an edge value, or an entry's type/count/value, or IFD offsets that loop or point out."""
    parsed = parse_ifd(block)
    if parsed is None:
        return exif_block(int(_pick(rng, ORIENTATIONS)))
    bo, ifd, entries = parsed
    out = bytearray(block)
    how = int(rng.integers(5))
    orient = next((e for e in entries if e.tag == 0x0112), None)
    if how <= 1 and orient is not None:
        out[orient.offset + 8 : orient.offset + 10] = struct.pack(bo + "H", int(_pick(rng, ORIENTATIONS)))
    elif how == 2 and entries:
        e = entries[int(rng.integers(len(entries)))]
        field = int(rng.integers(3))
        if field == 0:
            out[e.offset + 2 : e.offset + 4] = struct.pack(bo + "H", int(_pick(rng, (0, 1, 2, 3, 4, 5, 7, 12, 13, 99))))
        elif field == 1:
            out[e.offset + 4 : e.offset + 8] = struct.pack(bo + "I", int(_pick(rng, EDGE_U32)))
        else:
            out[e.offset + 8 : e.offset + 12] = struct.pack(bo + "I", int(_pick(rng, EDGE_U32)))
    elif how == 3:  # IFD0 offset beyond the block, or onto the header
        out[4:8] = struct.pack(bo + "I", int(_pick(rng, (0, 4, 8, len(block), 0xFFFF, 0xFFFFFFFF))))
    else:  # the next-IFD pointer back onto IFD0 (a loop), or an entry count that lies
        end = ifd + 2 + 12 * len(entries)
        if rng.integers(2) and end + 4 <= len(out):
            out[end : end + 4] = struct.pack(bo + "I", ifd)
        elif ifd + 2 <= len(out):
            out[ifd : ifd + 2] = struct.pack(bo + "H", int(_pick(rng, EDGE_U16)))
    return bytes(out)


def _icc(rng: Rng) -> bytes:
    how = int(rng.integers(4))
    if how == 0:
        return icc_profile(colour_space=bytes(_pick(rng, (b"CMYK", b"GRAY", b"Lab ", b"\x00\x00\x00\x00"))))
    if how == 1:
        return icc_profile(size=int(_pick(rng, EDGE_U32)))
    if how == 2:
        return icc_profile(tags=int(rng.integers(1, 4)))[: int(rng.integers(0, 200))]
    return icc_profile(tags=int(_pick(rng, (0, 1, 3))))


def exif_mutate(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    """Edit (or add) the EXIF block of a JPEG, PNG or WebP: orientation out of range, bad IFDs."""
    fmt = sniff(data)
    if fmt == "jpeg":

        def edit(segments: list[JpegSegment]) -> bool:
            app1 = next((s for s in segments if s.marker == 0xE1 and s.payload.startswith(b"Exif\x00\x00")), None)
            if app1 is None:
                app1 = JpegSegment(0xE1, b"Exif\x00\x00" + exif_block(1))
                segments.insert(0, app1)
            app1.payload = b"Exif\x00\x00" + _mutate_ifd(rng, app1.payload[6:])
            return True

        return _jpeg_edit(data, edit)
    if fmt == "png":

        def edit_png(chunks: list[PngChunk]) -> bool:
            c = next((c for c in chunks if c.tag == b"eXIf"), None)
            if c is None:
                c = PngChunk(b"eXIf", exif_block(1))
                chunks.insert(1, c)
            c.data = _mutate_ifd(rng, c.data)
            return True

        return _png_edit(data, edit_png)
    if fmt == "webp":
        chunks = parse_riff(data)
        if not chunks:
            return None
        for i, (tag, body) in enumerate(chunks):
            if tag == b"EXIF":
                prefix = b"Exif\x00\x00" if body.startswith(b"Exif\x00\x00") else b""
                chunks[i] = (tag, prefix + _mutate_ifd(rng, body[len(prefix) :]))
                return build_riff(chunks)
        return build_riff([*chunks, (b"EXIF", _mutate_ifd(rng, exif_block(1)))])
    if fmt == "tiff":
        return _mutate_ifd(rng, data)
    return None


def icc_mutate(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    """Add or replace an embedded ICC profile (PNG iCCP, JPEG APP2) with a hostile one."""
    fmt = sniff(data)
    profile = _icc(rng)
    if fmt == "png":

        def edit(chunks: list[PngChunk]) -> bool:
            chunks[:] = [c for c in chunks if c.tag != b"iCCP"]
            chunks.insert(1, PngChunk(b"iCCP", b"icc\x00\x00" + zlib.compress(profile)))
            return True

        return _png_edit(data, edit)
    if fmt == "jpeg":

        def edit_jpeg(segments: list[JpegSegment]) -> bool:
            seq = bytes([int(_pick(rng, (1, 0, 2))), int(_pick(rng, (1, 0, 2)))])
            segments.insert(0, JpegSegment(0xE2, b"ICC_PROFILE\x00" + seq + profile))
            return True

        return _jpeg_edit(data, edit_jpeg)
    return None


# -- GIF, WebP, TIFF headers ---------------------------------------------------------------------


def gif_header(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    """Screen or frame size, colour-table flags, or the LZW minimum code size set to edge values."""
    if sniff(data) != "gif" or len(data) < 13:
        return None
    out = bytearray(data)
    how = int(rng.integers(4))
    if how == 0:
        i = 6 + 2 * int(rng.integers(2))
        out[i : i + 2] = struct.pack("<H", int(_pick(rng, EDGE_U16)))
        return bytes(out)
    if how == 1:
        out[10] = int(rng.integers(256))
        return bytes(out)
    desc = data.find(b"\x2c", 13)
    if desc < 0 or desc + 10 > len(data):
        return None
    if how == 2:
        i = desc + 1 + 2 * int(rng.integers(4))
        out[i : i + 2] = struct.pack("<H", int(_pick(rng, EDGE_U16)))
    else:
        lzw = desc + 10 + (3 << ((out[desc + 9] & 7) + 1) if out[desc + 9] & 0x80 else 0)
        if lzw < len(out):
            out[lzw] = int(_pick(rng, (0, 1, 12, 13, 255)))
    return bytes(out)


def webp_header(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    """RIFF size lies, VP8X canvas size and flags, VP8L dimensions, chunk order and sizes."""
    chunks = parse_riff(data)
    if chunks is None or sniff(data) != "webp":
        return None
    how = int(rng.integers(4))
    if how == 0:
        out = bytearray(data)
        out[4:8] = struct.pack("<I", int(_pick(rng, EDGE_U32)))
        return bytes(out)
    if how == 1:  # a VP8X header with a canvas of edge size and random feature flags
        w, h = (int(_pick(rng, (0, 1, 16383, 16384, 0xFFFFFF))) for _ in range(2))
        vp8x = bytes([int(rng.integers(256)), 0, 0, 0]) + struct.pack("<I", w)[:3] + struct.pack("<I", h)[:3]
        return build_riff([(b"VP8X", vp8x), *[c for c in chunks if c[0] != b"VP8X"]])
    if how == 2:
        for i, (tag, body) in enumerate(chunks):
            if tag == b"VP8L" and len(body) >= 5:
                bits = int.from_bytes(body[1:5], "little")
                bits = (
                    (bits & ~0x3FFF) | int(rng.integers(1 << 14))
                    if rng.integers(2)
                    else bits ^ (1 << int(rng.integers(32)))
                )
                chunks[i] = (tag, body[:1] + (bits & 0xFFFFFFFF).to_bytes(4, "little") + body[5:])
                return build_riff(chunks)
        return None
    if len(chunks) < 2:
        return None
    chunks.reverse()
    return build_riff(chunks)


def tiff_header(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    """IFD entries of a TIFF file (width, strips, bits per sample, compression...) to edge values."""
    if sniff(data) != "tiff":
        return None
    parsed = parse_ifd(data)
    if parsed is None or not parsed[2]:
        return None
    bo, _, entries = parsed
    e = entries[int(rng.integers(len(entries)))]
    out = bytearray(data)
    if e.type == 3 and e.count == 1:
        out[e.offset + 8 : e.offset + 10] = struct.pack(bo + "H", int(_pick(rng, EDGE_U16)))
    else:
        out[e.offset + 8 : e.offset + 12] = struct.pack(bo + "I", int(_pick(rng, EDGE_U32)))
    if rng.integers(3) == 0:
        out[e.offset + 4 : e.offset + 8] = struct.pack(bo + "I", int(_pick(rng, EDGE_U32)))
    return bytes(out)


# -- UTF-8 text ----------------------------------------------------------------------------------

_TEXT_INSERTS: tuple[bytes, ...] = (
    b"\xc0\x80",  # overlong NUL
    b"\xe0\x80\xaf",  # overlong '/'
    b"\xf0\x80\x80\x80",  # overlong 4-byte
    b"\xc1\xbf",
    b"\xed\xa0\x80",  # lone high surrogate (CESU)
    b"\xed\xbf\xbf",  # lone low surrogate
    b"\xed\xa0\xbd\xed\xb8\x80",  # a surrogate pair encoded as two 3-byte forms
    b"\xef\xbb\xbf",  # BOM
    b"\xff\xfe",  # UTF-16 BOM bytes
    b"\x00",
    b"\x80",  # stray continuation
    b"\xe2\x82",  # truncated sequence
    b"\xf8\x88\x80\x80\x80",  # 5-byte form
    b"\xf4\x90\x80\x80",  # past U+10FFFF
    b"\xef\xbf\xbe",  # noncharacter U+FFFE
    "\u202e\u2066".encode(),  # bidi overrides
    "\u200d\u200b\u2060".encode(),  # zero-width joiner, space, word joiner
    "\u2028\u2029".encode(),  # line/paragraph separators
    "🏳️‍🌈👩🏽‍🚀".encode(),
    b"\x1b[2J\x07\x08\x7f",
)


def text_insert(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    """Insert UTF-8 edge cases: overlongs, surrogates, BOMs, NULs, truncated and 5-byte forms."""
    out = data
    for _ in range(int(rng.integers(1, 4))):
        i = int(rng.integers(len(out) + 1))
        out = out[:i] + bytes(_pick(rng, _TEXT_INSERTS)) + out[i:]
    return out


def text_storm(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    """A storm: thousands of combining marks on one letter, a repeated token, or a huge line."""
    how = int(rng.integers(3))
    if how == 0:
        mark = bytes(_pick(rng, ("\u0301".encode(), "\u0336".encode(), "\u20dd".encode(), "\u0e49".encode())))
        storm = b"a" + mark * int(_pick(rng, (64, 1024, 8192)))
    elif how == 1:
        word = data.split()[0] if data.split() else b"cat"
        storm = b" ".join([word] * int(_pick(rng, (256, 2048))))
    else:
        storm = bytes(_pick(rng, (b"x", "\u4e00".encode(), b"\x00"))) * int(_pick(rng, (4096, 16384)))
    i = int(rng.integers(len(data) + 1))
    return data[:i] + storm + data[i:]


def text_case_and_space(rng: Rng, data: bytes, donors: Sequence[bytes]) -> bytes | None:
    """Whitespace-only, empty, or the text in odd whitespace and case."""
    how = int(rng.integers(4))
    if how == 0:
        return b""
    if how == 1:
        return " \t\n\r\u00a0\u3000\u200b".encode() * int(rng.integers(1, 50))
    if how == 2:
        return data.upper()
    return b"\t".join(data.split())


# -- the registry --------------------------------------------------------------------------------

MUTATORS: tuple[MutatorSpec, ...] = (
    MutatorSpec("bit_flip", frozenset(), bit_flip),
    MutatorSpec("byte_interesting", frozenset(), byte_interesting),
    MutatorSpec("block_delete", frozenset(), block_delete),
    MutatorSpec("block_duplicate", frozenset(), block_duplicate),
    MutatorSpec("truncate", frozenset(), truncate),
    MutatorSpec("splice", frozenset(), splice),
    MutatorSpec("png_chunk_insert", frozenset({"png"}), png_chunk_insert),
    MutatorSpec("png_chunk_duplicate", frozenset({"png"}), png_chunk_duplicate),
    MutatorSpec("png_chunk_remove", frozenset({"png"}), png_chunk_remove),
    MutatorSpec("png_chunk_reorder", frozenset({"png"}), png_chunk_reorder),
    MutatorSpec("png_chunk_data", frozenset({"png"}), png_chunk_data),
    MutatorSpec("png_ihdr", frozenset({"png"}), png_ihdr),
    MutatorSpec("png_idat", frozenset({"png"}), png_idat),
    MutatorSpec("png_bad_length_or_crc", frozenset({"png"}), png_bad_length_or_crc),
    MutatorSpec("jpeg_sof", frozenset({"jpeg"}), jpeg_sof),
    MutatorSpec("jpeg_tables", frozenset({"jpeg"}), jpeg_tables),
    MutatorSpec("jpeg_truncate", frozenset({"jpeg"}), jpeg_truncate),
    MutatorSpec("jpeg_segments", frozenset({"jpeg"}), jpeg_segments),
    MutatorSpec("jpeg_segment_length", frozenset({"jpeg"}), jpeg_segment_length),
    MutatorSpec("exif", frozenset({"jpeg", "png", "webp", "tiff"}), exif_mutate),
    MutatorSpec("icc", frozenset({"jpeg", "png"}), icc_mutate),
    MutatorSpec("gif_header", frozenset({"gif"}), gif_header),
    MutatorSpec("webp_header", frozenset({"webp"}), webp_header),
    MutatorSpec("tiff_header", frozenset({"tiff"}), tiff_header),
    MutatorSpec("text_insert", frozenset({"text"}), text_insert),
    MutatorSpec("text_storm", frozenset({"text"}), text_storm),
    MutatorSpec("text_case_and_space", frozenset({"text"}), text_case_and_space),
)
_BY_NAME = {m.name: m for m in MUTATORS}


def mutators_for(fmt: str) -> tuple[list[MutatorSpec], list[MutatorSpec]]:
    """(structure-aware mutators for ``fmt``, generic byte mutators)."""
    aware = [m for m in MUTATORS if fmt in m.formats]
    generic = [m for m in MUTATORS if not m.formats]
    return aware, generic


def mutate(
    rng: Rng, data: bytes, kind: str, donors: Sequence[bytes], *, structured: float = 0.75, max_len: int = MAX_LEN
) -> tuple[bytes, list[str]]:
    """1 to 4 stacked mutations of ``data``; structure-aware ones with probability ``structured``.

    Returns the new bytes and the names of the mutators applied, in order. The format is sniffed
    again before each step, so a stack can move an input between formats (a splice). A step whose
    result is longer than ``max_len`` is dropped: without a cap, duplications compound over
    generations of the queue and the campaign ends up hashing megabytes per case.
    """
    out = data
    applied: list[str] = []
    steps = 1 + int(min(3, rng.geometric(0.5) - 1))
    for _ in range(steps):
        fmt = "text" if kind == "text_bytes" else sniff(out)
        aware, generic = mutators_for(fmt)
        for _attempt in range(4):
            pool = aware if aware and rng.random() < structured else generic
            spec = pool[int(rng.integers(len(pool)))]
            new = spec.fn(rng, out, donors)
            if new is not None and new != out and len(new) <= max_len:
                out = new
                applied.append(spec.name)
                break
    return out, applied


def get_mutator(name: str) -> MutatorSpec:
    return _BY_NAME[name]
