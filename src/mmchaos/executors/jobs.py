"""Isolated jobs: how a worker is specified, what a job's outcome is, and what runs jobs.

A *job* is one call of a module-level handler, ``handler(target, spec, payload)``, inside a worker
that loaded the target by URI (:mod:`mmchaos.executors.pool`, or a Ray actor's pool). What comes
back is a :class:`JobResult` whatever happened: an answer, the worker dying (``crashed``), no
answer in time (``hung``). These are the types every runner of jobs and every check that judges
them share, kept apart from the pool so importing them starts nothing.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from mmchaos.errors import MMChaosError

__all__ = [
    "ErrorInfo",
    "Handler",
    "JobResult",
    "JobRunner",
    "WorkerSpec",
    "describe_exception",
    "dispatch_job",
    "shared_spec",
    "worker_spec",
]


@dataclass(frozen=True)
class WorkerSpec:
    """How to start a worker: which target, with which limits."""

    uri: str
    options: dict[str, Any] = field(default_factory=dict)
    threads: int | None = 1
    """Intra-op threads per worker (torch, OpenMP, ONNX Runtime); None leaves the defaults."""
    memory_limit_mb: int = 0
    """Address-space limit of each worker (RLIMIT_AS); 0 means none."""
    accepted_errors: tuple[str, ...] = ()
    """Exception class names that count as a clean, typed rejection besides MMChaosError."""
    context: dict[str, Any] = field(default_factory=dict)
    """Read-only data every job may use (e.g. the contract corpus base picture)."""
    fresh_process: bool = False
    """Each worker a fresh interpreter that loads the target itself, never a fork of a loaded one
    (:mod:`mmchaos.executors.forkserver`): a cross-process comparison must see what a process or a
    load draws at random (a salted ``hash()``, weights initialised at load) differ between workers."""


@dataclass
class ErrorInfo:
    type: str
    message: str
    typed: bool
    code: str = ""
    traceback: str = ""

    def short(self) -> str:
        code = f"[{self.code}]" if self.code else ""
        return f"{self.type}{code}: {self.message}"[:300]


@dataclass
class JobResult:
    """What became of one job. ``status``: ok, raised, crashed, hung, error (harness problem)."""

    status: str
    value: Any = None
    error: ErrorInfo | None = None
    seconds: float = 0.0
    exitcode: int | None = None
    detail: str = ""
    stderr: str = ""
    """What the worker wrote to stderr while running this job (a crash's Python-level trace)."""
    busy_seconds: float = 0.0
    """Time the handler ran inside the worker (the model's time, without the pipe's)."""


def describe_exception(exc: BaseException, accepted: Sequence[str] = ()) -> ErrorInfo:
    cls = type(exc)
    qual = f"{cls.__module__}.{cls.__qualname__}"
    typed = isinstance(exc, MMChaosError) or cls.__name__ in accepted or qual in accepted
    return ErrorInfo(
        type=cls.__name__ if cls.__module__ in ("builtins", "mmchaos.errors") else qual,
        message=str(exc)[:2000],
        typed=typed,
        code=str(getattr(exc, "code", "") or ""),
        traceback="".join(traceback.format_exception(exc))[-6000:],
    )


Handler = Callable[[Any, WorkerSpec, Any], Any]
"""``handler(target, spec, payload)`` runs one job inside a worker and returns a picklable value."""


class JobRunner(Protocol):
    """What runs jobs: the run's pool (``PoolView``), a Ray pool, or an ``InProcessRunner``."""

    @property
    def replacements(self) -> int: ...

    @property
    def load_seconds(self) -> list[float]: ...

    def map(self, payloads: Sequence[Any], timeout: float) -> Iterator[tuple[int, JobResult]]:
        """Every payload once, on whichever worker is free: ``(index, result)`` as they finish."""

    def broadcast(self, payload: Any, timeout: float) -> list[JobResult]:
        """The same payload once in each of the runner's worker processes (cross-process comparisons)."""


def dispatch_job(target: Any, spec: WorkerSpec, payload: tuple[Handler, dict[str, Any], Any]) -> Any:
    """Worker handler of a shared pool: each job names its own handler and the spec fields it needs
    (a check's context and accepted errors), so checks with different jobs share the workers."""
    handler, overlay, inner = payload
    return handler(target, replace(spec, **overlay) if overlay else spec, inner)


def worker_spec(target: Any, options: Mapping[str, Any] | None = None, **fields: Any) -> WorkerSpec:
    """How to load ``target`` again in a worker: its URI, its load options overlaid by ``options``.

    ``target`` is the real target (unwrapped), since workers load it by URI; ``fields`` are the
    other :class:`WorkerSpec` fields (threads, memory limit, accepted errors, context).
    """
    merged = {**dict(getattr(target, "load_options", None) or {}), **dict(options or {})}
    return WorkerSpec(uri=str(target.uri), options=merged, **fields)


def shared_spec(
    target: Any, options: Mapping[str, Any] | None = None, *, threads: int | None = 1, memory_limit_mb: int = 0
) -> WorkerSpec:
    """The spec of the run's shared pool: one thread per worker (two workers on a small machine must
    not oversubscribe it), the memory limit on CPU only (accelerator runtimes reserve huge ranges)."""
    merged = {**dict(getattr(target, "load_options", None) or {}), **dict(options or {})}
    on_cpu = str(merged.get("device", "cpu")).startswith("cpu")
    limit = memory_limit_mb if on_cpu else 0
    return WorkerSpec(uri=str(target.uri), options=merged, threads=threads, memory_limit_mb=limit)
