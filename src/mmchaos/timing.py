"""Model time: how long the model was busy, counted once however many calls overlapped.

A check's model calls run on its own thread, on the reference server's worker threads and in
worker processes, often at the same time. Summing call durations would count two overlapping
calls twice (a thread-safety check could show more model time than wall time); the true figure is
the length of the union of the busy intervals, which :class:`ModelClock` keeps.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["ModelClock", "clock_of", "model_busy", "union_seconds"]


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by ``intervals`` (start, end), overlaps counted once."""
    total = 0.0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


class ModelClock:
    """Busy intervals of the model, on the ``time.perf_counter`` timeline of this process; thread-safe.

    ``start()``/``stop()`` bracket a call on this process's threads; :meth:`add` records an interval
    measured elsewhere (a worker process) once it is mapped onto this timeline.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._intervals: list[tuple[float, float]] = []
        self.calls = 0

    def add(self, start: float, end: float) -> None:
        with self._lock:
            self._intervals.append((start, end))
            self.calls += 1
            if len(self._intervals) > 4096:  # keep memory bounded on long serving phases
                self._compact()

    def _compact(self) -> None:
        merged: list[tuple[float, float]] = []
        for start, end in sorted(self._intervals):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        self._intervals = merged

    def time(self, start: float) -> None:
        """Record a call that started at ``start`` (``time.perf_counter()``) and ends now."""
        self.add(start, time.perf_counter())

    @property
    def seconds(self) -> float:
        with self._lock:
            return union_seconds(list(self._intervals))


def clock_of(target: Any) -> ModelClock | None:
    """The model clock of the first wrapper around ``target`` that has one (the runner's timing)."""
    for _ in range(8):
        clock = getattr(target, "clock", None)
        if isinstance(clock, ModelClock):
            return clock
        target = getattr(target, "inner", None)
        if target is None:
            return None
    return None


@contextlib.contextmanager
def model_busy(target: Any) -> Iterator[None]:
    """Count the block as model time of ``target``'s clock (if any wrapper has one).

    For model work a check does past the target's methods -- the unwrapped torch module, an ONNX
    export and its runtime session -- which the runner's timing wrapper cannot see; without it the
    harness looks slower than it is by exactly that work.
    """
    clock = clock_of(target)
    start = time.perf_counter()
    try:
        yield
    finally:
        if clock is not None:
            clock.time(start)
