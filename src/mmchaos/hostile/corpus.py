"""The step-1 corpus: hostile and malformed inputs, generated on the fly, deterministically.

Each :class:`Case` builds its :class:`Payload` from a base picture and a base caption (the first
sample of the run's dataset), so the corpus needs no files and replays byte for byte. A case says
what a correct target does with it:

* ``reject`` -- no correct output exists (zero bytes, corrupt data, a bomb, an element count past
  int32, NaN pixels): only a clean, typed rejection is right;
* ``equivalent`` -- a valid but unusual encoding of a known picture (EXIF-rotated, CMYK, 16-bit,
  palette, animated): the output must match the output for ``expected``, the picture a correct
  decoder produces, and not one of the ``wrong`` pictures that known decoding bugs produce;
* ``either`` -- odd but legal (1x1, 2x10000, emoji, 10,000 tokens): reject cleanly or answer
  sanely (finite, non-constant), never crash or hang.

Every payload is built inside the worker that runs it; large declared sizes are headers or
zero-stride views, never allocations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from mmchaos.guard.limits import INT32_MAX, declared_elements
from mmchaos.hostile.encoders import (
    as_rgb,
    bomb_png_1bit,
    header_only_png,
    last_frame_rgb,
    plain_rgb,
    png16_rgb,
    save,
    to_pil,
)

__all__ = ["CASES", "Case", "CorpusBase", "Expect", "Kind", "Payload", "case_names", "get_case", "select_cases"]

Expect = Literal["reject", "equivalent", "either"]
Kind = Literal["image_bytes", "image_array", "text", "text_bytes"]
U8 = npt.NDArray[np.uint8]


@dataclass(frozen=True)
class CorpusBase:
    """What every case derives from: a legible picture and a normal caption."""

    image: U8
    caption: str


@dataclass
class Payload:
    data: Any
    expected: Any = None
    """For ``equivalent`` cases: the correct decoded picture (RGB uint8)."""
    wrong: dict[str, Any] = field(default_factory=dict)
    """Pictures that known bugs produce instead, by bug name."""
    filename: str = ""
    media_type: str = "application/octet-stream"
    note: str = ""


@dataclass(frozen=True)
class Case:
    name: str
    group: str
    kind: Kind
    expect: Expect
    description: str
    build: Callable[[CorpusBase], Payload]
    declared_shape: tuple[int, ...] | None = None
    reader_expect: Expect | None = None
    """What a text reader (OCR) must do, when it differs from ``expect``."""

    def expected_for(self, reader: bool) -> Expect:
        return self.reader_expect if reader and self.reader_expect else self.expect

    @property
    def declared_elements(self) -> int | None:
        return declared_elements(self.declared_shape) if self.declared_shape else None

    @property
    def over_int32(self) -> bool:
        n = self.declared_elements
        return n is not None and n > INT32_MAX


# -- the cases -----------------------------------------------------------------------------------

# EXIF orientation -> the transpose that turns the stored pixels upright (Pillow's table).
_EXIF_UPRIGHT = {
    2: "FLIP_LEFT_RIGHT",
    3: "ROTATE_180",
    4: "FLIP_TOP_BOTTOM",
    5: "TRANSPOSE",
    6: "ROTATE_270",
    7: "TRANSVERSE",
    8: "ROTATE_90",
}
# ... and its inverse, which makes the stored pixels from the upright picture.
_EXIF_STORE = {
    2: "FLIP_LEFT_RIGHT",
    3: "ROTATE_180",
    4: "FLIP_TOP_BOTTOM",
    5: "TRANSPOSE",
    6: "ROTATE_90",
    7: "TRANSVERSE",
    8: "ROTATE_270",
}


def _exif_case(orientation: int) -> Callable[[CorpusBase], Payload]:
    def build(base: CorpusBase) -> Payload:
        from PIL import Image

        upright = to_pil(base.image)
        stored = upright.transpose(getattr(Image.Transpose, _EXIF_STORE[orientation]))
        exif = Image.Exif()
        exif[0x0112] = orientation
        blob = save(stored, "JPEG", quality=95, exif=exif.tobytes())
        plain = plain_rgb(blob)
        fixed = to_pil(plain).transpose(getattr(Image.Transpose, _EXIF_UPRIGHT[orientation]))
        return Payload(
            blob,
            expected=np.asarray(fixed, dtype=np.uint8),
            wrong={"exif_orientation_ignored": plain},
            filename=f"exif_orientation_{orientation}.jpg",
            media_type="image/jpeg",
        )

    return build


def _mode_png(mode: str, transparency: bool = False) -> Callable[[CorpusBase], Payload]:
    def build(base: CorpusBase) -> Payload:
        img = to_pil(base.image)
        if mode == "P":
            conv = img.quantize(colors=255, dither=0)
            if transparency:  # a transparency index that no pixel uses: the picture is opaque
                conv.info["transparency"] = 255
                blob = save(conv, "PNG", transparency=255)
            else:
                blob = save(conv, "PNG")
            return Payload(blob, expected=as_rgb(conv), filename=f"mode_{mode}.png", media_type="image/png")
        if mode in ("RGBA", "LA"):
            conv = img.convert(mode)  # alpha 255 everywhere: the picture is opaque
            return Payload(
                save(conv, "PNG"), expected=as_rgb(conv), filename=f"mode_{mode}.png", media_type="image/png"
            )
        conv = img.convert(mode)
        return Payload(save(conv, "PNG"), expected=as_rgb(conv), filename=f"mode_{mode}.png", media_type="image/png")

    return build


def _rgba_transparent(base: CorpusBase) -> Payload:
    rgba = np.dstack([base.image, np.full(base.image.shape[:2], 255, np.uint8)])
    h = rgba.shape[0]
    rgba[: h // 3, :, 3] = 0  # the top third is fully transparent (its RGB is black)
    rgba[: h // 3, :, :3] = 0
    return Payload(save(to_pil(rgba), "PNG"), filename="rgba_transparent.png", media_type="image/png")


def _i16_png(base: CorpusBase) -> Payload:
    gray8 = np.asarray(to_pil(base.image).convert("L"), dtype=np.uint8)
    wide = gray8.astype(np.uint16) * 257
    img = to_pil(wide)  # type: ignore[arg-type]
    return Payload(
        save(img, "PNG"),
        expected=np.repeat(gray8[:, :, None], 3, axis=2),
        wrong={"16bit_clipped_to_white": as_rgb(img)},
        filename="mode_I16.png",
        media_type="image/png",
    )


def _i_tiff(base: CorpusBase) -> Payload:
    gray8 = np.asarray(to_pil(base.image).convert("L"), dtype=np.uint8)
    wide = gray8.astype(np.int32) * 257
    img = to_pil(wide)  # type: ignore[arg-type]
    return Payload(
        save(img, "TIFF"),
        expected=np.repeat(gray8[:, :, None], 3, axis=2),
        wrong={"16bit_clipped_to_white": as_rgb(img)},
        filename="mode_I.tiff",
        media_type="image/tiff",
    )


def _f_tiff(base: CorpusBase) -> Payload:
    gray = np.asarray(to_pil(base.image).convert("L"), dtype=np.float32) / 255.0
    return Payload(save(to_pil(gray), "TIFF"), filename="mode_F.tiff", media_type="image/tiff")  # type: ignore[arg-type]


def _png16_rgb_case(base: CorpusBase) -> Payload:
    return Payload(png16_rgb(base.image), expected=base.image, filename="rgb_16bit.png", media_type="image/png")


def _cmyk(fmt: str) -> Callable[[CorpusBase], Payload]:
    def build(base: CorpusBase) -> Payload:
        cmyk = to_pil(base.image).convert("CMYK")
        if fmt == "JPEG":
            blob = save(cmyk, "JPEG", quality=95)
            expected = plain_rgb(blob)
            return Payload(
                blob,
                expected=expected,
                wrong={"cmyk_inverted": (255 - expected).astype(np.uint8)},
                filename="mode_CMYK.jpg",
                media_type="image/jpeg",
            )
        blob = save(cmyk, "TIFF")
        return Payload(
            blob,
            expected=as_rgb(cmyk),
            wrong={"cmyk_inverted": (255 - as_rgb(cmyk)).astype(np.uint8)},
            filename="mode_CMYK.tiff",
            media_type="image/tiff",
        )

    return build


def _png(base: CorpusBase) -> bytes:
    return save(to_pil(base.image), "PNG")


def _jpeg(base: CorpusBase) -> bytes:
    return save(to_pil(base.image), "JPEG", quality=95)


def _truncated(fmt: str) -> Callable[[CorpusBase], Payload]:
    def build(base: CorpusBase) -> Payload:
        blob = _png(base) if fmt == "png" else _jpeg(base)
        return Payload(blob[: len(blob) * 6 // 10], filename=f"truncated.{fmt}", media_type=f"image/{fmt}")

    return build


def _corrupt_png(base: CorpusBase) -> Payload:
    blob = bytearray(_png(base))
    start = blob.index(b"IDAT") + 4
    for i in range(start + 8, min(len(blob) - 16, start + 64)):
        blob[i] ^= 0x5A  # scramble compressed data inside IDAT; the CRC no longer matches
    return Payload(bytes(blob), filename="corrupt_idat.png", media_type="image/png")


def _garbage(base: CorpusBase) -> Payload:
    rng = np.random.default_rng(20240417)
    return Payload(rng.integers(0, 256, 2048, dtype=np.uint8).tobytes(), filename="random.bin")


def _html(base: CorpusBase) -> Payload:
    return Payload(b"<!doctype html><html><body>502 Bad Gateway</body></html>\n", filename="error.html")


def _jpeg_named_png(base: CorpusBase) -> Payload:
    blob = _jpeg(base)
    return Payload(
        blob,
        expected=plain_rgb(blob),
        filename="photo.png",
        media_type="image/png",
        note="JPEG bytes in a file named .png: decoding must sniff the content, not trust the name",
    )


def _webp(base: CorpusBase) -> Payload:
    return Payload(
        save(to_pil(base.image), "WEBP", lossless=True),
        expected=base.image,
        filename="lossless.webp",
        media_type="image/webp",
    )


def _size_png(width: int, height: int) -> Callable[[CorpusBase], Payload]:
    def build(base: CorpusBase) -> Payload:
        from PIL import Image

        img = to_pil(base.image).resize((width, height), Image.Resampling.BILINEAR)
        return Payload(save(img, "PNG"), filename=f"size_{width}x{height}.png", media_type="image/png")

    return build


def _bomb(side: int) -> Callable[[CorpusBase], Payload]:
    def build(base: CorpusBase) -> Payload:
        return Payload(bomb_png_1bit(side), filename=f"bomb_{side}x{side}_1bit.png", media_type="image/png")

    return build


def _header_only(width: int, height: int, colour_type: int) -> Callable[[CorpusBase], Payload]:
    def build(base: CorpusBase) -> Payload:
        return Payload(
            header_only_png(width, height, colour_type),
            filename=f"declared_{width}x{height}.png",
            media_type="image/png",
        )

    return build


_A4_300DPI = (3508, 2480, 3)  # an A4 page scanned at 300 dpi: 26 million elements, well inside int32
_A0_1200DPI = (56_173, 39_732, 3)  # an A0 poster at 1200 dpi: 6.7e9 elements, past int32 (000)
_MINIMAL_PDF = (
    b"%PDF-1.4\n1 0 obj <</Type /Catalog /Pages 2 0 R>> endobj\n"
    b"2 0 obj <</Type /Pages /Kids [3 0 R] /Count 1>> endobj\n"
    b"3 0 obj <</Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents 4 0 R>> endobj\n"
    b"4 0 obj <</Length 44>> stream\nBT /F1 24 Tf 72 770 Td (Quarterly report) Tj ET\nendstream endobj\n"
    b"trailer <</Root 1 0 R>>\n%%EOF\n"
)


def _pdf_upload(base: CorpusBase) -> Payload:
    return Payload(
        _MINIMAL_PDF,
        filename="scan.pdf",
        media_type="application/pdf",
        note="a client that uploads the PDF itself where a page image is expected",
    )


def _scanned_page(base: CorpusBase) -> Payload:
    """A white A4 page at 300 dpi: the base picture as a figure, ruled lines as a table."""
    from PIL import Image

    width = _A4_300DPI[1]
    page = np.full(_A4_300DPI, 255, np.uint8)
    figure = np.asarray(to_pil(base.image).resize((width // 3, width // 3), Image.Resampling.BILINEAR))
    page[300 : 300 + figure.shape[0], 300 : 300 + figure.shape[1]] = figure[..., :3]
    for row in range(1600, 2800, 120):
        page[row : row + 4, 300 : width - 300] = 0
    for col in range(300, width - 299, 470):
        page[1600:2684, col : col + 4] = 0
    return Payload(save(to_pil(page), "PNG"), filename="page_a4_300dpi.png", media_type="image/png")


def _animated(fmt: str) -> Callable[[CorpusBase], Payload]:
    def build(base: CorpusBase) -> Payload:
        frames = [
            to_pil(base.image),
            to_pil((255 - base.image).astype(np.uint8)),
            to_pil(np.roll(base.image, 7, axis=1)),
        ]
        if fmt == "GIF":
            blob = save(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=80, loop=0)
            expected = plain_rgb(blob)  # the first frame after GIF's palette quantisation
            wrong = {"last_frame": np.asarray(last_frame_rgb(blob), dtype=np.uint8)}
            return Payload(blob, expected=expected, wrong=wrong, filename="animated.gif", media_type="image/gif")
        blob = save(frames[0], "WEBP", save_all=True, append_images=frames[1:], duration=80, lossless=True)
        wrong = {"last_frame": np.roll(base.image, 7, axis=1)}
        return Payload(blob, expected=base.image, wrong=wrong, filename="animated.webp", media_type="image/webp")

    return build


def _array(fn: Callable[[U8], Any], expected: Callable[[U8], Any] | None = None) -> Callable[[CorpusBase], Payload]:
    def build(base: CorpusBase) -> Payload:
        return Payload(
            fn(base.image), expected=expected(base.image) if expected else None, media_type="application/x-npy"
        )

    return build


def _nan_array(img: U8) -> Any:
    out = img.astype(np.float32)
    out[::5, ::3] = np.nan
    return out


def _inf_array(img: U8) -> Any:
    out = img.astype(np.float32)
    out[1::4] = np.inf
    return out


def _view(shape: tuple[int, ...]) -> Callable[[U8], Any]:
    """A zero-stride read-only view: the shape is declared, nothing is allocated."""
    return lambda img: np.broadcast_to(img[:1, :1, :1].reshape((1,) * len(shape)), shape)


def _text(value: str | Callable[[CorpusBase], str]) -> Callable[[CorpusBase], Payload]:
    def build(base: CorpusBase) -> Payload:
        text = value(base) if callable(value) else value
        return Payload(text, filename="text.txt", media_type="text/plain; charset=utf-8")

    return build


def _invalid_utf8(base: CorpusBase) -> Payload:
    blob = base.caption.encode() + b" \xff\xfe \xc3\x28 \xed\xa0\x80 \xf8\x88\x80\x80\x80"
    return Payload(blob, filename="invalid_utf8.txt", media_type="text/plain")


def _long_text(base: CorpusBase) -> str:
    words = (base.caption or "a photo").split()
    return " ".join(words[i % len(words)] for i in range(10_000))


_BIG = (50_000, 50_000, 3)
_THIN = (1, 715_827_883, 3)  # only 1 x 715,827,883 pixels, but x3 channels passes 2**31 - 1
_SQUARE = (46_341, 46_341, 1)  # the smallest square whose pixel count passes 2**31 - 1

CASES: tuple[Case, ...] = (
    # -- files that are not (complete) images
    Case(
        "zero_byte",
        "file",
        "image_bytes",
        "reject",
        "an empty upload (0 bytes)",
        lambda b: Payload(b"", filename="empty.png"),
    ),
    Case("truncated_png", "file", "image_bytes", "reject", "the first 60% of a PNG", _truncated("png")),
    Case("truncated_jpeg", "file", "image_bytes", "reject", "the first 60% of a JPEG", _truncated("jpeg")),
    Case("corrupt_png_data", "file", "image_bytes", "reject", "a PNG whose compressed data is scrambled", _corrupt_png),
    Case("random_bytes", "file", "image_bytes", "reject", "2 KB of random bytes", _garbage),
    Case("html_error_page", "file", "image_bytes", "reject", "an HTML error page where an image was expected", _html),
    Case("jpeg_named_png", "file", "image_bytes", "equivalent", "JPEG bytes with a .png name", _jpeg_named_png),
    Case("webp_lossless", "file", "image_bytes", "equivalent", "a lossless WebP", _webp),
    # -- sizes
    Case("size_1x1", "size", "image_bytes", "either", "a 1x1 PNG", _size_png(1, 1), (1, 1, 3)),
    Case(
        "size_2x10000",
        "size",
        "image_bytes",
        "either",
        "a 2 px wide, 10000 px tall PNG",
        _size_png(2, 10_000),
        (10_000, 2, 3),
    ),
    Case(
        "size_10000x2",
        "size",
        "image_bytes",
        "either",
        "a 10000 px wide, 2 px tall PNG",
        _size_png(10_000, 2),
        (2, 10_000, 3),
    ),
    Case(
        "size_20000x20000",
        "size",
        "image_bytes",
        "either",
        "a complete 20000x20000 1-bit PNG (50 KB)",
        _bomb(20_000),
        (20_000, 20_000, 3),
    ),
    Case(
        "decompression_bomb",
        "size",
        "image_bytes",
        "reject",
        "a 16000x16000 1-bit PNG of 31 KB: 768 MB as RGB",
        _bomb(16_000),
        (16_000, 16_000, 3),
    ),
    # -- the int32 element-count trap (000): declared shapes past 2**31 - 1, nothing allocated
    Case(
        "int32_png_50000x50000",
        "int32",
        "image_bytes",
        "reject",
        "a PNG header declaring 50000x50000 RGB (7.5e9 elements)",
        _header_only(50_000, 50_000, 2),
        _BIG,
    ),
    Case(
        "int32_png_46341x46341",
        "int32",
        "image_bytes",
        "reject",
        "a PNG header declaring 46341x46341 grey: pixels alone pass 2**31-1",
        _header_only(46_341, 46_341, 0),
        _SQUARE,
    ),
    Case(
        "int32_array_50000x50000x3",
        "int32",
        "image_array",
        "reject",
        "a zero-stride uint8 array of shape 50000x50000x3",
        _array(_view(_BIG)),
        _BIG,
    ),
    Case(
        "int32_array_1x715827883x3",
        "int32",
        "image_array",
        "reject",
        "a zero-stride uint8 array 1x715827883x3: only the channel product overflows",
        _array(_view(_THIN)),
        _THIN,
    ),
    # -- the document path of 000: PDFs and the page images made from them
    Case(
        "document_pdf_bytes",
        "document",
        "image_bytes",
        "reject",
        "a PDF file sent where an image is expected",
        _pdf_upload,
    ),
    Case(
        "document_page_a4_300dpi",
        "document",
        "image_bytes",
        "either",
        "an A4 page scanned at 300 dpi (2480x3508 PNG, 26 million elements)",
        _scanned_page,
        _A4_300DPI,
    ),
    Case(
        "int32_document_page_a0_1200dpi",
        "int32",
        "image_bytes",
        "reject",
        "a PNG header declaring an A0 page at 1200 dpi (39732x56173 RGB, 6.7e9 elements)",
        _header_only(_A0_1200DPI[1], _A0_1200DPI[0], 2),
        _A0_1200DPI,
    ),
    # -- Pillow modes that occur in the wild
    Case("mode_1", "mode", "image_bytes", "equivalent", "a 1-bit PNG", _mode_png("1")),
    Case("mode_L", "mode", "image_bytes", "equivalent", "an 8-bit grey PNG", _mode_png("L")),
    Case("mode_LA", "mode", "image_bytes", "equivalent", "a grey+alpha PNG (opaque)", _mode_png("LA")),
    Case("mode_P", "mode", "image_bytes", "equivalent", "a palette PNG", _mode_png("P")),
    Case(
        "mode_P_transparency",
        "mode",
        "image_bytes",
        "equivalent",
        "a palette PNG with a tRNS transparency index",
        _mode_png("P", transparency=True),
    ),
    Case("mode_RGBA", "mode", "image_bytes", "equivalent", "an RGBA PNG (opaque)", _mode_png("RGBA")),
    Case(
        "mode_RGBA_transparent",
        "mode",
        "image_bytes",
        "either",
        "an RGBA PNG whose top third is transparent",
        _rgba_transparent,
    ),
    Case("mode_CMYK_jpeg", "mode", "image_bytes", "equivalent", "a CMYK JPEG", _cmyk("JPEG")),
    Case("mode_CMYK_tiff", "mode", "image_bytes", "equivalent", "a CMYK TIFF", _cmyk("TIFF")),
    Case("mode_I16_png", "mode", "image_bytes", "equivalent", "a 16-bit grey PNG (mode I;16)", _i16_png),
    Case(
        "mode_I_tiff",
        "mode",
        "image_bytes",
        "equivalent",
        "16-bit grey data in a 32-bit integer TIFF (mode I)",
        _i_tiff,
    ),
    Case("mode_F_tiff", "mode", "image_bytes", "either", "a 32-bit float TIFF (mode F) with values in [0, 1]", _f_tiff),
    Case(
        "rgb_16bit_png", "mode", "image_bytes", "equivalent", "a 48-bit RGB PNG (16 bits per channel)", _png16_rgb_case
    ),
    # -- EXIF orientation
    *(
        Case(
            f"exif_orientation_{o}",
            "exif",
            "image_bytes",
            "equivalent",
            f"a JPEG with EXIF orientation {o}",
            _exif_case(o),
        )
        for o in range(2, 9)
    ),
    # -- animation
    Case(
        "animated_gif",
        "animation",
        "image_bytes",
        "equivalent",
        "a 3-frame GIF: the first frame counts",
        _animated("GIF"),
    ),
    Case(
        "animated_webp",
        "animation",
        "image_bytes",
        "equivalent",
        "a 3-frame lossless WebP: the first frame counts",
        _animated("WEBP"),
    ),
    # -- arrays handed to the array API
    Case("array_nan", "array", "image_array", "reject", "a float32 image array with NaN pixels", _array(_nan_array)),
    Case("array_inf", "array", "image_array", "reject", "a float32 image array with +Inf rows", _array(_inf_array)),
    Case(
        "array_empty",
        "array",
        "image_array",
        "reject",
        "a 0x0x3 uint8 array",
        _array(lambda img: np.zeros((0, 0, 3), np.uint8)),
        reader_expect="either",  # "no text" is a fair reading of an empty picture
    ),
    Case(
        "array_gray_2d",
        "array",
        "image_array",
        "either",
        "an (H, W) grey uint8 array",
        _array(lambda img: np.asarray(to_pil(img).convert("L"))),
    ),
    Case(
        "array_rgba",
        "array",
        "image_array",
        "either",
        "an (H, W, 4) uint8 array",
        _array(lambda img: np.dstack([img, np.full(img.shape[:2], 255, np.uint8)])),
    ),
    Case(
        "array_uint16",
        "array",
        "image_array",
        "either",
        "an (H, W, 3) uint16 array",
        _array(lambda img: img.astype(np.uint16) * 257),
    ),
    Case(
        "array_non_contiguous",
        "array",
        "image_array",
        "equivalent",
        "a mirrored (negative-stride) view",
        _array(lambda img: img[:, ::-1], lambda img: np.ascontiguousarray(img[:, ::-1])),
    ),
    # -- texts
    Case("text_empty", "text", "text", "either", "an empty string", _text("")),
    Case("text_whitespace", "text", "text", "either", "whitespace only", _text(" \t\n\r\u00a0\u3000 ")),
    Case("text_10000_tokens", "text", "text", "either", "a caption repeated to 10,000 words", _text(_long_text)),
    Case(
        "text_invalid_utf8",
        "text",
        "text_bytes",
        "either",
        "caption bytes followed by invalid UTF-8 sequences",
        _invalid_utf8,
    ),
    Case(
        "text_lone_surrogate",
        "text",
        "text",
        "either",
        "a str with lone surrogates (invalid UTF-8 read with surrogateescape)",
        _text(lambda b: b.caption + " \udcff\udcfe"),
    ),
    Case(
        "text_nul_control",
        "text",
        "text",
        "either",
        "NUL, bell, escape and other control characters",
        _text(lambda b: "\x00" + b.caption + "\x07\x1b[31m\x08\x7f\x00"),
    ),
    Case(
        "text_rtl",
        "text",
        "text",
        "either",
        "right-to-left text and bidi overrides",
        _text(lambda b: "\u202e" + b.caption + "\u202c صورة של חתול \u200f"),
    ),
    Case(
        "text_zero_width",
        "text",
        "text",
        "either",
        "zero-width spaces, joiners and a BOM inside words",
        _text(lambda b: "\ufeff" + "\u200b".join(b.caption) + "\u200d\u2060"),
    ),
    Case(
        "text_emoji",
        "text",
        "text",
        "either",
        "emoji, ZWJ sequences and skin-tone modifiers",
        _text(lambda b: b.caption + " 🐱‍👤👩🏽‍🚀🏳️‍🌈 🇺🇳 " * 3),
    ),
    Case(
        "text_combining",
        "text",
        "text",
        "either",
        "stacked combining marks (zalgo)",
        _text(lambda b: "".join(c + "\u0336\u0317\u0350" * 4 for c in b.caption)),
    ),
)

_BY_NAME = {c.name: c for c in CASES}


def case_names() -> list[str]:
    return [c.name for c in CASES]


def select_cases(include: list[str], exclude: list[str]) -> list[Case]:
    """Cases whose name or group matches an ``include`` pattern (all when empty), minus ``exclude``."""
    import fnmatch

    def hit(case: Case, patterns: list[str]) -> bool:
        return any(fnmatch.fnmatchcase(case.name, p) or fnmatch.fnmatchcase(case.group, p) for p in patterns)

    return [c for c in CASES if (not include or hit(c, include)) and not hit(c, exclude)]


def get_case(name: str) -> Case:
    return _BY_NAME[name]
