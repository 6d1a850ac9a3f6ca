"""The Ray executor: units run as calls on Ray actors that each hold a loaded target.

Each actor rebuilds the target and the dataset from their spec strings the first time it is
used (nothing unpicklable crosses), then serves units until the run ends. Results come back
in the order of the units, through a bounded window of units in flight, so the driver holds a
few results at a time however large the sweep.

Ray is an extra (``pip install "mmchaos[ray]"``) and is imported only here.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from mmchaos.errors import ConfigError, MissingDependencyError, MMChaosError
from mmchaos.executors.base import Executor, TargetSpec, UnitFn, Worker
from mmchaos.executors.busy import Busy, BusyTarget

if TYPE_CHECKING:
    from mmchaos.executors.jobs import Handler, JobResult, WorkerSpec
    from mmchaos.timing import ModelClock

__all__ = ["RayExecutor", "RayIsolatedPool", "TargetActor", "require_ray"]

log = logging.getLogger(__name__)

S = TypeVar("S")
U = TypeVar("U")
R = TypeVar("R")

IN_FLIGHT_PER_WORKER = 2
"""Units queued on one actor: the next one is there when the current one ends."""

UNIT_ATTEMPTS = 3
"""How many actors a unit may take down before it is reported as failed (a lost node costs a retry;
a unit that kills every actor it meets is the unit's fault, and retrying it forever would hang)."""


def require_ray() -> Any:
    """The ``ray`` module, or a usage error with the install hint (code ``executor_ray_missing``)."""
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise MissingDependencyError(
            f'--executor ray needs Ray, which is not installed ({exc}); install it with: pip install "mmchaos[ray]"',
            code="executor_ray_missing",
        ) from exc


class TargetActor:
    """The body of one Ray actor: a target and dataset loaded once, then any number of units.

    A unit's result travels back with the model calls it made (:data:`Busy`), which the driver
    adds to the check's model clock: the calls happen here, out of the runner's sight.
    """

    def __init__(self, spec: TargetSpec) -> None:
        self.spec = spec
        self._worker: Worker | None = None
        self._loaded: Any = None
        self._pools: dict[str, Any] = {}  # pool key -> a WorkerPool (isolated jobs)

    def worker(self) -> Worker:
        if self._worker is None:
            from mmchaos.data import load_dataset
            from mmchaos.targets import load_target

            self._loaded = load_target(self.spec.uri, self.spec.options)
            self._worker = Worker(BusyTarget(self._loaded), load_dataset(self.spec.data))
        return self._worker

    def ready(self) -> bool:
        """Load the target now (so a target that cannot load fails before any unit is sent)."""
        self.worker()
        return True

    def run(self, fn: UnitFn[Any, Any, Any], shared: Any, unit: Any) -> tuple[Any, Busy]:
        worker = self.worker()
        target: Any = worker.target
        target.take()
        value = fn(worker, shared, unit)
        return value, target.take()

    def start_pool(self, key: str, spec: WorkerSpec, start_timeout: float, workers: int = 1) -> tuple[str, Any]:
        """An isolation pool of ``workers`` processes for ``spec`` on this actor (kept for the run:
        contract and contract_fuzz share one): ``("ready", load seconds)`` or ``("load_error", why)``."""
        from mmchaos.errors import TargetLoadError
        from mmchaos.executors.jobs import dispatch_job
        from mmchaos.executors.pool import start_pool

        if key not in self._pools:
            try:
                self._pools[key] = start_pool(spec, dispatch_job, workers=workers, start_timeout=start_timeout)
            except TargetLoadError as exc:
                return "load_error", exc.message
        return "ready", max(self._pools[key].load_seconds, default=0.0)

    def run_job(self, key: str, job: tuple[Any, Any, Any], timeout: float) -> tuple[JobResult, int]:
        """One isolated job on this actor's pool: its result and the workers replaced meanwhile
        (a job that kills or hangs the worker gets it replaced, as in the local pool)."""
        pool = self._pools[key]
        before = pool.replacements
        results = list(pool.map([job], timeout))
        return results[0][1], pool.replacements - before

    def broadcast_job(self, key: str, job: tuple[Any, Any, Any], timeout: float) -> tuple[list[JobResult], int]:
        """One job once in each worker of this actor's pool ``key`` (a cross-process comparison)."""
        pool = self._pools[key]
        before = pool.replacements
        results = pool.broadcast(job, timeout)
        return results, pool.replacements - before

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools = {}
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
        self._actor_class = self._ray.remote(**resources)(TargetActor)
        self._actors = [self._actor_class.remote(spec) for _ in range(self.workers)]
        self._generation = [0] * self.workers  # bumped when an actor is replaced
        self._ray.get([a.ready.remote() for a in self._actors])
        log.info("ray executor: %d actor(s) hold %s", self.workers, spec.uri)

    def map(
        self, fn: UnitFn[S, U, R], shared: S, units: Sequence[U], *, clock: ModelClock | None = None
    ) -> Iterator[R]:
        ray = self._ray
        shared_ref = ray.put(shared)
        load = dict.fromkeys(range(len(self._actors)), 0)
        pending: dict[Any, tuple[int, int, int, int]] = {}  # ref -> (unit index, actor, its generation, sent #)
        done: dict[int, R] = {}
        failed: dict[int, BaseException] = {}
        lost: dict[int, int] = {}  # unit index -> actors that died running it
        charged: set[tuple[int, int]] = set()  # dead (actor, generation)s whose death is put on a unit
        sent = 0
        window = IN_FLIGHT_PER_WORKER * len(self._actors)
        submitted = 0

        def submit(position: int) -> None:
            nonlocal sent
            actor = min(load, key=lambda a: (load[a], a))
            ref = self._actors[actor].run.remote(fn, shared_ref, units[position])
            pending[ref] = (position, actor, self._generation[actor], sent)
            load[actor] += 1
            sent += 1

        def ran_when_it_died(actor: int, generation: int, number: int) -> bool:
            """An actor runs its units in the order sent: the death is the oldest pending one's."""
            if (actor, generation) in charged or any(
                (a, g) == (actor, generation) and n < number for _, a, g, n in pending.values()
            ):
                return False
            charged.add((actor, generation))
            return True

        for index in range(len(units)):
            while index not in done and index not in failed:
                while submitted < len(units) and submitted - index < window:
                    submit(submitted)
                    submitted += 1
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    position, actor, generation, number = pending.pop(ref)
                    load[actor] -= 1
                    try:
                        done[position], busy = ray.get(ref)
                    except ray.exceptions.RayActorError as exc:  # the actor died (a lost node, OOM kill)
                        if generation == self._generation[actor]:  # its other units see the same death
                            self.replace_actor(actor)
                        if ran_when_it_died(actor, generation, number):
                            lost[position] = lost.get(position, 0) + 1
                        if lost.get(position, 0) >= UNIT_ATTEMPTS:
                            failed[position] = MMChaosError(
                                f"work unit {position} took down {lost[position]} Ray actors; last: {_first_line(exc)}",
                                code="executor_actor_lost",
                            )
                        else:
                            log.warning("a Ray actor died under unit %d; running it again: %s", position,
                                        _first_line(exc))  # fmt: skip
                            submit(position)  # units are deterministic: running one again gives its result
                        continue
                    except Exception as exc:  # raised at the unit's place in the order, as locally
                        failed[position] = exc
                        continue
                    if clock is not None:
                        _add_busy(clock, busy)
            if index in failed:
                raise failed[index]
            yield done.pop(index)

    def isolated(
        self,
        spec: WorkerSpec,
        handler: Handler,
        *,
        workers: int = 1,
        overlay: Mapping[str, Any] | None = None,
        start_timeout: float = 300.0,
        clock: ModelClock | None = None,
    ) -> RayIsolatedPool:
        return RayIsolatedPool(
            self, spec, handler, width=workers, overlay=overlay, start_timeout=start_timeout, clock=clock
        )

    def replace_actor(self, index: int) -> Any:
        """Kill actor ``index`` (dead already, or stuck) and put a fresh one in its place; the new
        actor loads the target when a unit first needs it."""
        with contextlib.suppress(Exception):  # a dead actor cannot be killed twice
            self._ray.kill(self._actors[index], no_restart=True)
        self._actors[index] = self._actor_class.remote(self.spec)
        self._generation[index] += 1
        return self._actors[index]

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


ACTOR_GRACE_S = 30.0
"""How long past a job's own timeout and a worker restart the driver waits for an actor's answer."""
REPLACEMENT_RETRIES = 2
"""How many times a pool whose replacement actor failed to start its worker is started again."""


class RayIsolatedPool:
    """Isolated jobs on the Ray executor's actors: each actor runs them in a one-worker pool of its
    own (:class:`~mmchaos.executors.pool.WorkerPool`), one job in flight per actor.

    The actor's worker process is the one a hostile input kills or hangs; the actor's pool reports
    it (``crashed`` with the signal and the faulthandler trace, ``hung`` past the timeout) and
    starts a new worker, exactly as the local pool does, so a job's result does not depend on the
    executor. Should the actor itself die (a lost node, the actor killed) or not answer within the
    job's timeout plus a worker restart, the job is ``crashed`` or ``hung``, the actor is replaced
    and the other actors' jobs go on: every wait is bounded.

    :meth:`broadcast` runs a job in each of ``width`` worker processes of the first actor (a pool of
    that size, started on first use), as the local pool's broadcast does on one machine.
    The actors' pools start when jobs first need them, so a check that only broadcasts starts none.
    """

    def __init__(
        self,
        executor: RayExecutor,
        spec: WorkerSpec,
        handler: Handler,
        *,
        width: int = 1,
        overlay: Mapping[str, Any] | None = None,
        start_timeout: float = 300.0,
        clock: ModelClock | None = None,
    ) -> None:
        self.executor = executor
        self.spec = spec
        self.handler = handler
        self.width = max(1, width)
        self.overlay = dict(overlay or {})
        self.start_timeout = start_timeout
        self.clock = clock
        self.key = json.dumps([spec.uri, spec.options, spec.threads, spec.memory_limit_mb], sort_keys=True, default=str)
        self.replacements = 0
        self.load_seconds: list[float] = []
        self._started: list[bool] | None = None
        self._retries = [0] * len(executor._actors)  # restarts of a failed replacement, per actor
        self._broadcasting = False

    @property
    def _usable(self) -> list[bool]:
        """Which actors have a working pool (started on first use: raises if none can load the target)."""
        if self._started is None:
            self._started = [self._start(i) for i in range(len(self.executor._actors))]
        return self._started

    @property
    def workers(self) -> int:
        return sum(self._usable)

    def _start(self, index: int, *, replacing: bool = False, key: str | None = None, workers: int = 1) -> bool:
        """Start (or find) the pool on actor ``index``; False when it cannot load the target."""
        from mmchaos.errors import TargetLoadError

        ray = self.executor._ray
        actor = self.executor._actors[index]
        try:
            status, info = ray.get(
                actor.start_pool.remote(key or self.key, self.spec, self.start_timeout, workers),
                timeout=self.start_timeout + ACTOR_GRACE_S,
            )
        except Exception as exc:  # the actor died or did not answer
            status, info = "load_error", f"the Ray actor did not start its worker: {_first_line(exc)}"
        if status == "ready":
            self.load_seconds.append(float(info))
            return True
        if not replacing:
            raise TargetLoadError(
                f"the target cannot be loaded in a worker process by its URI {self.spec.uri!r}: {info}"
            )
        log.warning("a replacement Ray actor failed to start its worker: %s", info)
        return False

    def broadcast(self, payload: Any, timeout: float) -> list[JobResult]:
        """``payload`` once in each of ``width`` worker processes on the first actor, in order.

        Should that actor die or not answer within the timeout plus a worker restart, every copy is
        ``crashed`` or ``hung`` and the actor is replaced (its pool starts again on the next call)."""
        from mmchaos.executors.jobs import JobResult

        ray = self.executor._ray
        key = f"{self.key}/broadcast/{self.width}"
        if not self._broadcasting:
            self._start(0, key=key, workers=self.width)
            self._broadcasting = True
        bound = timeout + self.start_timeout + ACTOR_GRACE_S
        began = time.monotonic()
        ref = self.executor._actors[0].broadcast_job.remote(key, (self.handler, self.overlay, payload), timeout)
        try:
            results, replaced = ray.get(ref, timeout=bound)
        except Exception as exc:  # the actor died, or froze
            self.executor.replace_actor(0)
            self.replacements += 1
            self._broadcasting = False
            if self._started is not None:
                self._started[0] = self._start(0, replacing=True)
            status = "crashed" if isinstance(exc, ray.exceptions.RayActorError) else "hung"
            detail = f"the Ray actor died: {_first_line(exc)}" if status == "crashed" else (
                f"no answer from the Ray actor within {bound:g} s; actor replaced")  # fmt: skip
            return [JobResult(status, seconds=time.monotonic() - began, detail=detail) for _ in range(self.width)]
        self.replacements += replaced
        if self.clock is not None:
            now = time.perf_counter()
            for result in results:  # the copies ran side by side: their union is the longest
                if result.busy_seconds > 0:
                    self.clock.add(now - min(result.busy_seconds, time.monotonic() - began), now)
        return list(results)

    def _replace(self, index: int) -> None:
        self.executor.replace_actor(index)
        self.replacements += 1
        if index == 0:
            self._broadcasting = False  # its broadcast pool died with it
        self._usable[index] = self._start(index, replacing=True)

    def _restart_failed_replacements(self) -> None:
        """Start again, once a call, the pool of an actor whose replacement failed to start it.

        On a starved machine a replacement actor's worker can miss its start timeout (a frozen
        actor's CPU slot freed late, imports slowed by other load): without a second try the pool
        stayed one worker short for the rest of the run. At most ``REPLACEMENT_RETRIES`` tries an
        actor, so a target that no longer loads costs a bounded wait, not one per call."""
        if self._started is None:
            return
        for a, usable in enumerate(self._started):
            if not usable and self._retries[a] < REPLACEMENT_RETRIES:
                self._retries[a] += 1
                self._started[a] = self._start(a, replacing=True)

    def map(self, payloads: Sequence[Any], timeout: float) -> Iterator[tuple[int, JobResult]]:
        """Run every payload once; yields (index, result) as they finish.

        Each actor has up to :data:`IN_FLIGHT_PER_WORKER` jobs queued (it runs them in order, so the
        next one is there when the current one ends). The job at the head of an actor's queue is the
        one running: when the actor dies, that job crashed and the ones queued behind it run again
        elsewhere; when the head gets no answer within its timeout plus a worker restart (counted
        from when it could start), it hung, the actor is replaced and its queue runs again.
        """
        from mmchaos.executors.jobs import JobResult, describe_exception

        ray = self.executor._ray
        actors = self.executor._actors
        self._restart_failed_replacements()
        bound = timeout + self.start_timeout + ACTOR_GRACE_S
        todo = list(range(len(payloads)))[::-1]  # a stack: the next job is last
        queues: list[deque[tuple[Any, int]]] = [deque() for _ in actors]  # (ref, payload index), head running
        since = [0.0] * len(actors)  # when each actor's head job could start at the earliest
        where: dict[Any, int] = {}  # ref -> actor index

        def requeue(a: int) -> int:
            """Empty actor ``a``'s queue; put all but its head back in front of the jobs to do; the head."""
            head = queues[a].popleft()
            for ref, index in reversed(queues[a]):
                where.pop(ref, None)
                todo.append(index)
            queues[a].clear()
            where.pop(head[0], None)
            return head[1]

        while todo or any(queues):
            for depth in range(1, IN_FLIGHT_PER_WORKER + 1):  # one job per actor first (warm-ups reach each)
                for a in range(len(actors)):
                    if not (todo and self._usable[a] and len(queues[a]) < depth):
                        continue
                    index = todo.pop()
                    ref = actors[a].run_job.remote(self.key, (self.handler, self.overlay, payloads[index]), timeout)
                    if not queues[a]:
                        since[a] = time.monotonic()
                    queues[a].append((ref, index))
                    where[ref] = a
            if not any(queues):  # jobs left and no actor that can run them
                while todo:
                    yield todo.pop(), JobResult("error", detail="no Ray actor could (re)start a worker")
                return
            left = min(since[a] + bound for a in range(len(actors)) if queues[a]) - time.monotonic()
            ready, _ = ray.wait(list(where), num_returns=1, timeout=max(0.0, left))
            for ref in ready:
                a = where.pop(ref)
                elapsed = time.monotonic() - since[a]
                try:
                    result, replaced = ray.get(ref)
                except ray.exceptions.RayActorError as exc:  # the actor process itself died
                    where[ref] = a
                    yield from self._finished_before_death(queues[a], where)  # jobs ahead of the fatal one
                    index = requeue(a)
                    self._replace(a)
                    yield index, JobResult("crashed", seconds=elapsed, detail=f"the Ray actor died: {_first_line(exc)}")
                    continue
                except Exception as exc:  # the harness failed on the actor
                    result = JobResult("error", error=describe_exception(exc), seconds=elapsed,
                                       detail="the harness failed on the Ray actor")  # fmt: skip
                    replaced = 0
                index = next(i for r, i in queues[a] if r == ref)
                queues[a] = deque((r, i) for r, i in queues[a] if r != ref)
                since[a] = time.monotonic()
                self.replacements += replaced
                if self.clock is not None and result.busy_seconds > 0:
                    now = time.perf_counter()
                    self.clock.add(now - min(result.busy_seconds, elapsed), now)
                yield index, result
            now = time.monotonic()
            for a in range(len(actors)):
                if queues[a] and now - since[a] > bound:
                    index = requeue(a)
                    self._replace(a)
                    detail = f"no answer from the Ray actor within {bound:g} s; actor replaced"
                    yield index, JobResult("hung", seconds=now - since[a], detail=detail)

    def _finished_before_death(
        self, queue: deque[tuple[Any, int]], where: dict[Any, int]
    ) -> Iterator[tuple[int, JobResult]]:
        """The jobs at the head of a dead actor's queue that had answered before it died (the death
        may be seen first), taken off the queue: the first one that had not is the one that killed it."""
        ray = self.executor._ray
        while queue:
            ref, index = queue[0]
            try:
                result, replaced = ray.get(ref, timeout=ACTOR_GRACE_S)
            except Exception:  # died with the actor (or never ran)
                return
            queue.popleft()
            where.pop(ref, None)
            self.replacements += replaced
            yield index, result

    def close(self) -> None:
        """The actors keep their pools for the run's other checks; the executor closes them."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
