"""The in-process executor: units run one after another on the check's own target."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from mmchaos.executors.base import Executor, PrefetchingUnitFn, UnitFn, Worker

if TYPE_CHECKING:
    from mmchaos.timing import ModelClock

__all__ = ["LocalExecutor"]

S = TypeVar("S")
U = TypeVar("U")
R = TypeVar("R")


class LocalExecutor(Executor):
    """Runs each unit in this process, lazily: the next unit starts when its result is asked for,
    so a consumer that aggregates as it goes holds one unit's inputs at a time (two where the unit
    function prefetches: see :class:`~mmchaos.executors.base.PrefetchingUnitFn`)."""

    name = "local"

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def map(
        self, fn: UnitFn[S, U, R], shared: S, units: Sequence[U], *, clock: ModelClock | None = None
    ) -> Iterator[R]:
        # The worker's target is the caller's own (timed) target: its calls are counted already.
        if isinstance(fn, PrefetchingUnitFn):
            yield from _one_ahead(fn, self.worker, shared, units)
            return
        for unit in units:
            yield fn(self.worker, shared, unit)


def _one_ahead(fn: PrefetchingUnitFn[S, U, R], worker: Worker, shared: S, units: Sequence[U]) -> Iterator[R]:
    """Each unit's result, with the next unit's prepared work running on one helper thread meanwhile.

    The results and their order are those of calling ``fn`` unit by unit: the prepared work is
    pure (its randomness is seeded by the unit), and an exception it raises is raised at its
    unit's place. Closing the iterator early waits for the work in flight, so no thread outlives it.
    """
    if not units:
        return
    helper = ThreadPoolExecutor(1, thread_name_prefix="mmchaos-prefetch")

    def start(unit: U) -> Future[Any] | None:
        try:
            work: Callable[[], Any] | None = fn.prepare(worker, shared, unit)
        except Exception as exc:  # raised at this unit's place, after the units before it
            failed: Future[Any] = Future()
            failed.set_exception(exc)
            return failed
        return helper.submit(work) if work is not None else None

    try:
        ahead = start(units[0])
        for i, unit in enumerate(units):
            mine, ahead = ahead, (start(units[i + 1]) if i + 1 < len(units) else None)
            ready = mine.result() if mine is not None else None
            yield fn.run(worker, shared, unit, ready)
    finally:
        helper.shutdown(wait=True, cancel_futures=True)
