"""Isolated jobs as keyed work units: contract cases, fuzz batches and cross-process runs, on any executor.

Contract cases and fuzzed inputs must run where a crash, a hang or a memory blow-up cannot take
the run down: in worker processes (:mod:`mmchaos.executors.pool`) that are killed and replaced
when a job kills them or does not answer in time. :func:`open_isolated` gives a check (through
:meth:`~mmchaos.checks.base.CheckContext.isolated`) such a runner:

* local executor (the default): the run's shared worker pool;
* Ray: every actor keeps a pool of its own (see :class:`~mmchaos.executors.ray.RayIsolatedPool`),
  so the worker that a hostile input kills is the actor's child, with the same signal, the same
  faulthandler trace on stderr and the same memory limit as locally -- the outcome, detail and
  failure signature of a job do not depend on the executor;
* in process (a target that cannot be loaded by URI): this process, with weaker isolation.

Either way the runner is a :class:`JournaledRunner`: a job passed with a key is committed to the
run store the moment its result arrives, and a resumed run reads it back instead of running it
again. Every keyed result goes through the JSON encoding (:mod:`mmchaos.executors.codec`),
computed now or read back, so both judge identical values.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from mmchaos.executors.codec import decode_job, encode_job
from mmchaos.executors.jobs import Handler, JobResult, JobRunner, WorkerSpec
from mmchaos.executors.pool import InProcessRunner, prefetch_pool, shared_pool

if TYPE_CHECKING:
    from mmchaos.executors.base import Executor
    from mmchaos.executors.journal import UnitJournal
    from mmchaos.executors.resources import RunResources
    from mmchaos.timing import ModelClock

__all__ = ["JournaledRunner", "open_isolated", "prefetch_isolated"]

log = logging.getLogger(__name__)


class JournaledRunner:
    """A :class:`JobRunner` whose keyed jobs are committed as they arrive and read back on resume."""

    def __init__(self, inner: JobRunner, journal: UnitJournal | None, what: str = "jobs") -> None:
        self.inner = inner
        self.journal = journal
        self.what = what
        self._have: set[str] | None = None

    @property
    def replacements(self) -> int:
        return self.inner.replacements

    @property
    def load_seconds(self) -> list[float]:
        return self.inner.load_seconds

    @property
    def workers(self) -> int:
        return int(getattr(self.inner, "workers", 1))

    def _committed(self) -> set[str]:
        if self._have is None:  # read once: only this runner adds to the journal while the check runs
            self._have = self.journal.keys() if self.journal is not None else set()
        return self._have

    def _commit(self, key: str, body: str) -> None:
        if self.journal is not None:
            self.journal.commit(key, body)
            self._committed().add(key)

    def map(
        self, payloads: Sequence[Any], timeout: float, keys: Sequence[str] | None = None
    ) -> Iterator[tuple[int, JobResult]]:
        """``(index, result)`` for every payload, as they arrive; with ``keys``, journaled.

        Jobs without keys (warm-ups) run as they are. Keyed results read back come first.
        """
        if keys is None:
            yield from self.inner.map(payloads, timeout)
            return
        if len(keys) != len(payloads) or len(set(keys)) != len(keys):
            raise ValueError("every job needs its own key")
        have = self._committed() & set(keys)
        if have and self.journal is not None:
            log.info("resume: %d of %d %s read back from the store", len(have), len(keys), self.what)
            for index, key in enumerate(keys):
                if key in have:
                    yield index, decode_job(json.loads(self.journal.get(key)))
        todo = [i for i, key in enumerate(keys) if key not in have]
        for j, job in self.inner.map([payloads[i] for i in todo], timeout):
            index = todo[j]
            body = json.dumps(encode_job(job))
            self._commit(keys[index], body)
            yield index, decode_job(json.loads(body))

    def broadcast(self, payload: Any, timeout: float, key: str | None = None) -> list[JobResult]:
        """``payload`` once in each worker process (one result per process); with ``key``, journaled
        as one unit: a resumed run reads every process's result back, or runs them all again."""
        if key is None:
            return self.inner.broadcast(payload, timeout)
        if key in self._committed() and self.journal is not None:
            log.info("resume: %s %s read back from the store", self.what, key)
            return [decode_job(body) for body in json.loads(self.journal.get(key))]
        body = json.dumps([encode_job(job) for job in self.inner.broadcast(payload, timeout)])
        self._commit(key, body)
        return [decode_job(job) for job in json.loads(body)]


@contextlib.contextmanager
def open_isolated(
    spec: WorkerSpec,
    handler: Handler,
    *,
    workers: int,
    start_timeout: float,
    overlay: Mapping[str, Any] | None = None,
    executor: Executor | None = None,
    resources: RunResources | None = None,
    journal: UnitJournal | None = None,
    clock: ModelClock | None = None,
    in_process: Any = None,
    what: str = "jobs",
) -> Iterator[JournaledRunner]:
    """Isolated workers for ``handler`` jobs, journaled in ``journal``.

    ``in_process`` (a loaded target): this process. Else with an ``executor`` that has isolated
    workers (Ray): a pool on each actor. Else the run's shared pool of ``workers`` processes from
    ``resources`` (or one for this block when there are none). Raises
    :class:`~mmchaos.errors.TargetLoadError` when the workers cannot load the target.
    """
    if in_process is not None:
        inline = InProcessRunner(in_process, replace(spec, **dict(overlay or {})), handler)
        yield JournaledRunner(inline, journal, what)
        return
    if executor is not None:
        remote = executor.isolated(
            spec, handler, workers=workers, overlay=overlay, start_timeout=start_timeout, clock=clock
        )
        if remote is not None:
            yield JournaledRunner(remote, journal, what)
            return
    with shared_pool(
        resources, spec, handler, workers=workers, start_timeout=start_timeout, overlay=overlay, clock=clock
    ) as view:
        yield JournaledRunner(view, journal, what)


def prefetch_isolated(
    spec: WorkerSpec,
    *,
    workers: int,
    start_timeout: float,
    executor: Executor | None = None,
    resources: RunResources | None = None,
) -> None:
    """Start, in the background, the local pool :func:`open_isolated` will use (a check's ``prepare``).

    Nothing without run resources, and nothing with an executor: its jobs run on the executor's
    workers then (started on first use), and a local pool would sit idle."""
    if resources is not None and executor is None:
        prefetch_pool(resources, spec, workers=workers, start_timeout=start_timeout)
