"""Build the executor a run asked for (kept apart from base so base never imports Ray's module)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from mmchaos.executors.base import Executor, ExecutorSpec, TargetSpec, UnitFn

if TYPE_CHECKING:
    from mmchaos.executors.jobs import Handler, JobRunner, WorkerSpec
    from mmchaos.timing import ModelClock

__all__ = ["LazyExecutor", "open_executor"]

S = TypeVar("S")
U = TypeVar("U")
R = TypeVar("R")


def open_executor(spec: ExecutorSpec, target: TargetSpec) -> Executor | None:
    """The executor for a run; None for ``local`` (checks then run units on their own target)."""
    if spec.kind == "local":
        return None
    from mmchaos.executors.ray import RayExecutor

    return RayExecutor(target, workers=spec.workers, address=spec.address)


class LazyExecutor(Executor):
    """Opens the executor it stands for when a check first maps units on it, so a suite none of
    whose checks runs work units never starts (or joins) Ray and loads no target on its actors.

    A failure to open is kept in :attr:`error` as well as raised, so the run can tell it from a
    check's own failure (it is the run's usage error, not the check's finding).
    """

    def __init__(self, name: str, opener: Callable[[], Executor | None]) -> None:
        self.name = name
        self._opener: Callable[[], Executor | None] | None = opener
        self._inner: Executor | None = None
        self.error: BaseException | None = None

    @property
    def opened(self) -> bool:
        return self._inner is not None

    def _open(self) -> Executor:
        if self._inner is None:
            if self.error is not None:
                raise self.error
            try:
                inner = self._opener() if self._opener is not None else None
            except BaseException as exc:
                self.error = exc
                raise
            if inner is None:
                raise ValueError(f"no {self.name} executor to open")
            self._inner, self._opener = inner, None
            self.workers = inner.workers
        return self._inner

    def map(
        self, fn: UnitFn[S, U, R], shared: S, units: Sequence[U], *, clock: ModelClock | None = None
    ) -> Iterator[R]:
        return self._open().map(fn, shared, units, clock=clock)

    def isolated(
        self,
        spec: WorkerSpec,
        handler: Handler,
        *,
        workers: int = 1,
        overlay: Mapping[str, Any] | None = None,
        start_timeout: float = 300.0,
        clock: ModelClock | None = None,
    ) -> JobRunner | None:
        return self._open().isolated(
            spec, handler, workers=workers, overlay=overlay, start_timeout=start_timeout, clock=clock
        )

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()
            self._inner = None
