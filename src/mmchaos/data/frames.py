"""The built-in ``frames`` dataset: questions about short frame sequences of the ``shapes`` images.

A sample is a clip of ``frames`` images (one shape each on a background the clip shares, like a
static camera) and one question that needs more than the first frame: which frame shows a given
coloured shape (exactly one does), how many frames show a given shape, or what colour the shape in
frame ``k`` has. The frames are in ``meta["frames"]`` (time order) and the sample has no single
``image``, so robustness's ``frame_offset`` / ``frame_drop`` perturb them and the ``frames_vqa``
task scores the answers; what each frame shows is in ``meta["frame_meta"]`` for fakes and reports.

Deterministic by (seed, split, index), like ``vqa``. Frames are numbered from one in the
questions and answers ("two", "frame 2" and "the second frame" are all accepted).
"""

from __future__ import annotations

import numpy as np

from mmchaos.data.base import Dataset, Sample
from mmchaos.data.shapes import BACKGROUNDS, COLOURS, SHAPES, render_shape
from mmchaos.data.vqa import NUMBERS

__all__ = ["FRAME_KINDS", "ORDINALS", "make_frames", "make_frames_sample"]

FRAME_KINDS = ("which_frame", "count_frames", "colour_at")
ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")
_SPLIT_CODE = {"train": 0, "test": 1, "val": 2}
_INTRO = "The images are frames 1 to {n} of a video, in order."


def _frame(
    rng: np.random.Generator, colour: str, shape: str, bg: tuple[int, int, int], size: int
) -> tuple[np.ndarray, dict[str, object]]:
    frac = float(rng.uniform(0.35, 0.5))
    margin = frac / 2 + 0.05
    cx, cy = (float(rng.uniform(margin, 1 - margin)) for _ in range(2))
    image = render_shape(shape, COLOURS[colour], bg, frac, (cx, cy), size, float(rng.uniform(0.0, 4.0)), rng)
    return image, {"colour": colour, "shape": shape}


def _number_answers(k: int) -> list[str]:
    """Spellings of frame ``k`` (1-based) a grader accepts."""
    word = NUMBERS[k - 1] if k <= len(NUMBERS) else str(k)
    return [word, f"frame {k}", f"{ORDINALS[k - 1]}", f"the {ORDINALS[k - 1]} frame", f"{ORDINALS[k - 1]} frame"]


def make_frames_sample(seed: int, split: str, index: int, frames: int = 4, image_size: int = 64) -> Sample:
    """Sample ``index`` of ``split``: ``frames`` images in time order and one question about them."""
    rng = np.random.default_rng([seed, 11, _SPLIT_CODE[split], index])
    kind = FRAME_KINDS[int(rng.integers(len(FRAME_KINDS)))]
    bg = BACKGROUNDS[list(BACKGROUNDS)[int(rng.integers(len(BACKGROUNDS)))]]
    colours, shapes = list(COLOURS), list(SHAPES)
    combos: list[tuple[str, str]] = [
        (colours[int(rng.integers(len(colours)))], shapes[int(rng.integers(len(shapes)))]) for _ in range(frames)
    ]
    intro = _INTRO.format(n=frames)
    if kind == "which_frame":
        target_at = int(rng.integers(frames))
        target = combos[target_at]
        for i in range(frames):  # exactly one frame shows the asked-for combination
            while i != target_at and combos[i] == target:
                combos[i] = (colours[int(rng.integers(len(colours)))], shapes[int(rng.integers(len(shapes)))])
        question = f"{intro} Which frame shows the {target[0]} {target[1]}?"
        answer, answers = NUMBERS[target_at], _number_answers(target_at + 1)
    elif kind == "count_frames":
        shape = shapes[int(rng.integers(len(shapes)))]
        count = sum(1 for _, s in combos if s == shape)
        question = f"{intro} How many frames show a {shape}?"
        answer = "zero" if count == 0 else NUMBERS[count - 1] if count <= len(NUMBERS) else str(count)
        answers = [answer]
    else:
        k = int(rng.integers(frames))
        question = f"{intro} What colour is the shape in frame {k + 1}?"
        answer, answers = combos[k][0], [combos[k][0]]
    rendered = [_frame(rng, c, s, bg, image_size) for c, s in combos]
    return Sample(
        id=f"frames-{split}-{index}",
        question=question,
        answer=answer,
        meta={
            "kind": kind,
            "answers": answers,
            "frames": [img for img, _ in rendered],
            "frame_meta": [m for _, m in rendered],
        },
    )


def make_frames(n: int = 100, seed: int = 0, split: str = "test", frames: int = 4, image_size: int = 64) -> Dataset:
    """Generate ``n`` samples of the ``frames`` dataset for ``split``, ``frames`` images each."""
    if split not in _SPLIT_CODE:
        raise ValueError(f"split must be one of {sorted(_SPLIT_CODE)}, got {split!r}")
    if not 2 <= frames <= len(ORDINALS):
        raise ValueError(f"frames must be in 2-{len(ORDINALS)}, got {frames}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return Dataset(
        name="frames",
        samples=[make_frames_sample(seed, split, i, frames, image_size) for i in range(n)],
        source=f"builtin:frames?split={split}&seed={seed}&n={n}&frames={frames}",
    )
