"""Small honest targets for testing checks: a correct one, and deliberately broken ones.

They are numpy models, not mocks: each computes real embeddings from its input, so a check that
passes the correct one and fails a broken one is measuring the behaviour it claims to.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from mmchaos.targets.base import Capability, Fingerprint, Target

DIM = 32


def _text_vector(word: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).normal(size=DIM)


class HashEmbedTarget(Target):
    """Correct reference: per-item image features (colour statistics) and bag-of-words texts."""

    uri = "py:tests.fakes.targets:hash_embed"
    capabilities = frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT})

    def __init__(self) -> None:
        self._proj = np.random.default_rng(0).normal(size=(12, DIM))

    def _image(self, img: np.ndarray) -> np.ndarray:
        x = img.astype(np.float64) / 255.0
        h, w = x.shape[:2]
        quads = [x[: h // 2, : w // 2], x[: h // 2, w // 2 :], x[h // 2 :, : w // 2], x[h // 2 :, w // 2 :]]
        feats = np.concatenate([q.reshape(-1, x.shape[2]).mean(axis=0) for q in quads]) + 0.1
        return feats @ self._proj

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return np.stack([self._image(i) for i in images]).astype(np.float32)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        out = [sum((_text_vector(w) for w in t.lower().split()), np.full(DIM, 0.1)) for t in texts]
        return np.stack(out).astype(np.float32)

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(weights="hash-embed-v1")


class PaddingLeakTarget(HashEmbedTarget):
    """Broken: text outputs depend on the batch's longest text (padding tokens pooled unmasked)."""

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        clean = super().embed_texts(texts)
        longest = max(len(t.split()) for t in texts)
        pads = np.array([longest - len(t.split()) for t in texts], dtype=np.float32)[:, None]
        return clean + 0.05 * pads * _text_vector("<pad>").astype(np.float32)


class NaNOnUniformTarget(HashEmbedTarget):
    """Broken: per-image contrast normalisation divides by a zero standard deviation."""

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            std = np.array([i.astype(np.float64).std() for i in images])[:, None]
            return (super().embed_images(images) * (std / std)).astype(np.float32)


class CrashOnEmptyTextTarget(HashEmbedTarget):
    """Broken: pools the first token, so an empty text raises IndexError."""

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([_text_vector(t.split()[0]) for t in texts]).astype(np.float32)


class SlowTarget(HashEmbedTarget):
    """Correct but slow, so a test can kill a run while a check is in progress."""

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        time.sleep(float(os.environ.get("MMCHAOS_TEST_DELAY", "0.05")))
        return super().embed_texts(texts)


class DuckTarget:
    """Not a Target subclass: implements the interface by duck typing (capabilities as strings)."""

    capabilities = ("embed_text",)

    def fingerprint(self) -> dict[str, Any]:
        return {"weights": "duck"}

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        return HashEmbedTarget().embed_texts(texts)


def hash_embed() -> Target:
    return HashEmbedTarget()


def padding_leak() -> Target:
    return PaddingLeakTarget()


def slow() -> Target:
    return SlowTarget()


def duck() -> DuckTarget:
    return DuckTarget()


def not_a_target() -> object:
    return object()


class ShapeColourTarget(Target):
    """Correct, if simple: a classical-vision CLIP stand-in that actually recognises the shapes data.

    Images: median-filter (denoise), segment the shape from the border's colour, name its mean
    colour (nearest of the shapes palette) and its shape (how much of its bounding box it fills);
    the embedding is the sum of those two words' vectors. Texts: bag of words. So the class
    prompt "a photo of a red circle." is closest to a red circle's image, and captions retrieve
    their images. About 70% zero-shot accuracy on builtin:shapes, robust to sensor noise.
    """

    uri = "py:tests.fakes.targets:ShapeColourTarget"
    capabilities = frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT})
    denoise = True

    def __init__(self) -> None:
        from mmchaos.data.shapes import COLOURS

        self._names = list(COLOURS)
        self._palette = np.array([COLOURS[c] for c in self._names], dtype=np.float64)

    def classify(self, img: np.ndarray) -> tuple[str, str]:
        import cv2

        rgb = np.ascontiguousarray(img[..., :3]) if img.ndim == 3 else np.repeat(img[..., None], 3, axis=2)
        x = (cv2.medianBlur(rgb, 5) if self.denoise else rgb).astype(np.float64)
        bg = np.median(np.concatenate([x[0], x[-1], x[:, 0], x[:, -1]]), axis=0)
        dist = np.linalg.norm(x - bg, axis=2)
        mask = dist > 0.5 * max(float(dist.max()), 1e-6)
        ys, xs = np.nonzero(mask)
        if not len(ys):  # a blank image: nothing to recognise
            return "nothing", "nothing"
        colour = self._colour(x, mask, ys, xs)
        name = self._names[int(np.argmin(np.linalg.norm(self._palette - colour, axis=1)))]
        fill = mask.sum() / ((ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1))
        shape = "square" if fill > 0.88 else "circle" if fill > 0.7 else "cross" if fill > 0.55 else "triangle"
        return name, shape

    def _colour(self, x: np.ndarray, mask: np.ndarray, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
        return x[mask].mean(axis=0)

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return np.stack([sum(_text_vector(w) for w in self.classify(i)) for i in images]).astype(np.float32)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        words = [[w.strip(".,;:!?") for w in t.lower().split()] for t in texts]
        return np.stack([sum((_text_vector(w) for w in ws if w), np.full(DIM, 0.01)) for ws in words]).astype(
            np.float32
        )

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(weights="shape-colour-v1")


class OnePixelColourTarget(ShapeColourTarget):
    """Broken: reads the colour of the one pixel at the shape's centre, without denoising.

    Clean images are fine (more accurate than the correct target, even), but sensor noise flips
    the colour of single pixels, so noise perturbations wreck it: the robustness check must fail it.
    """

    uri = "py:tests.fakes.targets:OnePixelColourTarget"
    denoise = False

    def _colour(self, x: np.ndarray, mask: np.ndarray, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
        return x[int(ys.mean()), int(xs.mean())]


class FlakyEndpointTarget(ShapeColourTarget):
    """The shape-colour target behind a flaky proxy hop: its image-embedding calls listed in
    ``fail_calls`` (0-based, counted over the target's life) raise the ``EndpointError`` an
    upstream 500 becomes in the ``openai:`` target; ``fail_from``: every call from then on does
    (an endpoint that keeps failing)."""

    def __init__(self, fail_calls: Sequence[int] = (), fail_from: int | None = None) -> None:
        super().__init__()
        self.fail_calls = set(fail_calls)
        self.fail_from = fail_from
        self.calls = 0

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        from mmchaos.targets.openai_wire import EndpointError

        call, self.calls = self.calls, self.calls + 1
        if call in self.fail_calls or (self.fail_from is not None and call >= self.fail_from):
            raise EndpointError("POST /embeddings: HTTP 500: upstream error", code="http_500", status=500)
        return super().embed_images(images)
