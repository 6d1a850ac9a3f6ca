"""The Ray executor: units run as calls on Ray actors that each hold a loaded target.

Each actor rebuilds the target and the dataset from their spec strings the first time it is
used (nothing unpicklable crosses), then serves units until the run ends. Results come back
in the order of the units, through a bounded window of units in flight, so the driver holds a
few results at a time however large the sweep.

Ray is an extra (``pip install "mmchaos[ray]"``) and is imported only here.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from mmchaos.errors import ConfigError, MissingDependencyError
from mmchaos.executors.base import Executor, TargetSpec, UnitFn, Worker

if TYPE_CHECKING:
    from mmchaos.timing import ModelClock

__all__ = ["RayExecutor", "TargetActor", "require_ray"]

log = logging.getLogger(__name__)

S = TypeVar("S")
U = TypeVar("U")
R = TypeVar("R")

IN_FLIGHT_PER_WORKER = 2
"""Units queued on one actor: the next one is there when the current one ends."""


def require_ray() -> Any:
    """The ``ray`` module, or a usage error with the install hint (code ``executor_ray_missing``)."""
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise MissingDependencyError(
            f'--executor ray needs Ray, which is not installed ({exc}); install it with: pip install "mmchaos[ray]"',
            code="executor_ray_missing",
        ) from exc


Busy = list[tuple[float, float]]
"""Model calls of one unit as (start, end) on the wall clock (``time.time``), comparable across processes."""


def _busy_target(inner: Any) -> Any:
    """``inner`` wrapped so each model call appends its (start, end) wall-clock interval to ``.busy``."""
    from mmchaos.targets.wrappers import DelegatingTarget

    class BusyTarget(DelegatingTarget):
        def __init__(self, inner: Any) -> None:
            super().__init__(inner)
            self.busy: Busy = []

        def call(self, fn: Callable[..., R], *args: Any) -> R:
            start = time.time()
            try:
                return fn(*args)
            finally:
                self.busy.append((start, time.time()))

    return BusyTarget(inner)


class TargetActor:
    """The body of one Ray actor: a target and dataset loaded once, then any number of units.

    A unit's result travels back with the model calls it made (:data:`Busy`), which the driver
    adds to the check's model clock: the calls happen here, out of the runner's sight.
    """

    def __init__(self, spec: TargetSpec) -> None:
        self.spec = spec
        self._worker: Worker | None = None
        self._loaded: Any = None

    def worker(self) -> Worker:
        if self._worker is None:
            from mmchaos.data import load_dataset
            from mmchaos.targets import load_target

            self._loaded = load_target(self.spec.uri, self.spec.options)
            self._worker = Worker(_busy_target(self._loaded), load_dataset(self.spec.data))
        return self._worker

    def ready(self) -> bool:
        """Load the target now (so a target that cannot load fails before any unit is sent)."""
        self.worker()
        return True

    def run(self, fn: UnitFn[Any, Any, Any], shared: Any, unit: Any) -> tuple[Any, Busy]:
        worker = self.worker()
        target: Any = worker.target
        target.busy = []
        value = fn(worker, shared, unit)
        busy, target.busy = target.busy, []
        return value, busy

    def close(self) -> None:
        if self._worker is not None:
            self._loaded.close()  # the wrapper's close() would not reach it
            self._worker = None


class RayExecutor(Executor):
    """``workers`` actors (default: the CPUs of the cluster) on the Ray at ``address``, or a local Ray."""

    name = "ray"

    def __init__(self, spec: TargetSpec, *, workers: int | None = None, address: str | None = None) -> None:
        self.spec = spec
        self.address = address
        self._ray = require_ray()
        self._owns_ray = False
        if not self._ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            try:
                if address is not None:
                    self._ray.init(address=address, **kwargs)
                else:
                    self._ray.init(num_cpus=workers, **kwargs)
            except Exception as exc:  # ray raises ConnectionError, ValueError, RuntimeError ...
                where = address or "a local Ray"
                raise ConfigError(f"cannot start or reach {where}: {exc}", code="executor_ray_unavailable") from exc
            self._owns_ray = True
        cpus = int(self._ray.cluster_resources().get("CPU", 1))
        self.workers = workers if workers is not None else max(1, cpus)
        resources: dict[str, float] = {"num_cpus": min(1.0, cpus / self.workers)}
        if spec.options.device.startswith("cuda"):
            resources["num_gpus"] = 1.0  # one target actor per device
        actor_class = self._ray.remote(**resources)(TargetActor)
        self._actors = [actor_class.remote(spec) for _ in range(self.workers)]
        self._ray.get([a.ready.remote() for a in self._actors])
        log.info("ray executor: %d actor(s) hold %s", self.workers, spec.uri)

    def map(
        self, fn: UnitFn[S, U, R], shared: S, units: Sequence[U], *, clock: ModelClock | None = None
    ) -> Iterator[R]:
        ray = self._ray
        shared_ref = ray.put(shared)
        load = dict.fromkeys(range(len(self._actors)), 0)
        pending: dict[Any, tuple[int, int]] = {}  # object ref -> (unit index, actor index)
        done: dict[int, R] = {}
        failed: dict[int, BaseException] = {}
        window = IN_FLIGHT_PER_WORKER * len(self._actors)
        submitted = 0
        for index in range(len(units)):
            while index not in done and index not in failed:
                while submitted < len(units) and submitted - index < window:
                    actor = min(load, key=lambda a: (load[a], a))
                    ref = self._actors[actor].run.remote(fn, shared_ref, units[submitted])
                    pending[ref] = (submitted, actor)
                    load[actor] += 1
                    submitted += 1
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    position, actor = pending.pop(ref)
                    load[actor] -= 1
                    try:
                        done[position], busy = ray.get(ref)
                    except Exception as exc:  # raised at the unit's place in the order, as locally
                        failed[position] = exc
                        continue
                    if clock is not None:
                        _add_busy(clock, busy)
            if index in failed:
                raise failed[index]
            yield done.pop(index)

    def close(self) -> None:
        ray = self._ray
        for actor in getattr(self, "_actors", []):
            try:
                ray.get(actor.close.remote(), timeout=30)
            except Exception:  # an actor that died already has nothing to close
                log.debug("ray actor close failed", exc_info=True)
            ray.kill(actor)
        self._actors = []
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False


def _add_busy(clock: ModelClock, busy: Busy) -> None:
    """An actor's wall-clock intervals onto the clock's ``perf_counter`` timeline (overlapping calls on
    two actors count once, as two threads' calls do; across machines the offset is the clocks' skew)."""
    offset = time.perf_counter() - time.time()
    for start, end in busy:
        clock.add(start + offset, end + offset)
