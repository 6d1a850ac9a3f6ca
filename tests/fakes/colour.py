"""Colour classifiers whose adversarial robustness is known by construction, for step 3's tests.

Image features are the mean colour plus ``gain`` times the projection of the image on fixed
zero-mean block patterns (one per class). A uniform-colour image projects to exactly zero, so
clean accuracy is 1 whatever the gain; a perturbation of eps per pixel moves the projection by
up to about ``gain * eps``. ``gain=0`` is robust at every eps up to 16/255 (the mean colour moves
at most eps); ``gain=300`` flips at 1-2/255 white-box, and a few dozen queries find it at 4/255
black-box. The torch path is the same function in torch (that is its white-box access);
``masked=True`` rounds the pixels to grey levels first with ``torch.round``, whose gradient is
zero: the public answers are identical, but PGD sees no gradient (gradient masking by a
non-differentiable preprocessing step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mmchaos.attacks.preprocess import ImagePath
from mmchaos.data.base import Dataset, Sample
from mmchaos.targets.base import Capability, Fingerprint, Target

COLOURS = {"red": (200, 40, 40), "green": (40, 200, 40), "blue": (40, 40, 200)}
SIDE = 16


def colour_dataset(n: int = 12) -> Dataset:
    names = list(COLOURS)
    samples = []
    for i in range(n):
        name = names[i % 3]
        image = np.empty((SIDE, SIDE, 3), np.uint8)
        image[:] = COLOURS[name]
        samples.append(Sample(id=f"colour-{i}", image=image, label=name, caption=f"a {name} square"))
    return Dataset("colours", samples, names, "a photo of a {}.")


def _patterns() -> np.ndarray:
    """(3 classes, H, W, 3) zero-sum (per channel) block patterns of +-1/n."""
    blocks = np.array(
        [[[1, -1], [-1, 1]], [[1, 1], [-1, -1]], [[1, -1], [1, -1]]], dtype=np.float64
    )  # three orthogonal 2x2 sign layouts
    n = SIDE * SIDE * 3
    out = np.zeros((3, SIDE, SIDE, 3))
    for k in range(3):
        for c in range(3):
            layout = blocks[(k + c) % 3]
            out[k, :, :, c] = np.kron(layout, np.ones((SIDE // 2, SIDE // 2))) / n
    return out


class ColourTarget(Target):
    """Zero-shot colour classifier with a tunable adversarial weakness (see the module docstring)."""

    capabilities = frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT, Capability.TORCH_MODULE})

    def __init__(self, gain: float = 0.0, masked: bool = False) -> None:
        self.gain = gain
        self.masked = masked
        self.uri = f"py:tests.fakes.colour:colour?gain={gain}&masked={masked}"
        self.patterns = _patterns()
        self.images_seen = 0

    def _features(self, x: np.ndarray) -> np.ndarray:
        """x: (B, H, W, 3) in [0, 1]."""
        mean = x.mean(axis=(1, 2))
        proj = np.einsum("bhwc,khwc->bk", x - 0.5, self.patterns)
        return mean + self.gain * proj

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        self.images_seen += len(images)
        x = np.stack([np.asarray(i, np.float64) / 255.0 for i in images])
        return self._features(x).astype(np.float32)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([np.array([float(c in t) for c in COLOURS]) + 1e-3 for t in texts]).astype(np.float32)

    def torch_module(self) -> Any:
        import torch

        return torch.nn.Identity()

    def image_torch_path(self) -> ImagePath:
        import torch

        patterns = torch.tensor(self.patterns, dtype=torch.float32).permute(0, 3, 1, 2)  # (K, 3, H, W)

        def features(x: Any) -> Any:
            if self.masked:
                x = torch.round(x * 255.0) / 255.0  # zero gradient: the masking
            mean = x.mean(dim=(2, 3))
            proj = torch.einsum("bchw,kchw->bk", x - 0.5, patterns)
            return mean + self.gain * proj

        note = "pixels rounded to grey levels (torch.round)" if self.masked else "mean colour + block patterns"
        return ImagePath(features=features, note=note, logit_scale=100.0)

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(weights=f"colour-{self.gain}-{self.masked}")


def robust() -> Target:
    return ColourTarget(gain=0.0)


def fragile() -> Target:
    return ColourTarget(gain=300.0)


def masked() -> Target:
    return ColourTarget(gain=300.0, masked=True)
