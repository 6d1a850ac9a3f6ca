"""Score-based black-box attack (Square Attack, L-inf) through a target's public API only.

Andriushchenko et al. 2020: start from vertical stripes of +-eps, then repeatedly redraw one
random square window of the perturbation at +-eps per channel and keep the change when the
target's margin does not grow. It needs nothing but scores, so it runs on any target: in-process,
ONNX, PP-OCR, or an ``openai:`` endpoint over HTTP, and it is the reference that exposes gradient
masking (a white-box attack weaker than this one means the gradient lies).

Every image sent is one query, booked on a :class:`QueryBudget` before it is sent: the attack
stops where the budget ends, never past it. Perturbations are whole grey levels (``eps`` is
rounded down to k/255, at least 1/255), so what is scored is exactly what an upload carries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from mmchaos.errors import ConfigError

__all__ = ["QueryBudget", "Scorer", "SquareResult", "square_attack"]

ImageArray = npt.NDArray[np.uint8]
Scorer = Callable[[Sequence[ImageArray], Sequence[int]], npt.NDArray[np.float64]]
"""(images, their positions in the attacked list) -> per-image margin; the attack succeeds on an
image when its margin is below 0."""

_HALVINGS = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)
"""Iterations (of 10,000) at which the square's area halves, from the paper."""


@dataclass
class QueryBudget:
    """A hard cap on queries (images sent to the target); every attack books against one."""

    max_queries: int
    used: int = 0
    calls: int = 0

    def __post_init__(self) -> None:
        if self.max_queries < 1:
            raise ConfigError("a query budget needs at least one query", code="attack_bad_budget")

    @property
    def left(self) -> int:
        return self.max_queries - self.used

    def take(self, n: int) -> bool:
        """Book ``n`` queries (one call); False, and nothing booked, when they do not fit."""
        if n > self.left:
            return False
        self.used += n
        self.calls += 1
        return True


@dataclass
class SquareResult:
    """Per image: the adversarial image, its final margin, success, and queries it used."""

    images: list[ImageArray]
    margins: npt.NDArray[np.float64]
    success: npt.NDArray[np.bool_]
    queries: npt.NDArray[np.int64]
    stopped_by_budget: bool = False
    params: dict[str, Any] = field(default_factory=dict)


def _side(p: float, h: int, w: int) -> int:
    return max(1, min(h, w, round(math.sqrt(p * h * w))))


def _p_at(i: int, n_iters: int, p_init: float) -> float:
    it = int(i / max(n_iters, 1) * 10_000)
    return float(p_init / (2 ** sum(1 for k in _HALVINGS if it > k)))


def square_attack(
    scorer: Scorer,
    images: Sequence[ImageArray],
    eps: float,
    *,
    budget: QueryBudget,
    queries_per_image: int,
    seed: int,
    p_init: float = 0.1,
) -> SquareResult:
    """L-inf Square Attack on same-shape uint8 images, within ``budget`` and ``queries_per_image``."""
    if not images:
        return SquareResult([], np.zeros(0), np.zeros(0, bool), np.zeros(0, np.int64))
    shapes = {np.asarray(i).shape for i in images}
    if len(shapes) != 1:
        raise ConfigError("square_attack takes images of one shape; group them first", code="attack_mixed_shapes")
    rng = np.random.default_rng(seed)
    level = max(1, math.floor(eps * 255 + 1e-6))
    x = np.stack([np.asarray(i, dtype=np.int16) for i in images])
    n, h, w, c = x.shape
    params = {"attack": "square", "norm": "linf", "eps": eps, "eps_levels": level, "p_init": p_init,
              "queries_per_image": queries_per_image, "seed": seed}  # fmt: skip
    queries = np.zeros(n, np.int64)
    if not budget.take(n):
        clean = [np.asarray(i, np.uint8) for i in images]
        return SquareResult(clean, np.full(n, np.inf), np.zeros(n, bool), queries, True, params)
    delta = level * rng.choice(np.array([-1, 1], np.int16), size=(n, 1, w, c))
    delta = np.broadcast_to(delta, x.shape).copy()
    best = np.clip(x + delta, 0, 255)
    margins = np.asarray(scorer([b.astype(np.uint8) for b in best], list(range(n))), dtype=np.float64)
    queries += 1
    stopped = False
    n_iters = max(0, queries_per_image - 1)
    for i in range(n_iters):
        active = np.flatnonzero(margins >= 0)
        if active.size == 0:
            break
        if not budget.take(int(active.size)):
            stopped = True
            break
        s = _side(_p_at(i, n_iters, p_init), h, w)
        trial = delta[active].copy()
        for j in range(active.size):
            top, left = int(rng.integers(0, h - s + 1)), int(rng.integers(0, w - s + 1))
            signs = level * rng.choice(np.array([-1, 1], np.int16), size=(1, 1, c))
            trial[j, top : top + s, left : left + s, :] = signs
        candidate = np.clip(x[active] + trial, 0, 255)
        scores = np.asarray(scorer([b.astype(np.uint8) for b in candidate], active.tolist()), dtype=np.float64)
        queries[active] += 1
        better = scores <= margins[active]  # ties accepted: a flat score (OCR text) still moves
        keep = active[better]
        delta[keep] = trial[better]
        best[keep] = candidate[better]
        margins[keep] = scores[better]
    adv = [b.astype(np.uint8) for b in best]
    return SquareResult(adv, margins, margins < 0, queries, stopped, params)
