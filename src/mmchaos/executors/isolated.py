"""Isolated jobs as keyed work units: contract cases and fuzz batches, wherever the run's executor runs.

Contract cases and fuzzed inputs must run where a crash, a hang or a memory blow-up cannot take
the run down: in worker processes (:mod:`mmchaos.isolation`) that are killed and replaced when a
job kills them or does not answer in time. :func:`open_isolated` gives a check such a runner:

* local executor (the default): the run's shared worker pool, exactly as before;
* Ray: every actor keeps a one-worker pool of its own (see :class:`~mmchaos.executors.ray.RayIsolatedPool`),
  so the worker that a hostile input kills is the actor's child, with the same signal, the same
  faulthandler trace on stderr and the same memory limit as locally -- the outcome, detail and
  failure signature of a job do not depend on the executor.

Either way the runner is wrapped in a :class:`JournaledRunner`: a job passed with a key is
committed to the run store the moment its result arrives, and a resumed run reads it back instead
of running it again. Every keyed result goes through the JSON encoding (:func:`~mmchaos.isolation.encode_job`),
computed now or read back, so both judge identical values.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from mmchaos.isolation import Handler, JobResult, WorkerSpec, decode_job, encode_job, run_pool

if TYPE_CHECKING:
    from mmchaos.executors.journal import UnitJournal

__all__ = ["JobRunner", "JournaledRunner", "open_isolated"]

log = logging.getLogger(__name__)


class JobRunner(Protocol):
    """What runs isolated jobs: the run's pool (``PoolView``), a Ray pool, or an ``InProcessRunner``."""

    @property
    def replacements(self) -> int: ...

    @property
    def load_seconds(self) -> list[float]: ...

    def map(self, payloads: Sequence[Any], timeout: float) -> Iterator[tuple[int, JobResult]]: ...


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
            if self.journal is not None:
                self.journal.commit(keys[index], body)
                self._committed().add(keys[index])
            yield index, decode_job(json.loads(body))


@contextlib.contextmanager
def open_isolated(
    ctx: Any,
    spec: WorkerSpec,
    handler: Handler,
    *,
    workers: int,
    start_timeout: float,
    overlay: Mapping[str, Any] | None = None,
) -> Iterator[JournaledRunner]:
    """Isolated workers for ``handler`` jobs on the run's executor, journaled in ``ctx.journal``.

    Local (``ctx.executor`` None): the run's shared pool of ``workers`` processes, as
    :func:`~mmchaos.isolation.run_pool` gives it. Ray: a one-worker pool on each actor. Raises
    :class:`~mmchaos.errors.TargetLoadError` when the workers cannot load the target.
    """
    from mmchaos.timing import clock_of

    what = f"{getattr(ctx, 'check_id', 'check')} jobs"
    journal = getattr(ctx, "journal", None)
    executor = getattr(ctx, "executor", None)
    if executor is not None:
        remote = executor.isolated(
            spec, handler, overlay=overlay, start_timeout=start_timeout, clock=clock_of(getattr(ctx, "target", None))
        )
        if remote is not None:
            yield JournaledRunner(remote, journal, what)
            return
    with run_pool(ctx, spec, handler, workers=workers, start_timeout=start_timeout, overlay=overlay) as view:
        yield JournaledRunner(view, journal, what)
