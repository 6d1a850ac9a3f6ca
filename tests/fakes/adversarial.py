"""Targets for the step-3 checks: fragile ones that an attack breaks, and their correct twins.

* :class:`NormalisingTextTarget` (correct for the text attack): the shapes stand-in of
  :mod:`tests.fakes.targets` whose text side folds confusables back to Latin (NFKC plus the homoglyph
  table reversed), corrects each word to the vocabulary word one edit away, and keys on the content
  words (colours and shapes) only. Its fragile twin is :class:`tests.fakes.targets.ShapeColourTarget`,
  whose bag of hashed words turns one typo into an unrelated vector.
* :func:`reads_text` (fragile for the typographic attack): the real tiny-clip behind a reader
  that finds a class name written on the image (template matching against the glyphs Pillow
  renders) and lets it outvote the picture, which is CLIP's failure mode. Its twin is tiny-clip.
* :func:`checker_gain` (fragile for the semantic margin): tiny-clip whose patch embedding
  also reacts, with a large gain, to the pixel checkerboard pattern -- a non-robust feature that
  clean images barely excite but that a tiny pixel change drives. Its twin is tiny-clip.
* :class:`RecordingClock`: a model clock that tells whether some model work ran inside a model call.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmchaos.data.shapes import COLOURS, SHAPES
from mmchaos.perturb.text import HOMOGLYPHS
from mmchaos.timing import ModelClock
from tests.fakes.targets import DIM, ShapeColourTarget, _text_vector

_UNCONFUSE = {v: k for k, v in HOMOGLYPHS.items()}
CONTENT = tuple(COLOURS) + tuple(SHAPES)


def _within_one_edit(a: str, b: str) -> bool:
    """Levenshtein distance <= 1 (one substitution, insertion or deletion)."""
    if a == b:
        return True
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    return any(long_[:i] + long_[i + 1 :] == short for i in range(len(long_)))


def normalise_word(word: str) -> str | None:
    """The content word ``word`` means (confusables folded, one typo corrected), or None."""
    folded = "".join(_UNCONFUSE.get(ch, ch) for ch in unicodedata.normalize("NFKC", word)).lower().strip(".,;:!?")
    if folded in CONTENT:
        return folded
    near = [w for w in CONTENT if len(folded) >= 3 and _within_one_edit(folded, w)]
    return near[0] if len(near) == 1 else None


class NormalisingTextTarget(ShapeColourTarget):
    """Correct for the text attack: normalises confusables and typos, embeds the content words."""

    uri = "py:tests.fakes.adversarial:NormalisingTextTarget"

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        out = []
        for t in texts:
            words = [w for w in (normalise_word(x) for x in t.split()) if w]
            out.append(sum((_text_vector(w) for w in words), np.full(DIM, 0.01)))
        return np.stack(out).astype(np.float32)


# -- typographic: a model that reads -----------------------------------------------------------------


def _template(word: str, size: int, dark: bool) -> np.ndarray:
    from PIL import Image, ImageDraw

    from mmchaos.perturb.typographic import _font

    font = _font(size)
    left, top, right, bottom = font.getbbox(word)
    stroke = max(1, size // 12)
    img = Image.new("L", (right - left + 2 * stroke + 2, bottom - top + 2 * stroke + 2), 128)
    ImageDraw.Draw(img).text(
        (stroke + 1 - left, stroke + 1 - top), word, font=font, fill=0 if dark else 255,
        stroke_width=stroke, stroke_fill=255 if dark else 0,
    )  # fmt: skip
    return np.asarray(img)


class TextReader:
    """Finds which of ``words`` is written on an image: normalised cross-correlation with rendered glyphs."""

    SIZES = (6, 7, 9, 11, 13)
    """The sizes the typographic kernel writes at severity 3 on 64-pixel images (its shrink-to-fit steps)."""

    def __init__(self, words: Sequence[str], sizes: Sequence[int] = SIZES, threshold: float = 0.6) -> None:
        self.words = list(words)
        self.threshold = threshold
        self.templates = [(w, _template(w, s, d)) for w in self.words for s in sizes for d in (True, False)]

    def read(self, image: np.ndarray) -> str | None:
        import cv2

        cv2.setNumThreads(1)
        gray = cv2.cvtColor(np.ascontiguousarray(image[..., :3]), cv2.COLOR_RGB2GRAY)
        best, found = self.threshold, None
        for word, tpl in self.templates:
            if tpl.shape[0] > gray.shape[0] or tpl.shape[1] > gray.shape[1]:
                continue
            score = float(cv2.matchTemplate(gray, tpl, cv2.TM_CCOEFF_NORMED).max())
            if score > best:
                best, found = score, word
        return found


def reads_text(model_dir: Path, classes: Sequence[str], template: str = "a photo of a {}.") -> Any:
    """Fragile: tiny-clip whose image embedding becomes the written class's prompt when it reads one."""
    from mmchaos.targets.hf import HFContrastiveTarget

    class ReadsText(HFContrastiveTarget):
        reader = TextReader(classes)

        def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
            out = np.array(super().embed_images(images), copy=True)
            for i, img in enumerate(images):
                word = self.reader.read(img)
                if word is not None:
                    out[i] = self.embed_texts([template.format(word)])[0]
            return out

    return ReadsText(str(model_dir), uri="py:tests.fakes.adversarial:reads_text")


def checker_gain(model_dir: Path, gain: float = 3.0, channels: int = 8) -> Any:
    """Fragile: tiny-clip with a high-gain checkerboard detector added to its patch embedding."""
    import torch

    from mmchaos.targets.hf import HFContrastiveTarget

    target = HFContrastiveTarget(str(model_dir), uri="py:tests.fakes.adversarial:checker_gain")
    conv = target.model.vision_model.embeddings.patch_embedding
    k = conv.weight.shape[-1]
    checker = torch.tensor([[(-1.0) ** (i + j) for j in range(k)] for i in range(k)])
    with torch.no_grad():
        conv.weight[:channels] += gain * checker
    return target


# -- model time: a clock that keeps every interval it was given -----------------------------------


class RecordingClock(ModelClock):
    """The runner's model clock, keeping each interval: was a piece of model work inside a model call?"""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[tuple[float, float]] = []

    def add(self, start: float, end: float) -> None:
        self.spans.append((start, end))
        super().add(start, end)

    def uncounted(self, work: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
        """The intervals of ``work`` that no model call of this clock covers."""
        return [w for w in work if not any(s <= w[0] and w[1] <= e for s, e in self.spans)]
