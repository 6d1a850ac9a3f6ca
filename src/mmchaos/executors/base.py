"""The executor interface: run a check's work units where a loaded target lives, results in order.

A check cuts its work into units (robustness: perturbation x severity x data shard), describes
each with a small picklable value, and hands a module-level function to :meth:`Executor.map`::

    def fn(worker: Worker, shared: S, unit: U) -> R: ...

``shared`` is what every unit needs (sent once per map, not once per unit); ``worker`` holds the
target and the dataset, and a memo for what units may reuse. The executor yields the results in
the order of ``units`` whatever order they finished in, so a check aggregates them the same way
wherever they ran: a local run and a Ray run of one seed give identical findings.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from mmchaos.errors import ConfigError

if TYPE_CHECKING:
    from mmchaos.data.base import Dataset
    from mmchaos.executors.jobs import Handler, JobRunner, WorkerSpec
    from mmchaos.targets import TargetOptions
    from mmchaos.targets.base import Target
    from mmchaos.timing import ModelClock

__all__ = ["EXECUTORS", "Executor", "ExecutorSpec", "TargetSpec", "UnitFn", "Worker"]

S = TypeVar("S")
U = TypeVar("U")
R = TypeVar("R")
T = TypeVar("T")

EXECUTORS = ("local", "ray")


class Worker:
    """What a unit function runs against: the loaded target and dataset, plus a small memo.

    The memo keeps what units of one check can share (a task set up once, clean embeddings of
    the set); it is bounded, so a long-lived Ray actor serving many checks does not grow.
    """

    def __init__(self, target: Target, dataset: Dataset, memo_size: int = 16) -> None:
        self.target = target
        self.dataset = dataset
        self._memo: OrderedDict[str, Any] = OrderedDict()
        self._memo_size = memo_size

    def memo(self, key: str, make: Callable[[], T]) -> T:
        """``make()`` once per key (least recently used keys are dropped past ``memo_size``)."""
        if key in self._memo:
            self._memo.move_to_end(key)
            value: T = self._memo[key]
            return value
        value = make()
        self._memo[key] = value
        while len(self._memo) > self._memo_size:
            self._memo.popitem(last=False)
        return value


UnitFn = Callable[[Worker, S, U], R]
"""A unit of work: a module-level function (it is pickled by reference to reach Ray actors)."""


class Executor(ABC):
    """Runs unit functions; subclasses decide where. Use as a context manager, or call close()."""

    name: str = ""
    workers: int = 1

    @abstractmethod
    def map(
        self, fn: UnitFn[S, U, R], shared: S, units: Sequence[U], *, clock: ModelClock | None = None
    ) -> Iterator[R]:
        """``fn(worker, shared, unit)`` for every unit; results in the order of ``units``.

        An exception raised by a unit is raised here, at that unit's place in the order. Model
        calls that units make away from the caller's target (on a remote worker) are added to
        ``clock``, so the check's model time includes them.
        """

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
        """Isolated worker processes for ``handler`` jobs on this executor's machines (contract cases,
        fuzzed inputs, cross-process runs), or None: the caller uses the run's local pool. ``workers``
        is how many processes a ``broadcast`` reaches. See :mod:`mmchaos.executors.isolated`."""
        return None

    def close(self) -> None:
        """Release workers (a no-op where there are none)."""
        return None

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class TargetSpec:
    """How a remote worker rebuilds the run's target and dataset: strings, nothing unpicklable."""

    uri: str
    options: TargetOptions
    data: str


@dataclass(frozen=True)
class ExecutorSpec:
    """The executor a run asked for (``--executor``, ``--ray-address``, ``--workers``)."""

    kind: str = "local"
    address: str | None = None
    workers: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise ConfigError(
                f"unknown executor {self.kind!r} (known: {', '.join(EXECUTORS)})", code="executor_unknown"
            )
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"workers must be at least 1, got {self.workers}", code="executor_bad_option")
        if self.kind != "ray" and (self.address is not None or self.workers is not None):
            raise ConfigError("--ray-address and --workers need --executor ray", code="executor_bad_option")
