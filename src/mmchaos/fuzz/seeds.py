"""The starting queue: small valid inputs of every container the mutators know, plus texts.

The hostile corpus (:mod:`mmchaos.hostile`, what the contract check runs) gives the odd-but-valid
encodings (EXIF-rotated, CMYK, 16-bit, palette, animated): :func:`corpus_seeds`. This module
adds seeds that carry the structures the mutators edit: a PNG with ancillary chunks, a
JPEG with EXIF and an ICC profile, a progressive JPEG, a GIF, a WebP, a TIFF. Pictures are
shrunk to a small side first: mutation and minimisation cost grows with the input.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from mmchaos.fuzz.formats import exif_block, icc_profile
from mmchaos.hostile import CorpusBase, select_cases
from mmchaos.hostile.encoders import save

__all__ = ["Seed", "corpus_seeds", "format_seeds", "shrink", "text_seeds"]


@dataclass(frozen=True)
class Seed:
    name: str
    kind: str
    """``image_bytes`` or ``text_bytes``."""
    data: bytes


def shrink(image: npt.NDArray[np.uint8], side: int = 32) -> npt.NDArray[np.uint8]:
    """The picture resized so its longer side is at most ``side`` (nearest, no new colours)."""
    h, w = image.shape[:2]
    scale = max(h, w) / side
    if scale <= 1:
        return np.ascontiguousarray(image, dtype=np.uint8)
    ys = (np.arange(max(1, int(h / scale))) * scale).astype(int)
    xs = (np.arange(max(1, int(w / scale))) * scale).astype(int)
    return np.ascontiguousarray(image[ys][:, xs], dtype=np.uint8)


_EXIF = b"Exif\x00\x00"
"""The APP1 identifier Pillow expects in front of a JPEG's or WebP's EXIF block."""


def format_seeds(image: npt.NDArray[np.uint8]) -> list[Seed]:
    """One small seed per container structure the mutators know, all decodable by Pillow."""
    from PIL import Image, PngImagePlugin

    img = Image.fromarray(shrink(image))
    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "mmchaos fuzz seed")
    info.add_itxt("Title", "s\u00e9ed", lang="en")
    png = save(img, "PNG", pnginfo=info, icc_profile=icc_profile(), exif=exif_block(1), dpi=(72, 72))
    seeds = [
        Seed("png_chunks", "image_bytes", png),
        Seed("png_palette_trns", "image_bytes", save(img.quantize(16), "PNG", transparency=0)),
        Seed("png_interlaced_grey", "image_bytes", save(img.convert("L"), "PNG", interlace=1)),
        Seed(
            "jpeg_exif_icc",
            "image_bytes",
            save(img, "JPEG", quality=90, exif=_EXIF + exif_block(1), icc_profile=icc_profile()),
        ),
        Seed("jpeg_progressive", "image_bytes", save(img, "JPEG", quality=75, progressive=True, subsampling=2)),
        Seed("gif", "image_bytes", save(img.convert("P"), "GIF")),
        Seed("webp_lossless", "image_bytes", save(img, "WEBP", lossless=True)),
        Seed("webp_lossy_exif", "image_bytes", save(img, "WEBP", quality=80, exif=_EXIF + exif_block(6))),
        Seed("tiff", "image_bytes", save(img, "TIFF")),
    ]
    return seeds


def text_seeds(caption: str) -> list[Seed]:
    base = (caption or "a photo of a cat").encode("utf-8")
    return [
        Seed("caption", "text_bytes", base),
        Seed("caption_unicode", "text_bytes", ("\u00e9t\u00e9 \u732b " + (caption or "")).encode()),
    ]


def corpus_seeds(base: CorpusBase, kinds: list[str]) -> list[Seed]:
    """The hostile corpus's encoded files and texts, built from a small picture, as seeds."""
    seeds: list[Seed] = []
    for case in select_cases([], ["size", "int32"]):
        if case.kind not in ("image_bytes", "text", "text_bytes"):
            continue
        kind = "image_bytes" if case.kind == "image_bytes" else "text_bytes"
        if kind not in kinds:
            continue
        data = case.build(base).data
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogatepass")
        if isinstance(data, bytes | bytearray) and 0 < len(data) <= 1 << 16:
            seeds.append(Seed(f"corpus:{case.name}", kind, bytes(data)))
    return seeds
