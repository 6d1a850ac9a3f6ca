"""Degraded copies of working targets, for ``mmchaos compare`` and ``validate --baseline``.

Each is what a new model version or serving change does to a deployment that worked: it still
answers, it passes most of its own gates, and it is worse than the run it replaces.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from mmchaos.targets.base import Target
from mmchaos.targets.wrappers import DelegatingTarget
from tests.fakes.targets import ShapeColourTarget


class NoDenoiseShapeColour(ShapeColourTarget):
    """Degraded: the pipeline dropped its median filter. Clean images score as before (even a little
    better), sensor noise now breaks it: only ``gaussian_noise`` regresses."""

    uri = "py:tests.fakes.degraded:no_denoise"
    denoise = False


class NoisyImageEmbeddings(DelegatingTarget):
    """Degraded: seeded noise on every image embedding, ``sigma`` times the embedding's RMS (a lossy
    quantisation, a flaky kernel). The noise is seeded by the image bytes, so runs repeat exactly."""

    def __init__(self, inner: Target, sigma: float) -> None:
        super().__init__(inner)
        self.sigma = sigma

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        clean = np.asarray(self.inner.embed_images(images), dtype=np.float32)
        out = []
        for img, vec in zip(images, clean, strict=True):
            digest = hashlib.blake2b(np.ascontiguousarray(img).tobytes(), digest_size=8).digest()
            noise = np.random.default_rng(int.from_bytes(digest, "little")).standard_normal(vec.shape)
            out.append(vec + self.sigma * float(np.linalg.norm(vec)) / np.sqrt(vec.size) * noise.astype(np.float32))
        return np.stack(out)


def shape_colour() -> Target:
    return ShapeColourTarget()


def no_denoise() -> Target:
    return NoDenoiseShapeColour()


def tiny_clip_noisy(sigma: float = 1.0) -> Target:
    """builtin:tiny-clip with noise on its image embeddings (its texts are untouched)."""
    from mmchaos.targets import load_target

    return NoisyImageEmbeddings(load_target("builtin:tiny-clip"), sigma)
