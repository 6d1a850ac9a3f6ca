"""Colour readers for the occlusion attack: one that uses the whole object, one that uses one pixel.

Numpy models, not mocks, over the shapes images labelled by colour alone (:func:`colour_data`), so
the shape's outline plays no part. :class:`ColourVoteTarget` (correct) lets every pixel of the
object vote for its nearest palette colour, so covering some cells of the object leaves the rest to
answer. :class:`WatermarkTarget` (broken: a shortcut) reads a small mark of the label's colour that
:func:`watermarked_data` puts in a corner, a spurious cue: occlusion sensitivity finds the corner
cell, covering it flips every answer, and random cells of the same area rarely hit it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mmchaos.data.base import Dataset, Sample
from mmchaos.data.shapes import COLOURS, make_shapes
from tests.fakes.targets import ShapeColourTarget, _text_vector

_NAMES = list(COLOURS)
_PALETTE = np.array([COLOURS[c] for c in _NAMES], dtype=np.float64)


def colour_data(n: int) -> Dataset:
    """``n`` shapes images whose label is the object's colour."""
    shapes = make_shapes(n)
    samples = [Sample(id=s.id, image=s.image, caption=s.caption, label=s.meta["colour"], meta=s.meta) for s in shapes]
    return Dataset(name="shape-colours", samples=samples, classes=list(_NAMES),
                   prompt_template="a photo of something {}.", source=f"shape-colours?n={n}")  # fmt: skip


def _object(img: np.ndarray, threshold: float = 60.0) -> tuple[np.ndarray, np.ndarray]:
    x = img[..., :3].astype(np.float64)
    bg = np.median(np.concatenate([x[0], x[-1], x[:, 0], x[:, -1]]), axis=0)
    return x, np.linalg.norm(x - bg, axis=2) > threshold


class ColourVoteTarget(ShapeColourTarget):
    """Correct: every object pixel near a palette colour votes; the most voted colour is the answer."""

    uri = "py:tests.fakes.occlusion:ColourVoteTarget"

    def colour(self, img: np.ndarray) -> str:
        x, mask = _object(img)
        dist = np.linalg.norm(x[mask][:, None, :] - _PALETTE[None], axis=2)
        near = dist.min(axis=1) < 80.0
        if not near.any():
            return "nothing"
        return _NAMES[int(np.bincount(dist[near].argmin(axis=1), minlength=len(_NAMES)).argmax())]

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return np.stack([_text_vector(self.colour(i)) for i in images]).astype(np.float32)


def watermarked_data(n: int) -> Dataset:
    """:func:`colour_data` with a 6x6 mark of the label's colour in the top-left corner: a spurious
    cue, like the hospital tokens in the X-rays a shortcut-learning model reads."""
    data = colour_data(n)
    for s in data.samples:
        assert s.image is not None and s.label is not None
        image = s.image.copy()
        image[1:7, 1:7] = COLOURS[s.label]
        object.__setattr__(s, "image", image)
    return data


class WatermarkTarget(ColourVoteTarget):
    """Broken (a shortcut): answers with the colour of the corner mark, never looking at the object."""

    uri = "py:tests.fakes.occlusion:WatermarkTarget"

    def colour(self, img: np.ndarray) -> str:
        pixel = img[3, 3, :3].astype(np.float64)
        return _NAMES[int(np.linalg.norm(_PALETTE - pixel, axis=1).argmin())]
