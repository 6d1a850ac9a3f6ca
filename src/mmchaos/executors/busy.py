"""A target wrapper that records when its model was busy, for units that run away from the runner.

The runner's :class:`~mmchaos.runner.TimedTarget` sees only calls made in its own process. A unit
run on a Ray actor or on a forked worker calls the model there; :class:`BusyTarget` keeps those
calls' intervals so they travel back with the unit's result and join the check's model clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from mmchaos.targets.wrappers import DelegatingTarget

__all__ = ["Busy", "BusyTarget"]

R = TypeVar("R")

Busy = list[tuple[float, float]]
"""Model calls of one unit as (start, end) on the wrapper's clock."""


class BusyTarget(DelegatingTarget):
    """``inner`` with each model call's (start, end) appended to :attr:`busy`, timed by ``now``:
    ``time.time`` where the driver is another machine (a Ray actor), ``time.perf_counter`` on this
    one (Linux's monotonic clock is one timeline for every process)."""

    def __init__(self, inner: Any, now: Callable[[], float] = time.time) -> None:
        super().__init__(inner)
        self.busy: Busy = []
        self._now = now

    def call(self, fn: Callable[..., R], *args: Any) -> R:
        start = self._now()
        try:
            return fn(*args)
        finally:
            self.busy.append((start, self._now()))

    def take(self) -> Busy:
        """The intervals recorded since the last ``take`` (a unit's own calls)."""
        busy, self.busy = self.busy, []
        return busy
