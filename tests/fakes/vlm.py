"""Honest fake generative targets: they answer questions about the shapes images from the pixels.

Not mocks: each segments the image (background from the border colour), names the shape's colour
(nearest of the palette), its shape (how much of its bounding box it fills), its position (the
centroid's third of the image) and counts connected blobs, then answers the question it
recognises by keyword. So a task that scores them is scoring real answers, perturbations really
degrade them, and a blank image really holds nothing for them. Deliberately broken variants:
one reads a single pixel (noise wrecks it), one names a colour whatever the image holds, one
crashes on a request without a text part.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mmchaos.data.shapes import COLOURS
from mmchaos.targets.base import Capability, Fingerprint, Target
from mmchaos.targets.generation import Completion, GenerationParams, GenerationResult, Message, as_messages

_NUMBERS = ("zero", "one", "two", "three", "four", "five", "six")
_NAMES = list(COLOURS)
_PALETTE = np.array([COLOURS[c] for c in _NAMES], dtype=np.float64)


def question_kind(question: str) -> str | None:
    q = question.lower()
    if "how many" in q:
        return "count"
    if "where" in q:
        return "position"
    if "colour" in q or "color" in q:
        return "colour"
    if "shape" in q or "object" in q:
        return "shape"
    return None


class PixelVQATarget(Target):
    """Correct, if simple: answers colour/shape/position/count questions from the pixels."""

    uri = "py:tests.fakes.vlm:PixelVQATarget"
    capabilities = frozenset({Capability.GENERATE})
    denoise = True
    abstain_on_blank = True

    def _mask(self, img: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import cv2

        rgb = np.ascontiguousarray(img[..., :3])
        x = (cv2.medianBlur(rgb, 3) if self.denoise else rgb).astype(np.float64)
        bg = np.median(np.concatenate([x[0], x[-1], x[:, 0], x[:, -1]]), axis=0)
        dist = np.linalg.norm(x - bg, axis=2)
        if float(dist.max()) < 40.0:
            return x, np.zeros(dist.shape, bool)
        return x, dist > 0.5 * float(dist.max())

    def _colour(self, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return x[mask].mean(axis=0)

    def answer(self, img: np.ndarray | None, question: str) -> str:
        kind = question_kind(question)
        if img is None:
            return "There is no image."
        if kind is None:
            return "I do not understand the question."
        x, mask = self._mask(img)
        if not mask.any():
            if self.abstain_on_blank:
                return "zero" if kind == "count" else "none"
            mask = np.ones(mask.shape, bool)  # broken: describe the whole frame as if it were a shape
        ys, xs = np.nonzero(mask)
        if kind == "colour":
            return _NAMES[int(np.argmin(np.linalg.norm(_PALETTE - self._colour(x, mask), axis=1)))]
        if kind == "shape":
            fill = mask.sum() / ((ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1))
            return "square" if fill > 0.88 else "circle" if fill > 0.7 else "cross" if fill > 0.55 else "triangle"
        if kind == "position":
            h, w = mask.shape
            row = ("top", "middle", "bottom")[min(2, int(3 * ys.mean() / h))]
            col = ("left", "center", "right")[min(2, int(3 * xs.mean() / w))]
            return "center" if (row, col) == ("middle", "center") else f"{row} {col}"
        import cv2

        n, _, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8))
        blobs = int((stats[1:, cv2.CC_STAT_AREA] >= 12).sum()) if n > 1 else 0
        return _NUMBERS[min(blobs, len(_NUMBERS) - 1)]

    def generate(
        self,
        prompt: str | Sequence[Message],
        images: Sequence[np.ndarray] = (),
        params: GenerationParams | None = None,
    ) -> GenerationResult:
        messages = as_messages(prompt, images, max_pixels=self.max_image_pixels)
        last = messages[-1]
        pictures = last.images()
        text = " ".join(p for p in last.parts() if isinstance(p, str))
        reply = self.answer(pictures[0] if pictures else None, self._question(text))
        return GenerationResult((Completion(reply, "stop"),))

    def _question(self, text: str) -> str:
        return text if text.strip() else "Describe the image."

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(weights=f"pixel-vqa-{type(self).__name__}")


class OnePixelVQATarget(PixelVQATarget):
    """Broken: names the colour of the one pixel at the shape's centre, without denoising, so
    sensor noise flips it (clean accuracy as good as the correct target's)."""

    denoise = False

    def _colour(self, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        ys, xs = np.nonzero(mask)
        return x[int(ys.mean()), int(xs.mean())]


class HallucinatingVQATarget(PixelVQATarget):
    """Broken: never abstains: a blank image's whole frame is 'the shape', no image means red."""

    abstain_on_blank = False

    def answer(self, img: np.ndarray | None, question: str) -> str:
        if img is None:
            return "red" if question_kind(question) != "count" else "one"
        return super().answer(img, question)


class CrashOnImageOnlyTarget(PixelVQATarget):
    """Broken: takes the first text part of the turn, so a turn with only an image raises."""

    def _question(self, text: str) -> str:
        return text.split()[0] and text  # IndexError on an image-only turn
