"""Run a suite against a target, committing each finished check to the store as it completes.

This is the whole of ``mmchaos validate`` minus printing: the CLI is a thin layer over
:func:`run_suite`, and a Python user can call it directly.
"""

from __future__ import annotations

import contextlib
import logging
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

from mmchaos import __version__
from mmchaos.checks.base import AnyCheck, CheckContext, NullProgress, ProgressSink
from mmchaos.data import Dataset, load_dataset
from mmchaos.errors import ConfigError, DataError, StoreError
from mmchaos.executors import Executor, ExecutorSpec, LazyExecutor, StoreJournal, TargetSpec, open_executor
from mmchaos.executors.forked import ForkedUnitExecutor
from mmchaos.executors.forkserver import ForkServer, fork_enabled
from mmchaos.executors.resources import RunResources
from mmchaos.findings import Finding, Severity, Verdict
from mmchaos.store import RunRecord, RunStore, new_run_id
from mmchaos.suites import SuiteSpec, build_checks
from mmchaos.targets import Target, TargetOptions, load_target, resolve_target_options
from mmchaos.targets.base import Capability
from mmchaos.targets.wrappers import DelegatingTarget
from mmchaos.timing import ModelClock

__all__ = ["RunConfig", "RunObserver", "RunResult", "TimedTarget", "default_data", "run_suite"]

log = logging.getLogger(__name__)

R = TypeVar("R")

NOT_RUN_CODES = frozenset({"processor_unfit"})
"""Error codes that mean "this check cannot run on the pipeline as shipped", not "the target broke"."""


LEGACY_OPTION_DEFAULTS: dict[str, Any] = {
    "trust_remote_code": False,
    "use_safetensors": True,
    "device": "cpu",
    "model": None,
    "allow_remote": False,
    "allow_missing_weights": False,
    "threads": None,
}
"""The one options bag runs stored before per-scheme options (``config["options"]``) held, with its
defaults: a stored value equal to its default was never given, so it is dropped on migration."""


@dataclass
class RunConfig:
    """Everything that determines a run; stored with it so a resume uses the same inputs.

    ``options`` are the target options as given (checked against the scheme when the target
    loads); they are stored as ``target_options``."""

    target: str
    suite: SuiteSpec
    data: str | None = None
    seed: int | None = None
    options: TargetOptions = field(default_factory=TargetOptions)
    reference: str | None = None
    """The target the deployment is judged against (``--reference``), loaded with its scheme's defaults."""

    def __post_init__(self) -> None:
        if not isinstance(self.options, TargetOptions):  # a plain dict from a Python caller
            self.options = TargetOptions(self.options)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "suite": self.suite.model_dump(),
            "data": self.data,
            "seed": self.seed,
            "target_options": self.options.to_dict(),
            "reference": self.reference,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """The config of a stored run; a run stored before per-scheme options is migrated."""
        if "target_options" in data:
            options = dict(data["target_options"] or {})
        else:
            old = dict(data.get("options") or {})
            options = {k: v for k, v in old.items() if LEGACY_OPTION_DEFAULTS.get(k, ...) != v}
        return cls(
            target=data["target"],
            suite=SuiteSpec.model_validate(data["suite"]),
            data=data.get("data"),
            seed=data.get("seed"),
            options=TargetOptions(options),
            reference=data.get("reference"),
        )

    @property
    def effective_seed(self) -> int:
        return self.seed if self.seed is not None else self.suite.seed


def _resolved_options(config: RunConfig, run_id: str, resuming: bool) -> dict[str, Any]:
    """The run's target options checked against the target's scheme (bad ones: exit 2 before any
    work starts); for a stored run, options its scheme no longer takes refuse the resume."""
    try:
        return resolve_target_options(config.target, config.options).load_options
    except ConfigError as exc:
        if not resuming:
            raise
        raise StoreError(
            f"run {run_id} was stored with target options that {config.target} no longer takes ({exc}); "
            "start a new run instead of resuming",
            code="store_options_outdated",
        ) from None


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a stored run: its finished checks are in the store and ``run_id`` resumes it.

    A KeyboardInterrupt still (callers that stop on one keep doing so), with the id the CLI needs
    to say how to go on."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


class RunObserver(Protocol):
    """Told where a run stands (the CLI draws a progress bar from it)."""

    def planned(self, check_ids: list[str], done: set[str]) -> None:
        """The suite's checks in order, and those a resumed run already has."""

    def started(self, check_id: str) -> None:
        """A check begins."""

    def finished(self, check_id: str, findings: list[Finding]) -> None:
        """A check ended and its findings are committed to the store."""


@dataclass
class RunResult:
    run_id: str
    findings: list[Finding]
    resumed_checks: list[str]

    @property
    def gates_passed(self) -> bool:
        return not any(f.verdict in (Verdict.FAIL, Verdict.ERROR) for f in self.findings)


class TimedTarget(DelegatingTarget):
    """Measures the time the target's model was busy (model time) during one check.

    Calls from any thread (the check's, the reference server's) and intervals reported by worker
    processes go to one :class:`~mmchaos.timing.ModelClock`, so concurrent calls count once.
    """

    def __init__(self, inner: Target, clock: ModelClock | None = None) -> None:
        super().__init__(inner)
        self.clock = clock if clock is not None else ModelClock()

    @property
    def seconds(self) -> float:
        return self.clock.seconds

    @property
    def calls(self) -> int:
        return self.clock.calls

    def call(self, fn: Callable[..., R], *args: Any) -> R:
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.clock.time(start)


def default_data(target: Target) -> str:
    """The built-in dataset that fits a target: text lines for readers, questions for generative
    VLMs, shapes otherwise."""
    if target.has(Capability.READ_TEXT):
        return "builtin:textlines"
    if target.has(Capability.GENERATE) and not target.has(Capability.EMBED_IMAGE):
        return "builtin:vqa"
    return "builtin:shapes"


def _load_data(spec: str) -> Dataset:
    """The run's dataset; an unreadable file is bad input (exit 2), not an internal error."""
    try:
        return load_dataset(spec)
    except OSError as exc:
        where = exc.filename or spec
        raise DataError(f"cannot read --data {where}: {exc.strerror or exc}", code="data_unreadable") from exc


def environment() -> dict[str, Any]:
    import numpy

    return {
        "mmchaos": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "numpy": numpy.__version__,
        "argv": sys.argv[1:],
    }


def run_suite(
    config: RunConfig | None,
    store: RunStore,
    *,
    resume: str | None = None,
    progress: ProgressSink | None = None,
    on_check: Callable[[str, list[Finding]], None] | None = None,
    observer: RunObserver | None = None,
    executor: ExecutorSpec | None = None,
) -> RunResult:
    """Run ``config`` (or resume run ``resume`` with its stored config) and return its findings.

    ``executor`` says where checks run their work units (default: in this process); it does not
    change the findings, so a run may be resumed on another executor.
    """
    progress = progress or NullProgress()
    if resume is not None:
        run_id = store.resolve(resume)
        config = RunConfig.from_dict(store.get_run(run_id).config)
    elif config is None:
        raise ValueError("give a config or a run to resume")
    else:
        run_id = new_run_id()
    load_options = _resolved_options(config, run_id, resume is not None)
    checks = build_checks(config.suite)
    pool: LazyExecutor | None = None
    if executor is not None and executor.kind != "local":
        # Opened by the first check that maps work units (a suite without one never starts Ray);
        # known to prepare() already, so a check whose work goes to Ray starts no local pool.
        where, uri, options = executor, config.target, config.options
        pool = LazyExecutor(where.kind, lambda: open_executor(where, TargetSpec(uri, options, data_spec)))
    resources = RunResources()  # one reference server, one worker pool, ... for the whole run
    # Pool workers forked from a server holding the loaded target (no second import and load) need
    # no early start; spawned ones start early so that their load overlaps this process's.
    forking = pool is None and fork_enabled(config.target)
    try:
        early: set[Any] = set()
        if resume is None and not forking:
            early = _prepare_early(checks, config, load_options, resources, pool)
        loading = time.perf_counter()
        target = load_target(config.target, config.options)
        load_seconds = time.perf_counter() - loading  # its framework's import and the weights: a floor's cost too
    except BaseException:
        resources.close()
        raise
    try:
        reference = load_target(config.reference) if config.reference else None
    except BaseException:
        resources.close()
        target.close()
        raise
    units: ForkedUnitExecutor | None = None  # work units of parallel_units checks on forked workers
    stored: bool = resume is not None  # whether the store holds the run (a Ctrl-C then leaves it resumable)
    try:
        data_spec = config.data or default_data(target)
        dataset = _load_data(data_spec)
        if forking:  # now: before this process has run the model (see mmchaos.executors.forkserver)
            resources.fork_server = ForkServer.start(target, dataset)
        units = ForkedUnitExecutor.for_run(resources.fork_server, target)
        fingerprint = target.fingerprint().to_dict()
        if resume is None:
            store.create_run(
                RunRecord(
                    run_id=run_id,
                    created=time.time(),
                    finished=None,
                    status="running",
                    target_uri=config.target,
                    suite_name=config.suite.name,
                    config=config.to_dict(),
                    target=target.describe(),
                    dataset=dataset.describe(),
                    environment=environment() | {"target_load_seconds": round(load_seconds, 3)},
                ),
                [cid for cid, _ in checks],
            )
            stored = True
        else:
            recorded = store.get_run(run_id).target.get("fingerprint", {})
            if recorded.get("digest") and recorded["digest"] != fingerprint["digest"]:
                raise StoreError(
                    f"run {run_id} was made with target fingerprint {recorded['digest']}, but {config.target} "
                    f"now has {fingerprint['digest']}; start a new run instead of resuming"
                )
            store.update_run(run_id, status="running")
        done = {c.check_id for c in store.checks(run_id) if c.status == "done"}
        if observer is not None:
            observer.planned([cid for cid, _ in checks], done & {cid for cid, _ in checks})
        pending = [(cid, check) for cid, check in checks if cid not in done]
        _prepare(pending, target, dataset, config.effective_seed, resources, pool, reference)
        for key in early - resources.wanted:  # started for a check that turned out not to need it
            resources.discard(key)
        for check_id, check in checks:
            if check_id in done:
                log.info("resume: %s already done", check_id)
                continue
            if observer is not None:
                observer.started(check_id)
            store.mark_started(run_id, check_id)
            findings, timed, wall = _run_one(
                check_id, check, target, dataset, config.effective_seed, progress, resources,
                executor=pool, journal=StoreJournal(store, run_id, check_id), reference=reference,
                unit_executor=units if check.parallel_units else None,
            )  # fmt: skip
            if pool is not None and pool.error is not None:
                raise pool.error  # the executor could not open: the run's usage error, not this check's
            store.commit_check(
                run_id, check_id, findings, wall_seconds=wall, model_seconds=timed.seconds, model_calls=timed.calls
            )
            if on_check is not None:
                on_check(check_id, findings)
            if observer is not None:
                observer.finished(check_id, findings)
        store.update_run(run_id, status="complete", finished=time.time())
    except KeyboardInterrupt:
        if not stored:
            raise  # interrupted before the run was stored: nothing to resume
        with contextlib.suppress(Exception):  # the store keeps the finished checks either way
            store.update_run(run_id, status="interrupted")
        raise RunInterrupted(run_id) from None
    finally:
        if pool is not None:
            pool.close()
        if units is not None:
            units.close()
        resources.close()
        target.close()
        if reference is not None:
            reference.close()
    return RunResult(run_id, store.findings(run_id), sorted(done))


_EARLY_SCHEMES = ("builtin", "hf", "onnx")
"""Targets whose worker spec is known before loading them (their load options are the run's options)."""


def _prepare_early(
    checks: list[tuple[str, AnyCheck]],
    config: RunConfig,
    load_options: dict[str, Any],
    resources: RunResources,
    executor: Executor | None = None,
) -> set[Any]:
    """Let checks start what they share (the worker pool: interpreters importing torch and loading the
    model) while this process loads the target, on a stand-in with the run's URI and options.

    Returns the keys started; :func:`_prepare` on the real target then claims the right ones and
    the run discards the others (a check the target turns out not to support)."""
    if config.target.partition(":")[0] not in _EARLY_SCHEMES:
        return set()
    standin = Target()
    standin.uri = config.target
    standin.load_options = dict(load_options)  # what load_target will record on the real target
    standin.capabilities = frozenset(Capability)
    nothing = cast("Dataset", None)  # prepare() must not touch the data (it has not been loaded yet)
    for check_id, check in checks:
        ctx = CheckContext(
            target=standin, dataset=nothing, seed=0, check_id=check_id, resources=resources, executor=executor
        )
        try:
            check.prepare(ctx)
        except Exception:
            log.debug("early prepare of %s raised", check_id, exc_info=True)
    started = set(resources.wanted)
    resources.wanted.clear()
    return started


def _prepare(
    checks: list[tuple[str, AnyCheck]],
    target: Target,
    dataset: Dataset,
    seed: int,
    resources: RunResources,
    executor: Executor | None = None,
    reference: Target | None = None,
) -> None:
    """Let every check that will run start its shared resources in the background (a worker pool
    loading the model overlaps with the in-process checks before the one that needs it)."""
    for check_id, check in checks:
        if check.missing_capabilities(target) is not None:
            continue
        ctx = CheckContext(
            target=target, dataset=dataset, seed=seed, check_id=check_id, resources=resources, executor=executor,
            reference=reference,
        )  # fmt: skip
        try:
            check.prepare(ctx)
        except Exception:  # the check itself will meet (and report) the same problem when it runs
            log.debug("prepare of %s raised", check_id, exc_info=True)


def _run_one(
    check_id: str,
    check: AnyCheck,
    target: Target,
    dataset: Dataset,
    seed: int,
    progress: ProgressSink,
    resources: RunResources | None = None,
    *,
    executor: Executor | None = None,
    journal: StoreJournal | None = None,
    reference: Target | None = None,
    unit_executor: ForkedUnitExecutor | None = None,
) -> tuple[list[Finding], TimedTarget, float]:
    """Run one check; whatever it raises becomes an error finding (the harness outlives the target)."""
    timed = TimedTarget(target)
    start = time.perf_counter()
    why_not = check.missing_capabilities(target)
    if why_not is not None:
        skipped = Finding(check_id, check.step, Verdict.SKIPPED, f"skipped: {why_not}", message=why_not)
        return [skipped], timed, 0.0
    ctx = CheckContext(
        target=timed, dataset=dataset, seed=seed, check_id=check_id, progress=progress, resources=resources,
        executor=executor, journal=journal, reference=reference, unit_executor=unit_executor,
    )  # fmt: skip
    findings: list[Finding] = []
    try:
        findings.extend(check.run(ctx))
    except Exception as exc:
        log.debug("check %s raised", check_id, exc_info=True)
        if getattr(exc, "code", None) in NOT_RUN_CODES:
            # The target cannot serve this check as shipped (fingerprint_match reports why as a
            # failure); the other checks say "not run" with the reason instead of an error.
            why = str(exc)[:1000]
            findings.append(Finding(check_id, check.step, Verdict.SKIPPED, why[:300], message=why))
            return findings, timed, time.perf_counter() - start
        findings.append(
            Finding(
                check_id,
                check.step,
                Verdict.ERROR,
                f"{check_id} could not finish: {type(exc).__name__}",
                severity=Severity.HIGH,
                message=f"{type(exc).__name__}: {exc}"[:1000],
                suggestion="the target raised during a normal call; see the trace in the evidence",
                evidence={"traceback": traceback.format_exc()[-4000:]},
            )
        )
    return findings, timed, time.perf_counter() - start
