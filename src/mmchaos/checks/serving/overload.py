"""``serving_overload``: concurrency raised step by step until the SLO breaks (the knee).

The gate asks for a knee at or above the concurrency the deployment must carry and for overload
that fails gracefully past it (typed 429/503/504, Retry-After on 429/503, goodput held), then recovery:
the SLO met again within ``max_recovery_s`` once the ramp's backlog is drained at the rate the service
showed (see :class:`Drain`), so a loaded machine's longer drain is not taken for a failure to recover."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import AliasChoices, Field, field_validator

from mmchaos.chaos.experiment import Experiment, jsonable
from mmchaos.chaos.spec import ServingParams
from mmchaos.chaos.windows import Phase
from mmchaos.checks.base import Check, CheckContext, Gate
from mmchaos.checks.serving._common import (
    EMBEDS,
    experiment_finding,
    measured,
    transport_errors,
)
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability

if TYPE_CHECKING:
    from mmchaos.chaos.load import LoadResult

__all__ = ["Drain", "ServingOverload", "drain_allowance"]


class ServingOverloadParams(ServingParams):
    concurrency_steps: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64], min_length=1)
    step_s: float = Field(
        1.0, gt=0.0, le=600.0, description="seconds a step runs at least long enough to see the SLO's p99 twice"
    )
    steps_past_knee: int = Field(1, ge=0, le=10, description="steps run after the SLO broke, to see how it fails")

    @field_validator("concurrency_steps")
    @classmethod
    def _increasing(cls, value: list[int]) -> list[int]:
        if any(c < 1 for c in value) or value != sorted(set(value)):
            raise ValueError("concurrency_steps must be increasing positive integers")
        return value


class ServingOverloadGate(Gate):
    min_knee_concurrency: int = Field(1, ge=0, description="the SLO must hold at least up to this concurrency")
    typed_errors: bool = Field(True, description="overload answers are OpenAI error JSON (429/503/504)")
    retry_after: bool = Field(True, description="429 and 503 answers carry Retry-After")
    min_answer_rate_ratio: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        # the name it had while collapse was judged on answers within the SLO (see _completion_rate)
        validation_alias=AliasChoices("min_answer_rate_ratio", "min_goodput_ratio"),
        description="successful answers per second at the first breaking step, relative to at the knee (no collapse)",
    )


def _step_seconds(p: ServingOverloadParams) -> float:
    """A step shorter than the SLO's p99 cannot see it broken: requests queued behind a slow model
    (a VLM generating) are cut off at the step's end before they could be late. So a step lasts at
    least twice the p99 target; steps that meet the SLO still end early once that is decided."""
    return max(p.step_s, 2.0 * p.slo.p99_ms / 1000.0)


@dataclass(frozen=True)
class Drain:
    """What the service is granted, on top of ``max_recovery_s``, to finish the ramp's backlog.

    The requests in flight when the last step ended were accepted by the service; a correct one
    finishes (or drops) them before new requests get through, at the rate it showed in that very
    step. On an idle machine that takes a fraction of a second; on a loaded one the same service
    takes several times longer. Judging recovery after this measured drain, not after a fixed
    time alone, keeps a correct service passing on both, while a service that stays broken after
    the ramp never meets its SLO, however long it is given.

    Recovery is timed to the first good *answer*, so the first recovery request's own service time
    is granted too (``answer_s``: the slowest good answer of the ramp's lowest step, unqueued, on this
    machine at this moment). Without it a model slower than ``max_recovery_s`` a call could never
    recover, and whether a correct one did hung on how much backlog the ramp happened to leave (a
    batching server can clear all of it within the step's drain; it failed CI that way)."""

    backlog: int
    rate_rps: float
    drain_s: float
    answer_s: float
    cap_s: float

    @property
    def seconds(self) -> float:
        """The whole allowance: the backlog's drain and one answer, at most ``cap_s``."""
        return min(self.cap_s, self.drain_s + self.answer_s)

    def describe(self) -> str:
        answer = f"{self.answer_s:.2f} s for one answer"
        if not self.backlog:
            return answer
        return f"{self.drain_s:.2f} s to drain {self.backlog} requests at {self.rate_rps:.1f} good req/s + {answer}"


def _good_rate(result: LoadResult) -> float:
    """Good answers per second over the whole step (its pipeline fill included: the lower, safer rate)."""
    return result.good / result.duration_s if result.duration_s > 0 else 0.0


def drain_allowance(steps: list[LoadResult], max_recovery_s: float, request_timeout_s: float) -> Drain:
    """The drain of the last step's backlog (its requests still in flight when the step's own drain,
    the SLO's p99 bound, ran out: cancelled, though the service still works on them) at the rate
    that step answered (the lowest rate of the ramp when it had too few good answers to measure one),
    plus one answer's time (the p99 of the first step's good answers).

    At most twice the longer of ``max_recovery_s`` and the request timeout: a backlog that takes
    longer than that to clear is a recovery problem of its own (and the phase stays bounded)."""
    cap = 2.0 * max(max_recovery_s, request_timeout_s)
    if not steps:
        return Drain(0, 0.0, 0.0, 0.0, cap)
    answer_s = (steps[0].ok_latency.p99_ms or 0.0) / 1000.0
    last = steps[-1]
    backlog = int(last.cancelled)
    rates = [_good_rate(r) for r in steps if r.good >= 3]
    rate = _good_rate(last) if last.good >= 3 else min(rates, default=0.0)
    if not backlog:
        return Drain(0, rate, 0.0, answer_s, cap)
    return Drain(backlog, rate, cap if rate <= 0 else min(cap, backlog / rate), answer_s, cap)


def _completion_rate(result: LoadResult, *, within_slo: bool) -> float:
    """Answers per second from the step's first such completion to its end: a short step's pipeline
    fill (a deep queue's first answer takes one whole wait) does not count against it. (Between the
    first and the last completion instead, three answers of a collapsed service that came within
    milliseconds of each other read as 12 times the knee's rate.)

    ``within_slo``: good answers (within the SLO's latency), the knee's goodput. Otherwise every
    successful answer (the client got it before its timeout), which is what collapse is judged on.
    Past the knee a FIFO service that queues without shedding answers at its full rate, with every
    closed-loop client waiting about concurrency / rate (Little's law): how many of those waits fall
    under the SLO's latency is decided by the machine's speed, right at the first step that breaks
    the SLO. Judged on answers within the SLO, the same server passed (40.0 vs 55.9 good req/s) and
    failed (30.6 vs 69.5) the prelaunch suite's overload on one machine. A service that collapses
    answers fewer requests as load grows: its work thrashes, or requests time out and are errors."""
    done = sorted(r.start + r.latency for r in result.records if (r.good if within_slo else r.ok))
    if len(done) >= 2 and result.duration_s > done[0]:
        return (len(done) - 1) / (result.duration_s - done[0])
    if result.duration_s <= 0:
        return 0.0
    return len(done) / result.duration_s


class ServingOverload(Check[ServingOverloadParams, ServingOverloadGate]):
    """Raise concurrency until the SLO breaks: the knee, how overload fails, and recovery after it."""

    name = "serving_overload"
    step = Step.SERVING
    requires = (*EMBEDS, frozenset({Capability.GENERATE}))  # generative targets: chat completions

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        g = self.gate
        bar = ctx.progress.task(f"{ctx.check_id}: ramp", total=len(p.concurrency_steps) + 1)
        steps: list[tuple[int, Phase]] = []
        recovery_s: float | None = None
        recovery: Phase | None = None
        drain: Drain | None = None
        ex = Experiment(
            ctx, p, title="overload ramp", description="closed-loop concurrency raised until the SLO breaks"
        )
        try:
            with ex:
                ex.warmup()
                past = -1
                for c in p.concurrency_steps:
                    if ex.stopped:
                        break
                    # A step that meets the SLO ends once that is decided (SPRT, after sequential.min_s);
                    # a breaking step runs its full length: its goodput is judged.
                    ph = ex.phase(
                        f"concurrency={c}",
                        seconds=_step_seconds(p),
                        guarded=False,
                        concurrency=c,
                        stop_when=ex.decided(only="met"),
                    )
                    if ph.result is None:
                        break
                    steps.append((c, ph))
                    bar.advance()
                    if past >= 0 or not ph.met(ex.slo):
                        past += 1
                        if past >= p.steps_past_knee:
                            break
                if steps and not ex.stopped:
                    drain = drain_allowance(
                        [ph.result for _, ph in steps if ph.result], p.max_recovery_s, p.request_timeout_s
                    )
                    recovery, recovery_s = ex.recover("after_ramp:recovery", allowance_s=drain.seconds)
                bar.advance()
        finally:
            bar.close()
        if steps:
            yield from self._findings(ctx, ex, steps, recovery, recovery_s, drain, g)
        yield experiment_finding(self, ctx, ex, title="overload experiment")

    def _findings(
        self,
        ctx: CheckContext,
        ex: Experiment,
        steps: list[tuple[int, Phase]],
        recovery: Phase | None,
        recovery_s: float | None,
        drain: Drain | None,
        g: ServingOverloadGate,
    ) -> Iterator[Finding]:
        p = self.params
        table: list[list[Any]] = []
        throughputs: list[float] = []
        knee: int | None = 0
        knee_goodput = knee_rate = 0.0
        broke_at: int | None = None
        rate_capped = False
        for c, ph in steps:
            r = ph.result
            assert r is not None
            met = ph.met(ex.slo)
            capped = r.throughput_rps >= 0.9 * p.budget.max_rate
            rate_capped = rate_capped or capped
            throughputs.append(r.throughput_rps)
            goodput = _completion_rate(r, within_slo=True)
            table.append(
                [
                    c,
                    round(r.throughput_rps, 1),
                    round(goodput, 1),
                    round(r.success_rate, 4),
                    r.latency.p50_ms,
                    r.latency.p99_ms,
                    dict(r.status_counts),
                    met,
                    capped,
                ]
            )
            if met and broke_at is None:
                knee, knee_goodput, knee_rate = c, goodput, _completion_rate(r, within_slo=False)
            elif broke_at is None:
                broke_at = c
        if broke_at == steps[0][0]:
            knee = None
        # graceful degradation is judged where the SLO first breaks; steps further out are shown, not gated
        first_broken = next((ph for c, ph in steps if c == broke_at), None)
        broken_rate = (
            _completion_rate(first_broken.result, within_slo=False) if first_broken and first_broken.result else None
        )
        problems = []
        if knee is None or knee < g.min_knee_concurrency:
            problems.append(
                f"the SLO breaks at concurrency {broke_at}, below the required {g.min_knee_concurrency}"
                if broke_at is not None
                else "no step met the SLO"
            )
        knee_text = (
            f"the SLO holds up to concurrency {knee} ({knee_goodput:.0f} good req/s) and breaks at {broke_at}"
            if broke_at is not None and knee
            else f"the SLO holds at every step up to concurrency {steps[-1][0]}"
            + (" (the budget's max_rate capped the load)" if rate_capped else "")
            if broke_at is None
            else f"the SLO breaks already at concurrency {broke_at}"
        )
        yield self.finding(
            ctx,
            Verdict.FAIL if problems else Verdict.PASS,
            f"knee: {knee_text}",
            severity=Severity.HIGH if problems else Severity.INFO,
            metrics={
                "knee_concurrency": float(knee if knee is not None else 0),
                # left out when no step broke the SLO (not a -1 placeholder)
                **measured(breaking_concurrency=broke_at),
                "knee_goodput_rps": float(knee_goodput),
                "max_throughput_rps": max(throughputs),
            },
            gate=f"SLO ({ex.slo.describe()}) holds at concurrency >= {g.min_knee_concurrency}",
            message="; ".join(problems),
            suggestion="profile the request path at the breaking step; add capacity or batching" if problems else "",
            evidence={
                "steps": {
                    "columns": [
                        "concurrency",
                        "throughput_rps",
                        "goodput_rps",
                        "success_rate",
                        "p50_ms",
                        "p99_ms",
                        "status_counts",
                        "slo_met",
                        "rate_capped",
                    ],
                    "rows": table,
                },
                "rate_capped": rate_capped,
                "step_s": p.step_s,
                "step_s_run": _step_seconds(p),
            },
        )
        # how overload fails
        untyped = sum(int(ph.errors.get("untyped", 0)) for _, ph in steps)
        missing_ra = sum(int(ph.errors.get("missing_retry_after", 0)) for _, ph in steps)
        transport: dict[str, int] = {}
        for _, ph in steps:
            for k, v in transport_errors(ph).items():
                transport[k] = transport.get(k, 0) + v
        problems = []
        if g.typed_errors and untyped:
            problems.append(f"{untyped} overload answers were not OpenAI error JSON")
        if g.retry_after and missing_ra:
            problems.append(f"{missing_ra} 429/503 answers had no Retry-After")
        if transport:
            problems.append(f"requests went unanswered under overload ({transport})")
        collapse = broken_rate is not None and knee_rate > 0 and broken_rate < g.min_answer_rate_ratio * knee_rate
        if collapse:
            problems.append(
                f"throughput collapsed where the SLO broke (concurrency {broke_at}: {broken_rate:.1f} vs "
                f"{knee_rate:.1f} answers/s at the knee)"
            )
        granted = f"{p.max_recovery_s:g} s" + (f" + {drain.describe()}" if drain and drain.seconds else "")
        if recovery is not None and recovery_s is None:
            problems.append(f"did not recover within {granted} after the ramp")
        statuses: dict[str, int] = {}
        for _, ph in steps:
            for k, v in (ph.result.status_counts if ph.result else {}).items():
                if k != "200":
                    statuses[k] = statuses.get(k, 0) + v
        yield self.finding(
            ctx,
            Verdict.FAIL if problems else Verdict.PASS,
            "overload: "
            + (
                "; ".join(problems)
                if problems
                else f"sheds load with typed answers ({statuses or 'none needed'}), recovers"
                + (f" in {recovery_s:.2f} s (granted {granted})" if recovery_s is not None else "")
            ),
            severity=Severity.HIGH if problems else Severity.INFO,
            metrics={
                "untyped_errors": float(untyped),
                "missing_retry_after": float(missing_ra),
                "unanswered": float(sum(transport.values())),
                "answer_rate_ratio_past_knee": float(
                    broken_rate / knee_rate if broken_rate is not None and knee_rate > 0 else 1.0
                ),
                **measured(recovery_s=recovery_s),  # absent: not recovered
                "recovery_allowance_s": float(drain.seconds if drain is not None else 0.0),
            },
            gate="typed 429/503/504 with Retry-After, every request answered, the answer rate kept past the knee, "
            f"recovery within max_recovery_s ({p.max_recovery_s:g} s) once the ramp's backlog is drained at its "
            "measured rate",
            message="; ".join(problems),
            suggestion=(
                "bound the queue and answer 429 with Retry-After early (admission control) instead of letting "
                "latency grow until everything times out"
                if problems
                else ""
            ),
            evidence=jsonable(
                {
                    "error_answers": statuses,
                    "by_step": {str(c): ph.errors for c, ph in steps},
                    "recovery": None if recovery is None else recovery.summary(ex.slo, windows=True),
                    "recovery_allowance": None
                    if drain is None
                    else {
                        "max_recovery_s": p.max_recovery_s,
                        "allowance_s": round(drain.seconds, 3),
                        "drain_s": round(drain.drain_s, 3),
                        "answer_s": round(drain.answer_s, 3),
                        "backlog": drain.backlog,
                        "drain_rate_rps": round(drain.rate_rps, 2),
                        "drain_cap_s": drain.cap_s,
                        "why": "the requests in flight at the ramp's end, drained at the rate the service "
                        "answered in that step (same machine, same moment), and the first recovery request's "
                        "own answer (the ramp's lowest step, unqueued): recovery is judged after them",
                    },
                }
            ),
        )
