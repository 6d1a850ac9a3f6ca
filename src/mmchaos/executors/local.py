"""The in-process executor: units run one after another on the check's own target."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from mmchaos.executors.base import Executor, UnitFn, Worker

if TYPE_CHECKING:
    from mmchaos.timing import ModelClock

__all__ = ["LocalExecutor"]

S = TypeVar("S")
U = TypeVar("U")
R = TypeVar("R")


class LocalExecutor(Executor):
    """Runs each unit in this process, lazily: the next unit starts when its result is asked for,
    so a consumer that aggregates as it goes holds one unit's inputs at a time."""

    name = "local"

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def map(
        self, fn: UnitFn[S, U, R], shared: S, units: Sequence[U], *, clock: ModelClock | None = None
    ) -> Iterator[R]:
        # The worker's target is the caller's own (timed) target: its calls are counted already.
        for unit in units:
            yield fn(self.worker, shared, unit)
