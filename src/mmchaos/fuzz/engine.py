"""The fuzzing loop: mutate queued inputs, run them in isolated workers, keep what is new.

Guidance is a novelty signal, not code coverage: an input whose run shows a feature never seen
before (see :func:`mmchaos.fuzz.worker.probe_features`: what the reference decoder parsed or
refused, which typed code the target answered, the output's shape) joins the queue and is
mutated further. Every failure is judged (:mod:`.signature`), deduplicated by signature, and
its first input is minimised (:mod:`.minimise`). Budgets: cases and seconds, plus an optional
per-case gate (an HTTP target's request ledger). Deterministic for a seed and a case budget:
batches are built before they run and results are read back in batch order.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from mmchaos.executors.jobs import ErrorInfo, JobResult
from mmchaos.fuzz.minimise import MinimiseBudget, Minimiser
from mmchaos.fuzz.mutators import mutate
from mmchaos.fuzz.seeds import Seed
from mmchaos.fuzz.signature import Judgement, judge

__all__ = ["Failure", "FuzzConfig", "FuzzReport", "Fuzzer", "Runner"]

log = logging.getLogger(__name__)


class Runner(Protocol):
    """What runs jobs: a :class:`~mmchaos.executors.pool.WorkerPool`, the run's shared pool (``PoolView``)
    or an ``InProcessRunner``."""

    @property
    def replacements(self) -> int: ...

    def map(self, payloads: Sequence[Any], timeout: float) -> Iterator[tuple[int, JobResult]]: ...


@dataclass(frozen=True)
class FuzzConfig:
    max_cases: int = 3000
    max_seconds: float = 60.0
    timeout_s: float = 10.0
    batch: int = 32
    structured: float = 0.75
    """Probability that a mutation step is structure-aware (when one applies to the format)."""
    queue_limit: int = 512
    novelty: bool = True
    """Keep inputs that show a new feature in the queue (off: mutate the seeds only, for comparison)."""
    minimise: bool = True
    minimise_tests: int = 400
    minimise_seconds: float = 30.0
    max_minimised: int = 10
    """Distinct signatures minimised at most (the rest keep their original input)."""
    stop_after_failures: int = 0
    """Stop the mutation phase once this many distinct failures are known (0: use the whole budget)."""


@dataclass
class Failure:
    signature: str
    outcome: str
    detail: str
    kind: str
    data: bytes
    case_index: int
    seconds_to_find: float
    mutators: list[str]
    parent: str
    error: ErrorInfo | None = None
    stderr: str = ""
    hits: int = 1
    minimised: bytes | None = None
    minimise_tests: int = 0
    minimise_seconds: float = 0.0


@dataclass
class FuzzReport:
    cases: int = 0
    seconds: float = 0.0
    stopped_by: str = "cases"
    failures: dict[str, Failure] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)
    features: int = 0
    queue: int = 0
    seeds: int = 0
    minimise_tests: int = 0
    first_error: str = ""
    """The first harness error (a worker that could not run an input), if any."""

    @property
    def cases_per_s(self) -> float:
        return self.cases / self.seconds if self.seconds > 0 else 0.0

    @property
    def first_failure_s(self) -> float | None:
        return min((f.seconds_to_find for f in self.failures.values()), default=None)

    @property
    def first_failure_case(self) -> int | None:
        return min((f.case_index for f in self.failures.values()), default=None)


@dataclass
class _Entry:
    name: str
    kind: str
    data: bytes


@dataclass
class _Case:
    kind: str
    data: bytes
    parent: str
    mutators: list[str]


CaseGate = Callable[[], bool]
"""Called before each case (and each minimisation test) is sent; False stops: the budget is spent."""


class Fuzzer:
    """One fuzzing campaign over ``runner`` from ``seeds``."""

    def __init__(
        self,
        runner: Runner,
        seeds: Sequence[Seed],
        config: FuzzConfig,
        rng: np.random.Generator,
        *,
        gate: CaseGate | None = None,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        if not seeds:
            raise ValueError("the fuzzer needs at least one seed")
        self.runner = runner
        self.config = config
        self.rng = rng
        self.gate = gate
        self.on_progress = on_progress
        self.seeds = [_Entry(s.name, s.kind, s.data) for s in seeds]
        self.queue: list[_Entry] = list(self.seeds)
        self.seen: set[str] = set()
        self.report = FuzzReport(seeds=len(seeds))
        self._budget_spent = False

    # -- the loop ----------------------------------------------------------------------------------

    def run(self) -> FuzzReport:
        cfg = self.config
        start = time.monotonic()
        first = [_Case(s.kind, s.data, s.name, []) for s in self.seeds]
        pending: list[_Case] = first[: cfg.max_cases]
        while pending:
            pending = self._admit(pending)
            if not pending:
                self.report.stopped_by = "budget"
                break
            self._run_batch(pending, start)
            if self.report.cases >= cfg.max_cases:
                self.report.stopped_by = "cases"
                break
            if time.monotonic() - start >= cfg.max_seconds:
                self.report.stopped_by = "seconds"
                break
            if cfg.stop_after_failures and len(self.report.failures) >= cfg.stop_after_failures:
                self.report.stopped_by = "failures"
                break
            n = min(cfg.batch, cfg.max_cases - self.report.cases)
            pending = [self._next_case() for _ in range(n)]
        self.report.seconds = time.monotonic() - start
        self.report.features = len(self.seen)
        self.report.queue = len(self.queue)
        if cfg.minimise:
            self._minimise_all()
        return self.report

    def _admit(self, cases: list[_Case]) -> list[_Case]:
        """The cases the gate lets through (all, unless a request budget runs out)."""
        if self.gate is None:
            return cases
        admitted = []
        for case in cases:
            if not self.gate():
                self._budget_spent = True
                break
            admitted.append(case)
        return admitted

    def _next_case(self) -> _Case:
        # Half the parents are seeds, half the inputs novelty kept: shallow bugs (one mutation from
        # a seed) stay as likely as without guidance, and deeper ones get mutation stacks to grow on.
        kept = self.queue[len(self.seeds) :]
        pool = kept if kept and self.rng.random() < 0.5 else self.seeds
        parent = pool[int(self.rng.integers(len(pool)))]
        donors = [e.data for e in self.seeds if e.kind == parent.kind]
        data, names = mutate(self.rng, parent.data, parent.kind, donors, structured=self.config.structured)
        return _Case(parent.kind, data, parent.name, names)

    def _run_batch(self, cases: list[_Case], start: float) -> None:
        results: dict[int, JobResult] = {}
        for i, job in self.runner.map([(c.kind, c.data) for c in cases], self.config.timeout_s):
            results[i] = job
        for i, case in enumerate(cases):
            verdict = judge(case.kind, results[i])
            if verdict.outcome == "not_applicable":
                continue
            self.report.cases += 1
            self.report.outcomes[verdict.outcome] += 1
            if verdict.failed:
                self._record(case, verdict, results[i], time.monotonic() - start)
            elif verdict.outcome in ("ok", "rejected"):
                self._learn(case, results[i])
            elif verdict.outcome == "error" and not self.report.first_error:
                self.report.first_error = verdict.detail
        if self.on_progress is not None:
            self.on_progress(len(cases))

    def _learn(self, case: _Case, job: JobResult) -> None:
        feats = [f"{case.kind}|{f}" for f in job.value.get("features", ())]
        new = [f for f in feats if f not in self.seen]
        if not new:
            return
        self.seen.update(new)
        if self.config.novelty and case.mutators and len(self.queue) < self.config.queue_limit:
            name = f"{case.parent}+{'+'.join(case.mutators)}"[:120]
            self.queue.append(_Entry(name, case.kind, case.data))

    def _record(self, case: _Case, verdict: Judgement, job: JobResult, elapsed: float) -> None:
        known = self.report.failures.get(verdict.signature)
        if known is not None:
            known.hits += 1
            return
        log.info("fuzz: new failure %s after %d cases", verdict.signature, self.report.cases)
        self.report.failures[verdict.signature] = Failure(
            signature=verdict.signature,
            outcome=verdict.outcome,
            detail=verdict.detail,
            kind=case.kind,
            data=case.data,
            case_index=self.report.cases,
            seconds_to_find=elapsed,
            mutators=case.mutators,
            parent=case.parent,
            error=verdict.error,
            stderr=job.stderr,
        )

    # -- minimisation ------------------------------------------------------------------------------

    def _minimise_all(self) -> None:
        cfg = self.config
        for failure in list(self.report.failures.values())[: cfg.max_minimised]:
            if self._budget_spent:
                break
            started = time.monotonic()
            budget = MinimiseBudget(max_tests=cfg.minimise_tests, max_seconds=cfg.minimise_seconds)
            minimiser = Minimiser(self._same_failure(failure), budget)
            failure.minimised = minimiser.minimise(failure.data)
            failure.minimise_tests = minimiser.tests
            failure.minimise_seconds = time.monotonic() - started
            self.report.minimise_tests += minimiser.tests

    def _same_failure(self, failure: Failure) -> Callable[[list[bytes]], list[bool]]:
        def test(candidates: list[bytes]) -> list[bool]:
            admitted = candidates
            if self.gate is not None:
                admitted = []
                for c in candidates:
                    if not self.gate():
                        self._budget_spent = True
                        break
                    admitted.append(c)
            answers = [False] * len(candidates)
            payloads = [(failure.kind, c) for c in admitted]
            for i, job in self.runner.map(payloads, self.config.timeout_s):
                answers[i] = judge(failure.kind, job).signature == failure.signature
            return answers

        return test
