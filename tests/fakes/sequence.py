"""Honest fake VLMs for the frames and grounding tasks: they answer from the pixels of every image.

Not mocks: the frames fake names each frame's colour and shape with the pixel VQA fake's code and
answers which frame / how many frames / the colour at frame k; the grounding fake finds a colour's
pixels for a box and reads the colour inside a given box. Deliberately broken variants: one looks
at the first image of a request only (a server that drops the rest), one answers boxes in the
coordinates of a 1.5x-resized image (the off-by-a-resize bug).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from mmchaos.data.shapes import COLOURS
from mmchaos.targets.base import Capability, Fingerprint, Target
from mmchaos.targets.generation import Completion, GenerationParams, GenerationResult, Message, as_messages
from tests.fakes.vlm import PixelVQATarget

_NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight")
_NAMES = list(COLOURS)
_PALETTE = np.array([COLOURS[c] for c in _NAMES], dtype=np.float64)


class _Fake(Target):
    capabilities = frozenset({Capability.GENERATE})

    def generate(
        self,
        prompt: str | Sequence[Message],
        images: Sequence[np.ndarray] = (),
        params: GenerationParams | None = None,
    ) -> GenerationResult:
        messages = as_messages(prompt, images, max_pixels=self.max_image_pixels)
        last = messages[-1]
        text = " ".join(p for p in last.parts() if isinstance(p, str))
        return GenerationResult((Completion(self.answer(list(last.images()), text), "stop"),))

    def answer(self, images: list[np.ndarray], question: str) -> str:
        raise NotImplementedError

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(weights=f"fake-{type(self).__name__}")


class FramesPixelTarget(_Fake):
    """Correct: reads every frame's colour and shape from its pixels."""

    uri = "py:tests.fakes.sequence:FramesPixelTarget"
    reader = PixelVQATarget()

    def frames_seen(self, images: list[np.ndarray]) -> list[np.ndarray]:
        return images

    def answer(self, images: list[np.ndarray], question: str) -> str:
        seen = self.frames_seen(images)
        read = self.reader.answer
        described = [(read(f, "What colour is it?"), read(f, "What shape is it?")) for f in seen]
        q = question.lower()
        if m := re.search(r"which frame shows the (\w+) (\w+)", q):
            hits = [i + 1 for i, d in enumerate(described) if d == (m.group(1), m.group(2))]
            return _NUMBERS[hits[0]] if hits else "none"
        if m := re.search(r"how many frames show an? (\w+)", q):
            return _NUMBERS[sum(1 for _, s in described if s == m.group(1))]
        if m := re.search(r"shape in frame (\d+)", q):
            k = int(m.group(1)) - 1
            return described[k][0] if k < len(described) else "none"
        return "I do not understand the question."


class FirstFrameOnlyTarget(FramesPixelTarget):
    """Broken: sees only the first image of a request (the rest are dropped on the way)."""

    uri = "py:tests.fakes.sequence:FirstFrameOnlyTarget"

    def frames_seen(self, images: list[np.ndarray]) -> list[np.ndarray]:
        return images[:1]


def _nearest(x: np.ndarray) -> np.ndarray:
    return np.asarray(np.argmin(np.linalg.norm(x[..., None, :] - _PALETTE, axis=-1), axis=-1))


class GroundingPixelTarget(_Fake):
    """Correct: boxes a colour's pixels; names the colour of the shape inside a given box."""

    uri = "py:tests.fakes.sequence:GroundingPixelTarget"
    scale = 1.0

    def answer(self, images: list[np.ndarray], question: str) -> str:
        if not images:
            return "There is no image."
        x = images[0][..., :3].astype(np.float64)
        bg = np.median(np.concatenate([x[0], x[-1], x[:, 0], x[:, -1]]), axis=0)
        shape_px = np.linalg.norm(x - bg, axis=2) > 40.0
        nearest = _nearest(x)
        q = question.lower()
        if m := re.search(r"where is the (\w+) (\w+)", q):
            if m.group(1) not in _NAMES:
                return "none"
            # close to the colour itself: anti-aliased edges of other shapes are nearest to it at times
            mask = shape_px & (np.linalg.norm(x - _PALETTE[_NAMES.index(m.group(1))], axis=2) < 45.0)
            if not mask.any():
                return "none"
            ys, xs = np.nonzero(mask)
            box = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
            return "[" + ",".join(str(round(float(v) * self.scale)) for v in box) + "]"
        if m := re.search(r"in the box \[(-?\d+),(-?\d+),(-?\d+),(-?\d+)\]", q):
            h, w = shape_px.shape
            x0, y0, x1, y1 = (int(v) for v in m.groups())
            x0, x1 = max(0, min(x0, w)), max(0, min(x1, w))
            y0, y1 = max(0, min(y0, h)), max(0, min(y1, h))
            inside = nearest[y0:y1, x0:x1][shape_px[y0:y1, x0:x1]]
            if inside.size == 0:
                return "none"
            return _NAMES[int(np.bincount(inside, minlength=len(_NAMES)).argmax())]
        return "I do not understand the question."


class ResizedBoxTarget(GroundingPixelTarget):
    """Broken: answers boxes in the coordinates of the image resized 1.5x (never mapped back)."""

    uri = "py:tests.fakes.sequence:ResizedBoxTarget"
    scale = 1.5
