"""A pool of worker processes that each load the target once and run jobs with a timeout.

The harness outlives its target: a job that kills its worker (a signal, an abort, the memory
limit) or does not answer in time is reported as ``crashed`` or ``hung``, the worker is replaced,
and the other jobs go on. In a run, workers are forked by the run's fork server
(:mod:`mmchaos.executors.forkserver`), which holds the target the run loaded before it ran the
model: no second torch import or load. Otherwise (no server, a spec it cannot serve, a
``fresh_process`` spec) they are spawned, never forked from a process that ran the model (torch and
tokenizer thread pools do not survive it), and load the target by URI, like ``mmchaos validate``.
Spawned workers are fresh interpreters (``python -c``), not multiprocessing children, so the
caller's ``__main__`` is never re-imported: a plain script without a ``__main__`` guard works too.

One pool serves a whole run (contract, determinism and contract_fuzz share it): :func:`shared_pool`
takes it from the run's :class:`~mmchaos.executors.resources.RunResources`, each check seeing it
through a :class:`PoolView` (its handler, its spec fields, its model clock).
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from typing import IO, Any, Protocol

from mmchaos.errors import TargetLoadError
from mmchaos.executors.jobs import Handler, JobResult, WorkerSpec, describe_exception, dispatch_job
from mmchaos.executors.resources import RunResources, shared
from mmchaos.timing import ModelClock

__all__ = [
    "InProcessRunner",
    "PoolView",
    "WorkerPool",
    "child_entry",
    "prefetch_pool",
    "shared_pool",
    "start_pool",
]

log = logging.getLogger(__name__)


# -- the worker side -----------------------------------------------------------------------------


def _limit_threads_env(env: dict[str, str], threads: int | None) -> None:
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if threads is None:
        return
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)


def _limit_memory(mb: int) -> None:
    if mb <= 0:
        return
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (mb << 20, resource.RLIM_INFINITY))
    except (ImportError, ValueError, OSError) as exc:  # not on every platform
        log.warning("cannot limit worker memory: %s", exc)


def child_entry(fd: int) -> None:
    """Entry point of a worker interpreter: the first message holds (spec, handler).

    The worker leaves with ``os._exit`` once told to stop: tearing down an interpreter that holds
    torch, transformers and a model takes 1.5-2 s, which the run would spend waiting in
    ``WorkerPool.close``, and the worker has nothing left to save (results went over the pipe).
    """
    conn = Connection(fd)
    spec, handler = conn.recv()
    _worker_main(conn, spec, handler)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _worker_main(conn: Connection, spec: WorkerSpec, handler: Handler) -> None:
    worker_loop(conn, spec, handler, None)


def worker_loop(conn: Connection, spec: WorkerSpec, handler: Handler, target: Any) -> None:
    """A worker's life: limits, the target (loaded now unless ``target``, a fork server's, is given),
    then jobs until told to stop. ``ready`` says whether the target was loaded here (``forked``)."""
    _limit_memory(spec.memory_limit_mb)
    try:
        import faulthandler

        faulthandler.enable()
    except (ImportError, RuntimeError, ValueError):  # no usable stderr
        pass
    start = time.perf_counter()
    forked = target is not None
    try:
        if target is None:
            from mmchaos.targets import TargetOptions, load_target

            target = load_target(spec.uri, TargetOptions(**spec.options))
        if spec.threads is not None and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(spec.threads)
    except BaseException as exc:
        conn.send(("load_error", describe_exception(exc)))
        return
    conn.send(("ready", {"pid": os.getpid(), "load_seconds": time.perf_counter() - start, "forked": forked}))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            return
        _, payload = msg
        began = time.perf_counter()
        try:
            value = handler(target, spec, payload)
        except BaseException as exc:  # a handler bug must still answer
            conn.send(("handler_error", describe_exception(exc)))
            continue
        conn.send(("result", value, time.perf_counter() - began))


# -- the parent side -----------------------------------------------------------------------------


class _Proc(Protocol):
    """What the pool uses of a worker process: a spawned ``Popen`` or a :class:`ForkedProcess`."""

    pid: int

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


class ForkServer(Protocol):
    """What the pool uses of the run's fork server (:class:`mmchaos.executors.forkserver.ForkServer`)."""

    def accepts(self, spec: WorkerSpec) -> bool: ...

    def spawn(self, conn_fd: int, log_fd: int) -> _Proc: ...


@dataclass
class _Slot:
    proc: _Proc
    conn: Connection
    started: float
    ready: bool = False
    job: int | None = None
    sent: float = 0.0
    load_seconds: float = 0.0
    log: IO[bytes] | None = None
    log_offset: int = 0

    def mark_sent(self) -> None:
        self.sent = time.monotonic()
        if self.log is not None:
            self.log_offset = os.fstat(self.log.fileno()).st_size

    def stderr_tail(self, limit: int = 4000) -> str:
        if self.log is None:
            return ""
        self.log.seek(self.log_offset)
        return self.log.read()[-limit:].decode("utf-8", "replace")

    def release(self) -> None:
        self.conn.close()
        if self.log is not None:
            self.log.close()


def _join(proc: _Proc, timeout: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout)


def _signal_name(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"{signal.Signals(-code).name} (exit {code})"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


class WorkerPool:
    """``workers`` processes running ``handler`` jobs against their own copy of the target."""

    def __init__(
        self,
        spec: WorkerSpec,
        handler: Handler,
        *,
        workers: int = 2,
        start_timeout: float = 300.0,
        forks: ForkServer | None = None,
    ) -> None:
        self.spec = spec
        self.handler = handler
        self.workers = max(1, workers)
        self.forks = forks if forks is not None and forks.accepts(spec) else None
        """The run's fork server, when it can fork this spec's workers (else they are spawned)."""
        self.start_timeout = start_timeout
        self._slots: list[_Slot] = []
        self.replacements = 0
        self.load_seconds: list[float] = []
        self.clock: ModelClock | None = None
        """Where jobs' busy intervals go (model time); set by whoever runs jobs now."""

    # lifecycle ---------------------------------------------------------------------------------

    def _spawn(self) -> _Slot:
        if self.forks is not None:
            try:
                return self._fork()
            except OSError as exc:
                logging.getLogger(__name__).warning(
                    "the worker server cannot fork (%s); workers load the target themselves now", exc
                )
                self.forks = None
        parent, child = mp.Pipe(duplex=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        _limit_threads_env(env, self.spec.threads)
        code = f"from mmchaos.executors.pool import child_entry; child_entry({child.fileno()})"
        log = tempfile.TemporaryFile(prefix="mmchaos-worker-")  # noqa: SIM115 - lives as long as the worker
        proc = subprocess.Popen(
            [sys.executable, "-c", code], pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL, stderr=log
        )
        child.close()
        parent.send((self.spec, self.handler))
        return _Slot(proc=proc, conn=parent, started=time.monotonic(), log=log)

    def _fork(self) -> _Slot:
        """A worker forked by the run's fork server: the target is loaded already."""
        assert self.forks is not None
        parent, child = mp.Pipe(duplex=True)
        stderr = tempfile.TemporaryFile(prefix="mmchaos-worker-")  # noqa: SIM115 - lives as long as the worker
        try:
            proc = self.forks.spawn(child.fileno(), stderr.fileno())
        except OSError:
            parent.close()
            stderr.close()
            raise
        finally:
            child.close()
        parent.send((self.spec, self.handler))
        return _Slot(proc=proc, conn=parent, started=time.monotonic(), log=stderr)

    def __enter__(self) -> WorkerPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start every worker and wait until each has loaded the target (or one failed to)."""
        self._slots = [self._spawn() for _ in range(self.workers)]
        self._await_ready()

    def _await_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while not all(s.ready for s in self._slots):
            pending = [s for s in self._slots if not s.ready]
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise TargetLoadError(
                    f"{self.spec.uri}: a worker did not load the target within {self.start_timeout:.0f} s"
                )
            for conn in wait([s.conn for s in pending], timeout=left):
                slot = next(s for s in pending if s.conn is conn)
                self._on_start_message(slot)

    def _on_start_message(self, slot: _Slot) -> None:
        try:
            kind, info = slot.conn.recv()
        except (EOFError, OSError):
            _join(slot.proc, 1.0)
            tail = slot.stderr_tail(600).strip().splitlines()[-3:]
            self.close()
            raise TargetLoadError(
                f"{self.spec.uri}: a worker died while loading the target ({_signal_name(slot.proc.returncode)})"
                + (f": {' | '.join(tail)}" if tail else "")
            ) from None
        if kind == "load_error":
            self.close()
            raise TargetLoadError(f"{self.spec.uri} cannot be loaded in a worker process: {info.short()}")
        slot.ready = True
        slot.load_seconds = float(info["load_seconds"])
        self.load_seconds.append(slot.load_seconds)

    def close(self) -> None:
        for slot in self._slots:
            try:
                if slot.proc.poll() is None and slot.job is None:
                    slot.conn.send(("stop", None))
            except (OSError, BrokenPipeError):
                pass
        for slot in self._slots:
            _join(slot.proc, 2.0)
            if slot.proc.poll() is None:
                slot.proc.kill()
                _join(slot.proc, 2.0)
            slot.release()
        self._slots = []

    def _replace(self, index: int) -> None:
        old = self._slots[index]
        if old.proc.poll() is None:
            old.proc.kill()
        _join(old.proc, 2.0)
        old.release()
        self._slots[index] = self._spawn()
        self.replacements += 1

    # running -----------------------------------------------------------------------------------

    def map(self, payloads: Sequence[Any], timeout: float) -> Iterator[tuple[int, JobResult]]:
        """Run every payload once, on whichever worker is free; yields (index, result) as done."""
        todo = list(range(len(payloads)))[::-1]
        remaining = len(payloads)
        while remaining:
            now = time.monotonic()
            for i, slot in enumerate(self._slots):
                if slot.ready and slot.job is None and todo:
                    slot.job = todo.pop()
                    slot.mark_sent()
                    try:
                        slot.conn.send(("job", payloads[slot.job]))
                    except (OSError, BrokenPipeError):
                        job = slot.job
                        slot.job = None
                        self._replace(i)
                        remaining -= 1
                        yield job, JobResult("crashed", detail="the worker had died before the job was sent")
            waits = [s.sent + timeout for s in self._slots if s.job is not None]
            waits += [s.started + self.start_timeout for s in self._slots if not s.ready]
            left = max(0.0, min(waits) - now) if waits else 0.0
            if not waits:
                # No worker busy or starting while jobs remain: every worker failed to restart.
                while todo:
                    remaining -= 1
                    yield todo.pop(), JobResult("error", detail="no worker could be (re)started")
                return
            ready_conns = wait([s.conn for s in self._slots], timeout=left)
            for conn in ready_conns:
                i = next(k for k, s in enumerate(self._slots) if s.conn is conn)
                for item in self._on_message(i, timeout):
                    remaining -= 1
                    yield item
            now = time.monotonic()
            for i, slot in enumerate(self._slots):
                if slot.job is not None and now - slot.sent > timeout:
                    job = slot.job
                    slot.job = None
                    tail = slot.stderr_tail()
                    self._replace(i)
                    remaining -= 1
                    detail = f"no answer within {timeout:g} s; worker killed"
                    yield job, JobResult("hung", seconds=now - slot.sent, detail=detail, stderr=tail)
                elif not slot.ready and now - slot.started > self.start_timeout:
                    self._replace(i)

    def _on_message(self, i: int, timeout: float) -> list[tuple[int, JobResult]]:
        slot = self._slots[i]
        try:
            kind, value, *rest = slot.conn.recv()
        except (EOFError, OSError):
            _join(slot.proc, 2.0)
            code = slot.proc.returncode
            job = slot.job
            elapsed = time.monotonic() - slot.sent
            tail = slot.stderr_tail()
            self._replace(i)
            if job is None:
                return []
            hint = " (killed: out of memory?)" if code == -signal.SIGKILL else ""
            result = JobResult("crashed", seconds=elapsed, exitcode=code, detail=_signal_name(code) + hint, stderr=tail)
            return [(job, result)]
        if not slot.ready:
            if kind == "load_error":
                log.warning("replacement worker failed to load %s: %s", self.spec.uri, value.short())
                _join(slot.proc, 2.0)
                slot.conn.close()
                self._slots.pop(i)
                return []
            slot.ready = True
            slot.load_seconds = float(value["load_seconds"])
            self.load_seconds.append(slot.load_seconds)
            return []
        job, slot.job = slot.job, None
        elapsed = time.monotonic() - slot.sent
        if job is None:
            return []
        if kind == "handler_error":
            return [
                (job, JobResult("error", error=value, seconds=elapsed, detail="the harness failed inside the worker"))
            ]
        busy = float(rest[0]) if rest else 0.0
        if self.clock is not None and busy > 0:
            now = time.perf_counter()
            self.clock.add(now - min(busy, elapsed), now)
        return [(job, JobResult("ok", value=value, seconds=elapsed, busy_seconds=busy))]

    def broadcast(self, payload: Any, timeout: float) -> list[JobResult]:
        """Run the same payload on every worker (for cross-process comparisons), in order."""
        self._await_ready()
        results: list[JobResult] = []
        for i in range(len(self._slots)):
            slot = self._slots[i]
            slot.job = 0
            slot.mark_sent()
            slot.conn.send(("job", payload))
        for i in range(len(self._slots)):
            slot = self._slots[i]
            if not slot.conn.poll(max(0.0, slot.sent + timeout - time.monotonic())):
                slot.job = None
                self._replace(i)
                results.append(JobResult("hung", detail=f"no answer within {timeout:g} s"))
                continue
            got = self._on_message(i, timeout)
            results.append(got[0][1] if got else JobResult("error", detail="no result"))
        return results


def start_pool(
    spec: WorkerSpec, handler: Handler, *, workers: int, start_timeout: float, forks: ForkServer | None = None
) -> WorkerPool:
    """A started pool, each worker with the target loaded; or :class:`TargetLoadError`.

    The error's message says that the target could not be loaded *in a worker by its URI*, which
    is what a check reports (and what a user fixes: a loadable URI, or in-process isolation).
    With ``forks`` (the run's fork server) the workers are forked with the target loaded already.
    """
    pool = WorkerPool(spec, handler, workers=workers, start_timeout=start_timeout, forks=forks)
    try:
        pool.start()
    except TargetLoadError as exc:
        raise TargetLoadError(
            f"the target cannot be loaded in a worker process by its URI {spec.uri!r}: {exc.message}"
        ) from exc
    return pool


class InProcessRunner:
    """The same interface in this process, for targets that cannot be loaded by URI.

    Weaker isolation: a crash takes the run down, and a hung call leaves a thread behind.
    """

    workers = 1

    def __init__(self, target: Any, spec: WorkerSpec, handler: Handler) -> None:
        self.target = target
        self.spec = spec
        self.handler = handler
        self.replacements = 0
        self.load_seconds: list[float] = []

    def __enter__(self) -> InProcessRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def map(self, payloads: Sequence[Any], timeout: float) -> Iterator[tuple[int, JobResult]]:
        for i, payload in enumerate(payloads):
            box: dict[str, Any] = {}

            def run(payload: Any = payload, box: dict[str, Any] = box) -> None:
                try:
                    box["value"] = self.handler(self.target, self.spec, payload)
                except BaseException as exc:
                    box["error"] = describe_exception(exc)

            start = time.monotonic()
            thread = threading.Thread(target=run, daemon=True, name="mmchaos-inprocess-job")
            thread.start()
            thread.join(timeout)
            elapsed = time.monotonic() - start
            if thread.is_alive():
                yield (
                    i,
                    JobResult("hung", seconds=elapsed, detail=f"no answer within {timeout:g} s (thread left running)"),
                )
            elif "error" in box:
                yield i, JobResult("error", error=box["error"], seconds=elapsed, detail="the harness failed")
            else:
                yield i, JobResult("ok", value=box["value"], seconds=elapsed)

    def broadcast(self, payload: Any, timeout: float) -> list[JobResult]:
        """This process is the only one: the payload once."""
        return [result for _, result in self.map([payload], timeout)]


# -- one pool for the whole run ------------------------------------------------------------------


class PoolView:
    """A shared :class:`WorkerPool` as one check sees it: its handler, its spec fields, its clock.

    ``replacements`` counts only the workers replaced while this check used the pool.
    """

    def __init__(
        self,
        pool: WorkerPool,
        handler: Handler,
        overlay: Mapping[str, Any] | None = None,
        clock: ModelClock | None = None,
    ) -> None:
        self.pool = pool
        self.handler = handler
        self.overlay = dict(overlay or {})
        self.clock = clock
        self._replacements_at_start = pool.replacements
        self.load_seconds = pool.load_seconds

    @property
    def replacements(self) -> int:
        return self.pool.replacements - self._replacements_at_start

    @property
    def workers(self) -> int:
        return self.pool.workers

    def _wrap(self, payload: Any) -> tuple[Handler, dict[str, Any], Any]:
        return (self.handler, self.overlay, payload)

    def map(self, payloads: Sequence[Any], timeout: float) -> Iterator[tuple[int, JobResult]]:
        self.pool.clock = self.clock
        try:
            yield from self.pool.map([self._wrap(p) for p in payloads], timeout)
        finally:
            self.pool.clock = None

    def broadcast(self, payload: Any, timeout: float) -> list[JobResult]:
        self.pool.clock = self.clock
        try:
            return self.pool.broadcast(self._wrap(payload), timeout)
        finally:
            self.pool.clock = None

    def close(self) -> None:
        """The run closes a shared pool, not a check (a no-op kept so callers need not care)."""


def _pool_key(spec: WorkerSpec, workers: int, resources: RunResources | None) -> tuple[Any, ...]:
    # Fresh-process workers are a pool of their own only where the others are forked: else both are
    # spawned interpreters, and one pool serves both.
    forks = getattr(resources, "fork_server", None)
    fresh = spec.fresh_process and forks is not None and forks.accepts(replace(spec, fresh_process=False))
    return ("worker_pool", spec.uri, json.dumps(spec.options, sort_keys=True, default=str), spec.threads,
            spec.memory_limit_mb, workers, fresh)  # fmt: skip


def _start_shared(
    spec: WorkerSpec, workers: int, start_timeout: float, resources: RunResources | None = None
) -> WorkerPool:
    forks = getattr(resources, "fork_server", None)
    return start_pool(spec, dispatch_job, workers=workers, start_timeout=start_timeout, forks=forks)


def prefetch_pool(resources: RunResources, spec: WorkerSpec, *, workers: int, start_timeout: float) -> None:
    """Start the run's shared pool for ``spec`` in the background (a check's ``prepare``)."""
    factory = lambda: _start_shared(spec, workers, start_timeout, resources)  # noqa: E731
    resources.prefetch(_pool_key(spec, workers, resources), factory, WorkerPool.close)


@contextlib.contextmanager
def shared_pool(
    resources: RunResources | None,
    spec: WorkerSpec,
    handler: Handler,
    *,
    workers: int,
    start_timeout: float,
    overlay: Mapping[str, Any] | None = None,
    clock: ModelClock | None = None,
) -> Iterator[PoolView]:
    """The run's worker pool for ``spec`` as a :class:`PoolView` running ``handler`` jobs: started once
    per run and shared by every check that asks for the same spec and size (started and closed here
    when there are no run ``resources``). Raises :class:`TargetLoadError` like :func:`start_pool`."""
    factory = lambda: _start_shared(spec, workers, start_timeout, resources)  # noqa: E731
    with shared(resources, _pool_key(spec, workers, resources), factory, WorkerPool.close) as (pool, _):
        yield PoolView(pool, handler, overlay, clock)
