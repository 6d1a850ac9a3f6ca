"""The built-in ``grounding`` dataset: where things are (a box) and what is in a given box.

Each image holds 2-3 shapes of different colours, one per quadrant, on a shared background (the
``shapes`` renderer). Two kinds of question:

- ``locate``: "Where is the red circle?" answered with its box ``[x0,y0,x1,y1]`` in pixels of the
  image (``meta["answer_box"]``); the ``grounding`` task scores it by IoU.
- ``region``: "What colour is the shape in the box [x0,y0,x1,y1]?" about one shape's box, which
  is the sample's input box (``meta["boxes"]``, one box) and the thing robustness's
  ``bbox_shift`` moves; the question is re-rendered from the moved box (``meta["template"]``).

``locate`` samples carry ``meta["boxes"] = []``: they give the model no box, so ``bbox_shift``
leaves them as they are. Every shape's box is in ``meta["objects"]`` for fakes and reports.
Deterministic by (seed, split, index).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mmchaos.data.base import Dataset, Sample
from mmchaos.data.shapes import BACKGROUNDS, COLOURS, SHAPES, render_shape

__all__ = ["GROUNDING_KINDS", "format_box", "make_grounding", "make_grounding_sample", "shape_box"]

GROUNDING_KINDS = ("locate", "region")
_SPLIT_CODE = {"train": 0, "test": 1, "val": 2}
LOCATE_TEMPLATE = "Where is the {colour} {shape}? Answer with its box [x0,y0,x1,y1] in pixels."
REGION_TEMPLATE = "What colour is the shape in the box {box}?"


def format_box(box: Sequence[float]) -> str:
    """A box as the text a question or an answer carries: ``[x0,y0,x1,y1]``, whole pixels."""
    return "[" + ",".join(str(round(float(v))) for v in box) + "]"


def shape_box(shape: str, size_frac: float, center: tuple[float, float], size: int) -> tuple[float, ...]:
    """The tight box of a shape drawn by :func:`~mmchaos.data.shapes.render_shape` (tile pixels)."""
    r = size_frac * size / 2
    cx, cy = center[0] * size, center[1] * size
    if shape == "square":
        s = r * 0.9
        return (cx - s, cy - s, cx + s, cy + s)
    if shape == "triangle":
        return (cx - r, cy - r, cx + r, cy + r * 0.8)
    return (cx - r, cy - r, cx + r, cy + r)


def make_grounding_sample(seed: int, split: str, index: int, image_size: int = 64) -> Sample:
    """Sample ``index`` of ``split``: an image of 2-3 shapes and one locate or region question."""
    rng = np.random.default_rng([seed, 13, _SPLIT_CODE[split], index])
    kind = GROUNDING_KINDS[int(rng.integers(len(GROUNDING_KINDS)))]
    bg = BACKGROUNDS[list(BACKGROUNDS)[int(rng.integers(len(BACKGROUNDS)))]]
    image = np.empty((image_size, image_size, 3), np.uint8)
    image[:] = bg
    half = image_size // 2
    count = int(rng.integers(2, 4))
    colours = [list(COLOURS)[int(i)] for i in rng.choice(len(COLOURS), size=count, replace=False)]
    objects: list[dict[str, object]] = []
    for q, colour in zip(rng.choice(4, size=count, replace=False), colours, strict=True):
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        frac = float(rng.uniform(0.5, 0.75))
        margin = frac / 2 + 0.04
        center = (float(rng.uniform(margin, 1 - margin)), float(rng.uniform(margin, 1 - margin)))
        tile = render_shape(shape, COLOURS[colour], bg, frac, center, half, float(rng.uniform(0.0, 4.0)), rng)
        r, c = divmod(int(q), 2)
        image[r * half : (r + 1) * half, c * half : (c + 1) * half] = tile
        x0, y0, x1, y1 = shape_box(shape, frac, center, half)
        box = [round(v, 2) for v in (x0 + c * half, y0 + r * half, x1 + c * half, y1 + r * half)]
        objects.append({"colour": colour, "shape": shape, "box": box})
    chosen = objects[int(rng.integers(count))]
    box = [float(v) for v in chosen["box"]]  # type: ignore[attr-defined]
    meta: dict[str, object] = {"kind": kind, "objects": objects}
    if kind == "locate":
        question = LOCATE_TEMPLATE.format(colour=chosen["colour"], shape=chosen["shape"])
        answer = format_box(box)
        meta.update({"answer_box": box, "boxes": []})
    else:
        question = REGION_TEMPLATE.format(box=format_box(box))
        answer = str(chosen["colour"])
        meta.update({"boxes": [box], "template": REGION_TEMPLATE, "answers": [answer]})
    return Sample(id=f"grounding-{split}-{index}", image=image, question=question, answer=answer, meta=meta)


def make_grounding(n: int = 100, seed: int = 0, split: str = "test", image_size: int = 64) -> Dataset:
    """Generate ``n`` samples of the ``grounding`` dataset for ``split``."""
    if split not in _SPLIT_CODE:
        raise ValueError(f"split must be one of {sorted(_SPLIT_CODE)}, got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return Dataset(
        name="grounding",
        samples=[make_grounding_sample(seed, split, i, image_size) for i in range(n)],
        source=f"builtin:grounding?split={split}&seed={seed}&n={n}",
    )
