"""The built-in ``vqa`` dataset: questions about the ``shapes`` images, with their short answers.

Four kinds of question: the colour, the shape and the position of a single shape (the images of
``builtin:shapes``), and how many shapes a composed image holds (1-4, one per quadrant). A share
of the images holds no shape at all (only the background): there the right answer is ``none``
(``zero`` for counting), so a model that answers "red" about an empty image is wrong, not lucky.

Deterministic by (seed, split, index), like ``shapes``: sample ``i`` is the same whatever ``n``
is, and the splits never share a random stream. ``builtin:tiny-vlm`` was trained on ``train``;
evaluation uses ``test``.
"""

from __future__ import annotations

import numpy as np

from mmchaos.data.base import Dataset, Sample
from mmchaos.data.shapes import BACKGROUNDS, COLOURS, SHAPES, make_sample, render_shape

__all__ = [
    "ANSWERS",
    "KINDS",
    "NONE_ANSWERS",
    "NUMBERS",
    "QUESTIONS",
    "known_answer_samples",
    "make_vqa",
    "make_vqa_sample",
]

QUESTIONS: dict[str, tuple[str, ...]] = {
    "colour": ("What colour is the shape?", "Which colour is it?", "What is the colour of the object?"),
    "shape": ("What shape is it?", "Which shape is shown?", "What is the object?"),
    "position": ("Where is the shape?", "Where in the image is the object?"),
    "count": ("How many shapes are there?", "How many objects do you see?"),
}
KINDS = tuple(QUESTIONS)
NUMBERS = ("one", "two", "three", "four")
POSITIONS = tuple(
    "center" if (r, c) == ("middle", "center") else f"{r} {c}"
    for r in ("top", "middle", "bottom")
    for c in ("left", "center", "right")
)
ANSWERS: dict[str, tuple[str, ...]] = {
    "colour": tuple(COLOURS),
    "shape": SHAPES,
    "position": POSITIONS,
    "count": NUMBERS,
}
"""The answers a shape-bearing image can have, per kind (the vocabulary of a hallucination)."""
NONE_ANSWERS: dict[str, str] = {"colour": "none", "shape": "none", "position": "none", "count": "zero"}
"""The right answer about an image that holds no shape."""

_SPLIT_CODE = {"train": 0, "test": 1, "val": 2}
_EMPTY_SHARE = 0.08


def _background(rng: np.random.Generator, size: int) -> tuple[np.ndarray, tuple[int, int, int]]:
    bg = BACKGROUNDS[list(BACKGROUNDS)[int(rng.integers(len(BACKGROUNDS)))]]
    texture = float(rng.uniform(0.0, 6.0))
    image = np.empty((size, size, 3), np.float32)
    image[:] = bg
    image += rng.normal(0.0, texture, size=image.shape).astype(np.float32)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8), bg


def _counting_image(rng: np.random.Generator, size: int) -> tuple[np.ndarray, int]:
    """1-4 shapes, one per quadrant of a shared background."""
    image, bg = _background(rng, size)
    n = int(rng.integers(1, 5))
    half = size // 2
    for q in rng.choice(4, size=n, replace=False):
        colour = COLOURS[list(COLOURS)[int(rng.integers(len(COLOURS)))]]
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        tile = render_shape(shape, colour, bg, float(rng.uniform(0.55, 0.75)), (0.5, 0.5), half, 0.0, rng)
        r, c = divmod(int(q), 2)
        image[r * half : (r + 1) * half, c * half : (c + 1) * half] = tile
    return image, n


def _alternatives(kind: str, answer: str) -> list[str]:
    """Other spellings a grader accepts (the normaliser handles digits, case and articles)."""
    if kind == "position" and answer == "center":
        return ["center", "middle", "middle center"]
    if answer == "none":
        return ["none", "nothing", "no shape"]
    return [answer]


def make_vqa_sample(seed: int, split: str, index: int, image_size: int = 64) -> Sample:
    """Sample ``index`` of ``split``: an image, one question about it and its short answer."""
    rng = np.random.default_rng([seed, 7, _SPLIT_CODE[split], index])
    kind = KINDS[int(rng.integers(len(KINDS)))]
    question = QUESTIONS[kind][int(rng.integers(len(QUESTIONS[kind])))]
    empty = bool(rng.random() < _EMPTY_SHARE)
    meta: dict[str, object] = {"kind": kind, "empty": empty}
    if empty:
        image, _ = _background(rng, image_size)
        answer = NONE_ANSWERS[kind]
    elif kind == "count":
        image, n = _counting_image(rng, image_size)
        answer = NUMBERS[n - 1]
    else:
        shape_sample = make_sample(seed, split, index, image_size)
        image = shape_sample.load_image()
        answer = str(shape_sample.meta[kind])
        meta.update(shape_sample.meta)
    meta["answers"] = _alternatives(kind, answer)
    return Sample(id=f"vqa-{split}-{index}", image=image, question=question, answer=answer, meta=meta)


def known_answer_samples(
    n: int, kind: str, *, seed: int = 0, split: str = "test", skip: frozenset[str] = frozenset()
) -> list[Sample]:
    """``n`` single-shape images (medium-sized: unambiguous for any model that reads images) whose
    right answers to a ``kind`` question are pairwise different and not in ``skip``; each sample
    carries every kind's answer in ``meta`` (``count`` is ``one``), with the spellings a grader
    accepts in ``meta["answers_by_kind"]``. Deterministic by (seed, split).

    What a black-box probe asks when it must score answers against the truth, not only against
    each other. At most ``len(ANSWERS[kind])`` are possible.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    room = 1 if kind == "count" else len(set(ANSWERS[kind]) - skip)  # a single shape is always "one"
    if n > room:
        raise ValueError(f"at most {room} different {kind} answers, asked for {n}")
    out: list[Sample] = []
    seen = set(skip)
    index = 0
    while len(out) < n and index < 10_000:
        s = make_sample(seed, split, index)
        index += 1
        answer = "one" if kind == "count" else str(s.meta[kind])
        if s.meta["size"] != "medium" or answer in seen:
            continue
        seen.add(answer)
        s.meta = {**s.meta, "count": "one", "kind": kind}
        s.question, s.answer = QUESTIONS[kind][0], answer
        s.meta["answers"] = _alternatives(kind, answer)
        s.meta["answers_by_kind"] = {k: _alternatives(k, str(s.meta[k])) for k in KINDS}
        out.append(s)
    if len(out) < n:
        raise ValueError(f"found {len(out)} of {n} images with different {kind} answers")
    return out


def make_vqa(n: int = 200, seed: int = 0, split: str = "test", image_size: int = 64) -> Dataset:
    """Generate ``n`` question-answer samples of the ``vqa`` dataset for ``split``."""
    if split not in _SPLIT_CODE:
        raise ValueError(f"split must be one of {sorted(_SPLIT_CODE)}, got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return Dataset(
        name="vqa",
        samples=[make_vqa_sample(seed, split, i, image_size) for i in range(n)],
        source=f"builtin:vqa?split={split}&seed={seed}&n={n}",
    )
