"""Typographic attack: a misleading word written onto the image (CLIP reads text in images).

Goh et al. (2021) showed CLIP classifying an apple labelled "iPod" as an iPod. Severity grows
the word's size and opacity. Bound to a dataset (:meth:`bind`), the word is one of its class
names, so the written label competes with the true one; otherwise it comes from a built-in list.
The font is the TrueType face Pillow bundles, so rendering needs no font files.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Self

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from mmchaos.perturb.base import BindContext, ImageArray, ImagePerturbation, severity_value

MISLEADING_WORDS = (
    "dog", "cat", "pizza", "iPod", "banana", "airplane", "library", "piggy bank", "stop", "rifle",
    "poodle", "laptop", "bird", "truck", "guitar", "spider", "apple", "toilet", "red", "circle",
)  # fmt: skip


@lru_cache(maxsize=64)
def _font(size: int) -> Any:
    return ImageFont.load_default(size=size)


class Typographic(ImagePerturbation):
    """A misleading word rendered onto the image, larger and more opaque with severity."""

    name = "typographic"
    group = "typographic"
    source = "Goh et al. 2021 (multimodal neurons: typographic attacks on CLIP)"
    # (text height as a share of the shorter side, opacity)
    TABLE = ((0.12, 0.35), (0.16, 0.5), (0.2, 0.65), (0.25, 0.8), (0.3, 1.0))

    def __init__(self, words: tuple[str, ...] = MISLEADING_WORDS) -> None:
        self.words = tuple(words) or MISLEADING_WORDS

    def bind(self, context: BindContext) -> Self:
        if context.labels:
            self.words = tuple(context.labels)
        return self

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        share, opacity = severity_value(self.TABLE, severity)
        h, w = item.shape[:2]
        word = self.words[int(rng.integers(len(self.words)))]
        size = max(6, round(share * min(h, w)))
        left, top, right, bottom = _font(size).getbbox(word)
        while size > 6 and right - left > 0.95 * w:  # shrink a long word until it fits
            size = max(6, int(size * 0.85))
            left, top, right, bottom = _font(size).getbbox(word)
        x = int(rng.integers(0, max(1, w - (right - left)) + 1)) - left
        y = int(rng.integers(0, max(1, h - (bottom - top)) + 1)) - top
        dark = bool(rng.random() < 0.5)
        return {
            "word": word,
            "size": size,
            "x": x,
            "y": y,
            "fill": [0, 0, 0] if dark else [255, 255, 255],
            "stroke": [255, 255, 255] if dark else [0, 0, 0],
            "stroke_width": max(1, size // 12),
            "opacity": opacity,
        }

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        h, w = item.shape[:2]
        layer = Image.new("RGBA", (w, h), (0, 0, 0, 0))
        ImageDraw.Draw(layer).text(
            (params["x"], params["y"]),
            params["word"],
            font=_font(int(params["size"])),
            fill=(*params["fill"], 255),
            stroke_width=int(params["stroke_width"]),
            stroke_fill=(*params["stroke"], 255),
        )
        result: ImageArray = item.copy()
        box = layer.getbbox()  # where the word's alpha is not zero; outside it the blend is the image
        if box is None:
            return result
        left, top, right, bottom = box
        rgba = np.asarray(layer.crop(box), dtype=np.float32)
        alpha = rgba[..., 3:] * np.float32(float(params["opacity"]) / 255.0)
        out = item[top:bottom, left:right].astype(np.float32) * (1 - alpha) + rgba[..., :3] * alpha
        result[top:bottom, left:right] = np.clip(np.rint(out), 0, 255).astype(np.uint8)
        return result
