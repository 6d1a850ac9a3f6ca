"""Work units on forked workers that hold the run's loaded target: a sweep on every core.

A tiny model on the CPU runs one intra-op thread (:mod:`mmchaos.targets.threads`: more threads only
hand its small operations over), so tiny-vlm's robustness sweep kept one core of two busy for 70 s
of model time in a row. Its units are independent and seeded by their own keys (they run on Ray
actors the same way), so they can run side by side in processes. The run's fork server
(:mod:`mmchaos.executors.forkserver`) holds the loaded target and dataset and never ran the model;
the workers here are its children, one intra-op thread each, one per usable core: no import, no
second load. Results come back in the order of the units and equal a local run's (the same code,
the same thread count, the same batches); the model calls each unit made join the check's clock.

Only where it cannot change a result or oversubscribe the machine (:func:`unit_workers`): a torch
target in this process (the built-in tiny models, ``hf:``) running one intra-op thread, a fork
server, two or more usable cores. ``MMCHAOS_UNIT_WORKERS=N`` sets the count (1: units run in this
process, as before). A check opts in with ``parallel_units`` (robustness does).
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from mmchaos.errors import ConfigError, MMChaosError
from mmchaos.executors.base import Executor, UnitFn, Worker
from mmchaos.executors.jobs import JobResult, WorkerSpec, describe_exception, shared_spec

if TYPE_CHECKING:
    from mmchaos.executors.forkserver import ForkServer
    from mmchaos.executors.pool import WorkerPool
    from mmchaos.timing import ModelClock

__all__ = ["MAX_UNIT_WORKERS", "UNIT_TIMEOUT_S", "ForkedUnitExecutor", "run_unit_job", "unit_workers"]

log = logging.getLogger(__name__)

S = TypeVar("S")
U = TypeVar("U")
R = TypeVar("R")

MAX_UNIT_WORKERS = 8
"""Workers at most without ``MMCHAOS_UNIT_WORKERS`` (each holds a batch's activations)."""
UNIT_TIMEOUT_S = 3600.0
"""A unit with no answer in this long is reported as hung (its worker is killed) instead of waited on."""


def unit_workers(uri: str) -> int:
    """How many forked workers run a check's units for target ``uri`` (1: in this process).

    ``MMCHAOS_UNIT_WORKERS`` decides when set; otherwise one per usable core (at most
    :data:`MAX_UNIT_WORKERS`) for a torch target on one intra-op thread, since the workers run one
    thread each and a run on more threads would compute (slightly) different floats.
    """
    wanted = os.environ.get("MMCHAOS_UNIT_WORKERS", "").strip()
    if wanted:
        try:
            count = int(wanted)
        except ValueError:
            count = 0
        if count < 1:
            raise ConfigError(
                f"MMCHAOS_UNIT_WORKERS must be a positive integer, got {wanted!r}", code="executor_bad_option"
            )
        return count
    from mmchaos.targets.builtin import TORCH_BUILTINS

    scheme, _, rest = uri.partition(":")
    torch = sys.modules.get("torch")
    if not (scheme == "hf" or (scheme == "builtin" and rest in TORCH_BUILTINS)):
        return 1
    if torch is None or torch.get_num_threads() != 1:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, MAX_UNIT_WORKERS))


# -- the worker side (a child of the fork server) -------------------------------------------------

_state: dict[str, Any] = {}
"""The forked worker's :class:`Worker` and the ``shared`` value of the map it serves now."""


def _worker(target: Any) -> Worker:
    if "worker" not in _state:
        from mmchaos.executors.busy import BusyTarget
        from mmchaos.executors.forkserver import held_dataset

        dataset = held_dataset()
        if dataset is None:
            raise MMChaosError("this worker holds no dataset (it was not forked by the run's server)",
                               code="executor_unit_failed")  # fmt: skip
        _state["worker"] = Worker(BusyTarget(target, now=time.perf_counter), dataset)
    worker: Worker = _state["worker"]
    return worker


def run_unit_job(target: Any, spec: WorkerSpec, payload: tuple[Any, str, bytes | None, Any]) -> tuple[Any, ...]:
    """Worker handler. ``(None, key, pickled shared, None)`` keeps a map's ``shared`` value (sent once
    to each worker); ``(fn, key, None, unit)`` runs one unit of that map: ``("ok", pickled result, busy
    intervals)``, ``("raised", pickled exception or None, ErrorInfo)`` or ``("unpicklable", None,
    ErrorInfo)``. Pickled here, so a result or exception that cannot cross the pipe is the unit's
    failure instead of the worker's death."""
    fn, key, blob, unit = payload
    worker = _worker(target)
    if fn is None:
        _state["shared"], _state["key"] = pickle.loads(blob or b""), key
        return ("shared",)
    if _state.get("key") != key:  # a worker that replaced one mid-map has not seen the map's value
        raise MMChaosError(f"this worker has not received map {key}'s shared value", code="executor_unit_failed")
    busy: Any = worker.target  # the BusyTarget of _worker
    busy.take()
    try:
        value = fn(worker, _state["shared"], unit)
    except Exception as exc:
        busy.take()
        try:
            raised: bytes | None = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            raised = None
        return ("raised", raised, describe_exception(exc))
    try:
        body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        busy.take()
        return ("unpicklable", None, describe_exception(exc))
    return ("ok", body, busy.take())


# -- the run side ---------------------------------------------------------------------------------


class ForkedUnitExecutor(Executor):
    """``workers`` processes forked from the run's server, started on the first map, kept for the run."""

    name = "forked"

    def __init__(self, server: ForkServer, spec: WorkerSpec, workers: int, *, start_timeout: float = 120.0) -> None:
        self.server = server
        self.spec = spec
        self.workers = workers
        self.start_timeout = start_timeout
        self._pool: WorkerPool | None = None
        self._broken: str | None = None
        self._maps = 0

    @classmethod
    def for_run(cls, server: ForkServer | None, target: Any) -> ForkedUnitExecutor | None:
        """The run's unit executor for its loaded ``target``, or None where units stay in process."""
        if server is None:
            return None
        workers = unit_workers(str(getattr(target, "uri", "")))
        spec = shared_spec(target)
        if workers < 2 or not server.accepts(spec):
            return None
        return cls(server, spec, workers)

    def available(self) -> bool:
        """Whether the workers run (started now if need be); False, once logged, if they cannot start:
        the caller then runs its units in process."""
        if self._broken is None:
            try:
                self._open()
            except (OSError, MMChaosError) as exc:
                self._broken = str(exc)
                log.warning("work units run in this process: their forked workers cannot start (%s)", exc)
        return self._broken is None

    def _open(self) -> WorkerPool:
        if self._pool is None:
            from mmchaos.executors.pool import WorkerPool

            pool = WorkerPool(self.spec, run_unit_job, workers=self.workers, start_timeout=self.start_timeout,
                              forks=self.server)  # fmt: skip
            if pool.forks is None:
                raise MMChaosError("the run's fork server cannot fork unit workers", code="executor_unit_failed")
            pool.start()
            if pool.forks is None:  # the server failed while forking: these workers hold no dataset
                pool.close()
                raise MMChaosError("the run's fork server stopped forking unit workers", code="executor_unit_failed")
            self._pool = pool
        return self._pool

    def map(
        self, fn: UnitFn[S, U, R], shared: S, units: Sequence[U], *, clock: ModelClock | None = None
    ) -> Iterator[R]:
        if not units:
            return
        pool = self._open()
        self._maps += 1
        key = str(self._maps)
        done: dict[int, JobResult] = {}
        taken = 0
        try:
            blob = pickle.dumps(shared, protocol=pickle.HIGHEST_PROTOCOL)
            for sent in pool.broadcast((None, key, blob, None), self.start_timeout):  # once per worker
                if sent.status != "ok":
                    _unpack(-1, sent, None)
            for index, result in pool.map([(fn, key, None, unit) for unit in units], UNIT_TIMEOUT_S):
                done[index] = result
                while taken in done:
                    value: R = _unpack(taken, done.pop(taken), clock)
                    taken += 1
                    yield value
        finally:
            if taken < len(units):  # stopped early or a unit failed: workers may still be busy
                self._discard()

    def _discard(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def close(self) -> None:
        self._discard()


def _unpack(index: int, result: JobResult, clock: ModelClock | None) -> Any:
    """A unit's value from its job result (its model calls added to ``clock``), or its failure raised."""
    if result.status == "ok":
        kind, body, extra = result.value
        if kind == "ok":
            if clock is not None:
                for start, end in extra:
                    clock.add(start, end)
            return pickle.loads(body)
        if body is not None:
            try:
                exc = pickle.loads(body)
            except Exception:
                exc = None
            if isinstance(exc, BaseException):
                raise exc
        why = "its result cannot be sent back" if kind == "unpicklable" else "it failed in its worker"
        raise MMChaosError(f"work unit {index}: {why}: {extra.short()}", code="executor_unit_failed")
    tail = result.stderr.strip().splitlines()[-3:]
    what = {"crashed": "took down its worker", "hung": "did not finish"}.get(result.status, "failed in its worker")
    detail = result.error.short() if result.error is not None else result.detail
    raise MMChaosError(
        f"{f'work unit {index}' if index >= 0 else 'the shared value of a map'} {what} ({detail})"
        + (f": {' | '.join(tail)}" if tail else ""),
        code="executor_worker_lost" if result.status == "crashed" else "executor_unit_failed",
    )
