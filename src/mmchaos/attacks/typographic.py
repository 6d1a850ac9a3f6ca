"""Typographic attack: a wrong class name written onto the image (Goh et al. 2021, "iPod" on an apple).

The words tried on each image are wrong class names of the dataset: the model's own runner-up
class first (the cheapest way across the boundary), then others drawn by the seeded generator.
Rendering is :class:`mmchaos.perturb.typographic.Typographic`'s kernel at a fixed severity, so
every attacked image replays from its recorded parameters (word, size, position, colours).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from mmchaos.perturb.typographic import Typographic

__all__ = ["attack_words", "render", "replay"]

ImageArray = npt.NDArray[np.uint8]


def attack_words(
    logits: npt.NDArray[Any], truth: int, classes: Sequence[str], count: int, rng: np.random.Generator
) -> list[str]:
    """Up to ``count`` wrong class names: the runner-up by ``logits`` first, then seeded draws."""
    order = [int(k) for k in np.argsort(-np.asarray(logits), kind="stable") if int(k) != truth]
    if not order or count <= 0:
        return []
    chosen = [order[0]]
    rest = order[1:]
    if count > 1 and rest:
        picked = rng.choice(len(rest), size=min(count - 1, len(rest)), replace=False)
        chosen += [rest[int(i)] for i in picked]
    return [classes[k] for k in chosen]


def render(image: ImageArray, word: str, severity: int, rng: np.random.Generator) -> tuple[ImageArray, dict[str, Any]]:
    """``image`` with ``word`` written on it at ``severity`` (1-5), and the parameters that replay it."""
    kernel = Typographic((word,))
    out, applied = kernel([image], severity, rng=rng)
    return out[0], dict(applied.items[0])


def replay(image: ImageArray, params: dict[str, Any]) -> ImageArray:
    """The attacked image again, from the clean one and its recorded parameters."""
    return Typographic((str(params["word"]),)).apply_batch([image], [params])[0]
