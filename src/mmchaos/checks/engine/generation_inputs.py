"""Shared inputs and comparisons of the generation checks (no check lives here).

Probe images come from the run's dataset when it has images, else they are seeded noise, so a
generation check runs on any data. Two completions are "the same answer" when their tokens agree
and, where the backend gives them, their per-token logprobs too: a tiny or untrained model often
picks the same greedy tokens for different images, but its log-probabilities still move with the
pixels, while a cached answer repeats them bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from mmchaos.checks.base import CheckContext
from mmchaos.targets.generation import Completion, GenerationResult, Message

__all__ = ["answer_key", "first_divergence", "probe_images", "probe_requests", "result_signature", "same_answer"]

_PROBE_QUESTIONS = (
    "What colour is the shape?",
    "What shape is it?",
    "Where is the shape?",
    "How many shapes are there?",
)


def probe_images(ctx: CheckContext, n: int, stream: str = "images") -> list[npt.NDArray[np.uint8]]:
    """``n`` pairwise-different RGB images: the dataset's first ones, topped up with seeded noise."""
    out: list[npt.NDArray[np.uint8]] = []
    seen: set[bytes] = set()
    data = ctx.dataset
    if data.has_images:
        for sample in data.head(4 * n):
            if len(out) == n:
                break
            image = np.ascontiguousarray(sample.load_image(), dtype=np.uint8)
            if image.ndim == 3 and image.shape[2] == 3 and image.tobytes() not in seen:
                seen.add(image.tobytes())
                out.append(image)
    rng = ctx.rng(stream)
    while len(out) < n:
        out.append(rng.integers(0, 256, (48, 56, 3), dtype=np.uint8))
    return out


def probe_requests(ctx: CheckContext, n: int) -> tuple[list[list[Message]], list[str]]:
    """``n`` one-turn requests (an image and a question) and their labels: the dataset's own images
    and questions where it has both, else :func:`probe_images` with questions about the shapes."""
    data = ctx.dataset.head(n)
    if len(data) == n and data.has_images and data.has_questions:
        return [[Message("user", (s.load_image(), s.question or ""))] for s in data], [s.id for s in data]
    images = probe_images(ctx, n, "requests")
    requests = [[Message("user", (img, _PROBE_QUESTIONS[i % len(_PROBE_QUESTIONS)]))] for i, img in enumerate(images)]
    return requests, [f"probe-{i}" for i in range(n)]


def result_signature(result: GenerationResult) -> str:
    """A result as one comparable string: each completion's text, token ids and finish reason."""
    return "\n".join(f"{c.text!r} {c.token_ids} {c.finish_reason}" for c in result.completions)


def answer_key(c: Completion) -> tuple[Any, ...]:
    """What identifies an answer: its tokens (or text) and its logprobs where given."""
    tokens: Any = c.token_ids if c.token_ids is not None else c.text
    return (tokens, c.logprobs)


def same_answer(a: Completion, b: Completion, logprob_tolerance: float = 0.0) -> bool:
    """Same tokens (text when a backend gives no tokens) and, when both carry them, logprobs
    within ``logprob_tolerance``."""
    if (a.token_ids if a.token_ids is not None else a.text) != (b.token_ids if b.token_ids is not None else b.text):
        return False
    if a.logprobs is None or b.logprobs is None:
        return True
    if len(a.logprobs) != len(b.logprobs):
        return False
    return bool(np.all(np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs)) <= logprob_tolerance))


def first_divergence(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
