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

    uri = "py:tests.fakes:hash_embed"
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
