"""The built-in ``textlines`` dataset: one rendered line of document-like text per image.

Each line holds 2-6 whitespace-separated tokens drawn from words in mixed case, numbers, dates in
several formats, times, prices, short reference codes and e-mail addresses, rendered with the
TrueType font Pillow bundles (Aileron Regular, from ``ImageFont.load_default(size=...)``, Pillow
>= 10.1 with FreeType) at a varying size, mostly dark on light with a few light-on-dark lines,
slightly tinted colours, random padding and faint sensor noise.

The content is limited to what the bundled font can draw and the built-in PP-OCRv4 recogniser
can emit: neither knows ``€`` (the font draws a box, the recogniser's dictionary lacks it), so
euro amounts are written with the ISO code (``EUR 8.50``). Letters that a sans-serif face draws
identically (``I``/``l``, ``O``/``0``) are kept out of the random codes, where no word context
disambiguates them.

Deterministic by (seed, index): sample ``i`` is the same whatever ``n`` is.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from mmchaos.data.base import Dataset, Sample

__all__ = ["WORDS", "make_textline", "make_textlines", "render_textline"]

_WORD_LIST = """
    invoice total amount order delivery payment account customer balance receipt date due paid
    tax net item price discount shipping address street city phone reference number from to for
    and the new open closed pending approved urgent report summary meeting room floor page
    version status ready coffee bread milk apples station platform ticket seat gate flight hotel
    check card cash change store market office north south east west main park river bridge road
    avenue square monday friday weekly monthly service support contact manager team sales
    product model serial batch weight height width length valid until expires issued signed copy
    draft final notes please thank you welcome exit entrance parking level block unit
"""
WORDS: tuple[str, ...] = tuple(_WORD_LIST.split())
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
# Code letters without I and O, which the sans-serif face draws like l/1 and 0.
_CODE_LETTERS = "ABCDEFGHJKLMNPRSTUVWXYZ"
_CODE_PREFIXES = ("INV", "PO", "SKU", "REF", "ORD", "TX", "CASE", "ID", "RMA", "BATCH")
_NAMES = ("anna", "john", "maria", "lee", "sam", "nina", "omar", "kate", "paul", "li", "max")
_SURNAMES = ("smith", "garcia", "chen", "novak", "berg", "khan", "moreau", "rossi", "tanaka")
_DOMAINS = ("example.com", "mail.org", "acme.io", "post.net", "shop.co", "corp.de")

_FG_DARK = (0, 70)
_BG_LIGHT = (215, 256)
_INVERTED_P = 0.15


def _word(rng: np.random.Generator) -> str:
    w = WORDS[int(rng.integers(len(WORDS)))]
    u = float(rng.random())
    if u < 0.5:
        return w
    if u < 0.85:
        return w.capitalize()
    return w.upper()


def _number(rng: np.random.Generator) -> str:
    kind = int(rng.integers(5))
    if kind == 0:
        return str(int(rng.integers(0, 1000)))
    if kind == 1:
        return f"{int(rng.integers(1000, 100000)):,}"
    if kind == 2:
        return f"{float(rng.uniform(0, 1000)):.{int(rng.integers(1, 4))}f}"
    if kind == 3:
        return f"{int(rng.integers(1, 100))}%"
    return f"#{int(rng.integers(1, 10000))}"


def _date(rng: np.random.Generator) -> str:
    y, m, d = int(rng.integers(1990, 2036)), int(rng.integers(1, 13)), int(rng.integers(1, 29))
    kind = int(rng.integers(5))
    if kind == 0:
        return f"{y:04d}-{m:02d}-{d:02d}"
    if kind == 1:
        return f"{d:02d}/{m:02d}/{y:04d}"
    if kind == 2:
        return f"{d:02d}.{m:02d}.{y:04d}"
    if kind == 3:
        return f"{d} {_MONTHS[m - 1]} {y}"
    return f"{_MONTHS[m - 1]} {d}, {y}"


def _time(rng: np.random.Generator) -> str:
    h, mi = int(rng.integers(0, 24)), int(rng.integers(0, 60))
    if rng.random() < 0.5:
        return f"{h:02d}:{mi:02d}"
    return f"{(h % 12) or 12}:{mi:02d} {'AM' if h < 12 else 'PM'}"


def _price(rng: np.random.Generator) -> str:
    value = float(rng.choice([rng.uniform(0.5, 100), rng.uniform(100, 20000)]))
    cents = rng.random() < 0.8
    amount = f"{value:,.2f}" if cents else f"{int(value):,}"
    kind = int(rng.integers(4))
    if kind <= 1:
        return f"${amount}"
    if kind == 2:
        return f"EUR {amount}"
    return f"{amount} EUR"


def _code(rng: np.random.Generator) -> str:
    prefix = _CODE_PREFIXES[int(rng.integers(len(_CODE_PREFIXES)))]
    digits = "".join(str(int(d)) for d in rng.integers(0, 10, size=int(rng.integers(3, 7))))
    code = f"{prefix}-{digits}"
    if rng.random() < 0.3:
        code += f"-{_CODE_LETTERS[int(rng.integers(len(_CODE_LETTERS)))]}"
    return code


def _email(rng: np.random.Generator) -> str:
    name = _NAMES[int(rng.integers(len(_NAMES)))]
    sep = (".", "_", "")[int(rng.integers(3))]
    surname = _SURNAMES[int(rng.integers(len(_SURNAMES)))]
    domain = _DOMAINS[int(rng.integers(len(_DOMAINS)))]
    return f"{name}{sep}{surname}@{domain}"


# (kind, weight, generator): words dominate, as on real documents.
_KINDS: tuple[tuple[str, float, Callable[[np.random.Generator], str]], ...] = (
    ("word", 0.46, _word),
    ("number", 0.11, _number),
    ("date", 0.09, _date),
    ("time", 0.05, _time),
    ("price", 0.11, _price),
    ("code", 0.10, _code),
    ("email", 0.08, _email),
)
_KIND_P = np.array([k[1] for k in _KINDS]) / sum(k[1] for k in _KINDS)


def _line_text(rng: np.random.Generator) -> tuple[str, list[str]]:
    """2-6 whitespace-separated tokens; returns the text and the kinds of its items."""
    target = int(rng.integers(2, 7))
    parts: list[str] = []
    kinds: list[str] = []
    n_tokens = 0
    for _ in range(32):
        if n_tokens >= target:
            break
        kind, _w, gen = _KINDS[int(rng.choice(len(_KINDS), p=_KIND_P))]
        item = gen(rng)
        size = len(item.split())
        if n_tokens + size > target:
            continue
        parts.append(item)
        kinds.append(kind)
        n_tokens += size
    while n_tokens < 2:  # pragma: no cover - the loop above practically always reaches 2
        parts.append(_word(rng))
        kinds.append("word")
        n_tokens += 1
    return " ".join(parts), kinds


@lru_cache(maxsize=64)
def _font(size: int) -> ImageFont.FreeTypeFont:
    font = ImageFont.load_default(size=size)
    if not isinstance(font, ImageFont.FreeTypeFont):  # pragma: no cover - Pillow w/o FreeType
        raise RuntimeError("the textlines dataset needs Pillow built with FreeType (>= 10.1)")
    return font


def render_textline(
    text: str,
    font_size: int,
    height: int,
    fg: tuple[int, int, int],
    bg: tuple[int, int, int],
    pad_left: int,
    pad_right: int,
    y_jitter: int = 0,
    noise: float = 0.0,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Render ``text`` on one line, vertically centred in an image ``height`` pixels high."""
    font = _font(font_size)
    left, top, right, bottom = (round(v) for v in font.getbbox(text))
    ink_w, ink_h = right - left, bottom - top
    width = max(1, ink_w + pad_left + pad_right)
    img = Image.new("RGB", (width, height), bg)
    y = (height - ink_h) // 2 - top + y_jitter
    ImageDraw.Draw(img).text((pad_left - left, y), text, font=font, fill=fg)
    arr = np.asarray(img, dtype=np.uint8)
    if noise > 0 and rng is not None:
        noisy = arr.astype(np.float32) + rng.normal(0.0, noise, size=arr.shape).astype(np.float32)
        arr = np.clip(np.rint(noisy), 0, 255).astype(np.uint8)
    return arr


def _colours(rng: np.random.Generator) -> tuple[tuple[int, int, int], tuple[int, int, int], bool]:
    inverted = bool(rng.random() < _INVERTED_P)
    dark = int(rng.integers(*_FG_DARK))
    light = int(rng.integers(*_BG_LIGHT))
    tint_fg = rng.integers(-20, 21, size=3)
    tint_bg = rng.integers(-12, 13, size=3)
    fg_base, bg_base = (light, dark) if inverted else (dark, light)
    return _tinted(fg_base, tint_fg), _tinted(bg_base, tint_bg), inverted


def _tinted(base: int, tint: np.ndarray) -> tuple[int, int, int]:
    r, g, b = (int(np.clip(base + int(t), 0, 255)) for t in tint)
    return r, g, b


def make_textline(seed: int, index: int, height: int = 48) -> Sample:
    """Sample ``index`` of the ``textlines`` dataset for ``seed``."""
    rng = np.random.default_rng([seed, index])
    text, kinds = _line_text(rng)
    font_size = max(8, round(height * float(rng.uniform(0.48, 0.7))))
    # Keep the ink (ascender to descender) inside the image with a little room to spare.
    while font_size > 8:
        _l, top, _r, bottom = _font(font_size).getbbox(text)
        if bottom - top <= height - max(4, height // 8):
            break
        font_size -= 1
    fg, bg, inverted = _colours(rng)
    pad_left = int(rng.integers(height // 8, height // 2 + 1))
    pad_right = int(rng.integers(height // 8, height // 2 + 1))
    y_jitter = int(rng.integers(-(height // 16), height // 16 + 1))
    noise = float(rng.uniform(0.0, 4.0))
    image = render_textline(text, font_size, height, fg, bg, pad_left, pad_right, y_jitter, noise, rng)
    return Sample(
        id=f"textlines-{index}",
        image=image,
        caption=None,
        label=None,
        text=text,
        meta={"font_size": font_size, "inverted": inverted, "kinds": kinds},
    )


def make_textlines(n: int = 200, seed: int = 0, height: int = 48) -> Dataset:
    """Generate ``n`` single-line text images with their transcriptions."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if height < 16:
        raise ValueError(f"height must be >= 16 pixels, got {height}")
    return Dataset(
        name="textlines",
        samples=[make_textline(seed, i, height) for i in range(n)],
        source=f"builtin:textlines?seed={seed}&n={n}",
    )
