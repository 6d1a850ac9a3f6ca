"""``serving_faults``: each proxy fault in turn, at moderate and heavy settings.

For every fault the SLO is judged during it (where the catalogue says a resilient service absorbs
it), every HTTP error answer must be OpenAI error JSON, and the SLO must hold again within
``max_recovery_s`` of the fault's removal. See docs/serving-suite.md for the catalogue."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from mmchaos.chaos.experiment import Experiment, jsonable
from mmchaos.chaos.spec import ServingParams, Spec
from mmchaos.chaos.windows import Phase
from mmchaos.checks.base import Check, CheckContext, Gate
from mmchaos.checks.serving._answers import answers_finding, known_answer_samples_for, probe_answers
from mmchaos.checks.serving._common import (
    EMBEDS,
    chat_params,
    closest_hint,
    default_stream_share,
    experiment_finding,
    fit_windows,
    measured,
    serves_chat,
    severity_rank,
    transport_errors,
)
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability
from mmchaos.targets.wrappers import unwrap

__all__ = ["DEFAULT_FAULTS", "DEFAULT_STREAM_FAULTS", "FAULT_CATALOGUE", "CustomFault", "ServingFaults"]


Level = Literal["moderate", "heavy"]
Expect = Literal["within_slo", "degraded"]
_LEVELS: tuple[Level, ...] = ("moderate", "heavy")


@dataclass(frozen=True)
class FaultLevel:
    toxic: Mapping[str, Any]
    expect: Expect


def _t(
    kind: str, attributes: Mapping[str, Any], *, stream: str = "downstream", toxicity: float = 1.0
) -> dict[str, Any]:
    return {"type": kind, "stream": stream, "toxicity": toxicity, "attributes": dict(attributes)}


FAULT_CATALOGUE: dict[str, dict[Level, FaultLevel]] = {
    # slow or fragmented networks: a resilient service absorbs the moderate setting within its SLO
    "latency": {
        "moderate": FaultLevel(_t("latency", {"latency": 50, "jitter": 10}), "within_slo"),
        "heavy": FaultLevel(_t("latency", {"latency": 1500, "jitter": 100}), "degraded"),
    },
    "bandwidth": {
        "moderate": FaultLevel(_t("bandwidth", {"rate": 2000}, stream="upstream"), "within_slo"),
        "heavy": FaultLevel(_t("bandwidth", {"rate": 16}, stream="upstream"), "degraded"),
    },
    "slicer": {
        "moderate": FaultLevel(
            _t("slicer", {"average_size": 512, "size_variation": 256, "delay": 100}, stream="upstream"), "within_slo"
        ),
        "heavy": FaultLevel(
            _t("slicer", {"average_size": 32, "size_variation": 16, "delay": 2000}, stream="upstream"), "degraded"
        ),
    },
    "slow_close": {
        "moderate": FaultLevel(_t("slow_close", {"delay": 100}), "within_slo"),
        "heavy": FaultLevel(_t("slow_close", {"delay": 2000}), "within_slo"),
    },
    # broken connections: requests fail; the service must answer the rest and recover
    "reset_peer": {
        "moderate": FaultLevel(_t("reset_peer", {"timeout": 0}, toxicity=0.05), "degraded"),
        "heavy": FaultLevel(_t("reset_peer", {"timeout": 0}), "degraded"),
    },
    "timeout": {
        "moderate": FaultLevel(_t("timeout", {"timeout": 500}, toxicity=0.05), "degraded"),
        "heavy": FaultLevel(_t("timeout", {"timeout": 0}), "degraded"),
    },
    "limit_data": {
        "moderate": FaultLevel(_t("limit_data", {"bytes": 4096}, toxicity=0.1), "degraded"),
        "heavy": FaultLevel(_t("limit_data", {"bytes": 64}), "degraded"),
    },
    "down": {
        "moderate": FaultLevel(_t("down", {}, toxicity=0.05), "degraded"),
        "heavy": FaultLevel(_t("down", {}), "degraded"),
    },
    # HTTP faults: answers that are not the server's
    "http_503": {
        "moderate": FaultLevel(_t("http_status", {"status": 503, "retry_after": 1}, toxicity=0.05), "degraded"),
        "heavy": FaultLevel(_t("http_status", {"status": 503, "retry_after": 1}), "degraded"),
    },
    "http_429": {
        "moderate": FaultLevel(_t("http_status", {"status": 429, "retry_after": 1}, toxicity=0.05), "degraded"),
        "heavy": FaultLevel(_t("http_status", {"status": 429, "retry_after": 1}), "degraded"),
    },
    "http_corrupt": {
        "moderate": FaultLevel(_t("http_corrupt", {"flips": 8}, toxicity=0.05), "degraded"),
        "heavy": FaultLevel(_t("http_corrupt", {"flips": 8}), "degraded"),
    },
    "http_truncate": {
        "moderate": FaultLevel(_t("http_truncate", {"fraction": 0.5}, toxicity=0.05), "degraded"),
        "heavy": FaultLevel(_t("http_truncate", {"fraction": 0.5}), "degraded"),
    },
    "http_drop_header": {
        "moderate": FaultLevel(_t("http_drop_header", {"headers": ["Content-Type"]}, toxicity=0.05), "within_slo"),
        "heavy": FaultLevel(_t("http_drop_header", {"headers": ["Content-Type"]}), "within_slo"),
    },
    # mid-stream faults (chat targets): server-sent events cut, reset, sliced or stalled part-way.
    # A streamed chat answer is a few KB (one event per token); 600 bytes lets the headers and the
    # first events through, then closes: the client holds a partial stream.
    "stream_cut": {
        "moderate": FaultLevel(_t("limit_data", {"bytes": 600}, toxicity=0.2), "degraded"),
        "heavy": FaultLevel(_t("limit_data", {"bytes": 600}), "degraded"),
    },
    "stream_reset": {
        "moderate": FaultLevel(_t("reset_peer", {"timeout": 40}, toxicity=0.2), "degraded"),
        "heavy": FaultLevel(_t("reset_peer", {"timeout": 20}), "degraded"),
    },
    "stream_slicer": {
        "moderate": FaultLevel(_t("slicer", {"average_size": 24, "size_variation": 16, "delay": 200}), "within_slo"),
        "heavy": FaultLevel(_t("slicer", {"average_size": 3, "size_variation": 2, "delay": 2000}), "degraded"),
    },
    "stream_stall": {
        "moderate": FaultLevel(_t("latency", {"latency": 100, "jitter": 100}), "within_slo"),
        "heavy": FaultLevel(_t("latency", {"latency": 1500, "jitter": 1000}), "degraded"),
    },
}
DEFAULT_FAULTS = [
    "latency",
    "bandwidth",
    "slicer",
    "reset_peer",
    "timeout",
    "limit_data",
    "down",
    "http_503",
    "http_429",
    "http_corrupt",
    "http_truncate",
]
CHAT_STREAM_SHARE = 0.5
"""Chat targets: the share of the good traffic streamed, unless ``payload.stream_share`` says."""
DEFAULT_STREAM_FAULTS = ["stream_cut", "stream_reset", "stream_slicer", "stream_stall"]
"""Run after ``faults`` where the good traffic is chat (it streams); ignored for embeddings targets."""
_MANGLES_BODIES = frozenset({"http_corrupt", "http_truncate", "http_drop_header", "limit_data"})
"""Toxic types that damage answers themselves: an unreadable error body there is the fault's doing."""


class CustomFault(Spec):
    """A fault of your own: any toxic the proxy takes (toxiproxy JSON), and what it should do."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")
    toxic: dict[str, Any]
    expect: Expect = "degraded"

    @field_validator("toxic")
    @classmethod
    def _valid_toxic(cls, value: dict[str, Any]) -> dict[str, Any]:
        from mmchaos.proxy.config import parse_toxic

        parse_toxic(value)  # a ConfigError is a ValueError: pydantic reports it at the boundary
        return value


class ServingFaultsParams(ServingParams):
    faults: list[str] = Field(default_factory=lambda: list(DEFAULT_FAULTS), description="catalogue names")
    stream_faults: list[str] = Field(
        default_factory=lambda: list(DEFAULT_STREAM_FAULTS),
        description="catalogue names run after `faults` on chat targets (streamed traffic); ignored otherwise",
    )
    known_answers: int = Field(
        4, ge=0, le=6, description="chat targets: known-answer questions asked before and after the faults"
    )
    levels: list[Level] = Field(default_factory=lambda: list(_LEVELS), min_length=1)
    custom: list[CustomFault] = Field(default_factory=list, description="faults of your own, run after the rest")
    fault_s: float = Field(1.0, gt=0.0, le=600.0, description="seconds each fault is held")

    @model_validator(mode="before")
    @classmethod
    def _streamed(cls, data: Any) -> Any:
        return default_stream_share(data, CHAT_STREAM_SHARE)

    @field_validator("faults", "stream_faults")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in FAULT_CATALOGUE:
                raise ValueError(f"unknown fault {name!r}{closest_hint(name, list(FAULT_CATALOGUE))}")
        return value


class ServingFaultsGate(Gate):
    typed_errors: bool = Field(True, description="every HTTP error answer is an OpenAI error JSON")
    recovery: bool = Field(True, description="the SLO holds again within max_recovery_s of removing a fault")
    within_slo: bool = Field(True, description="faults expected within the SLO (moderate latency ...) stay in it")
    answers_kept: bool = Field(
        True, description="chat targets: known-answer questions answered right before the faults still are after"
    )


class ServingFaults(Check[ServingFaultsParams, ServingFaultsGate]):
    """Each proxy fault in turn (moderate, heavy): SLO during, typed errors, recovery and its time."""

    name = "serving_faults"
    step = Step.SERVING
    requires = (*EMBEDS, frozenset({Capability.GENERATE}))  # generative targets: chat completions

    def plan(self, chat: bool = False) -> list[tuple[str, str, FaultLevel]]:
        """The faults in the order run; ``chat``: the stream faults after the others."""
        p = self.params
        names = list(p.faults) + [f for f in p.stream_faults if f not in p.faults] if chat else list(p.faults)
        out: list[tuple[str, str, FaultLevel]] = [(f, lvl, FAULT_CATALOGUE[f][lvl]) for f in names for lvl in p.levels]
        out += [(c.name, "custom", FaultLevel(c.toxic, c.expect)) for c in p.custom]
        return out

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        chat = serves_chat(unwrap(ctx.target).capabilities)
        plan = self.plan(chat)
        bar = ctx.progress.task(f"{ctx.check_id}: faults", total=len(plan) + 2)
        findings: list[Finding] = []
        not_run: list[str] = []
        samples = known_answer_samples_for(ctx, p.known_answers) if chat else []
        answers_before = answers_after = None
        ex = Experiment(
            ctx,
            chat_params(p, chat),
            title="serving faults",
            description="each proxy fault in turn; SLO during, typed errors, recovery after removal",
        )
        try:
            with ex:
                ex.warmup()
                before = ex.steady_state("before")
                if chat:
                    fit_windows(ex, before)
                if samples and not ex.stopped:
                    answers_before = probe_answers(ex, "known_answers_before", samples, p.payload.max_tokens)
                bar.advance()
                if not before.met(ex.slo) or ex.stopped:
                    not_run = [f"{f}/{lvl}" for f, lvl, _ in plan]
                else:
                    for fault, level, spec in plan:
                        if ex.stopped:
                            not_run.append(f"{fault}/{level}")
                            continue
                        findings.append(self._one(ctx, ex, fault, level, spec))
                        bar.advance()
                    if not ex.stopped:
                        ex.steady_state("after")
                    if answers_before is not None and not ex.stopped:
                        answers_after = probe_answers(ex, "known_answers_after", samples, p.payload.max_tokens)
                bar.advance()
        finally:
            bar.close()
        yield from findings
        if answers_before is not None:
            yield answers_finding(self, ctx, answers_before, answers_after, gated=self.gate.answers_kept,
                                  after_what="the faults")  # fmt: skip
        extra = {"not_run": not_run} if not_run else {}
        yield experiment_finding(self, ctx, ex, title="serving faults experiment", extra=extra)

    def _one(self, ctx: CheckContext, ex: Experiment, fault: str, level: str, spec: FaultLevel) -> Finding:
        p = self.params
        g = self.gate
        label = f"{fault}/{level}"
        toxic = {**spec.toxic, "name": f"{fault}-{level}".replace("_", "-")}
        guarded = spec.expect == "within_slo" and g.within_slo
        ex.add_toxic(toxic)
        try:
            during = ex.phase(label, seconds=p.fault_s, guarded=guarded, activity="action")
        finally:
            ex.remove_faults(f"end of {label}")
        ex.during(label, during)
        recovery: Phase | None = None
        recovery_s: float | None = None
        if not ex.stopped:
            recovery, recovery_s = ex.recover(f"{label}:recovery")
        typed = during.errors
        mangles = str(spec.toxic.get("type")) in _MANGLES_BODIES
        untyped = 0 if mangles else int(typed.get("untyped", 0))
        within = during.met(ex.slo)
        problems: list[str] = []
        severity = Severity.INFO
        aborted_here = ex.aborted is not None and label in ex.aborted
        if aborted_here:
            problems.append(f"aborted: {ex.aborted}")
            severity = Severity.HIGH
        if g.recovery and recovery is not None and recovery_s is None:
            problems.append(f"did not recover within {p.max_recovery_s:g} s")
            severity = Severity.HIGH
        if g.typed_errors and untyped:
            problems.append(f"{untyped} error answers were not OpenAI error JSON")
            severity = max(severity, Severity.MEDIUM, key=severity_rank)
        if guarded and not within and not aborted_here:
            problems.append(f"outside the SLO during a fault it should absorb ({ex.slo.describe()})")
            severity = max(severity, Severity.MEDIUM, key=severity_rank)
        verdict = Verdict.FAIL if problems else Verdict.PASS
        r = during.result
        truncated = _truncated_streams(during)
        if problems:
            title = f"{label}: " + "; ".join(problems)
        else:
            answered = r is not None and r.attempted > 0
            slo_note = "no request completed" if not answered else "within SLO" if within else "outside SLO (expected)"
            if recovery_s is not None:
                rec = f"recovered in {recovery_s:.2f} s"
            elif recovery is None:
                rec = "recovery not measured (the experiment stopped first)"
            else:
                rec = f"did not recover within {p.max_recovery_s:g} s (not gated)"
            n_http = int(typed.get("http_errors", 0))
            if mangles:
                typed_note = "error bodies not judged (the fault damages bodies itself)"
            elif n_http:
                typed_note = f"{n_http} HTTP errors, all typed"
            else:
                typed_note = "no HTTP errors"
            cut = f", {truncated} cut streams recognised as cut" if truncated else ""
            title = f"{label}: {slo_note} during the fault, {typed_note}{cut}, {rec}"
        evidence: dict[str, Any] = {
            "fault": fault,
            "level": level,
            "toxic": toxic,
            "expect": spec.expect,
            "during": during.summary(ex.slo, windows=True),
            "recovery": None if recovery is None else recovery.summary(ex.slo, windows=True),
            "recovery_s": recovery_s,
            "recovery_resolution_s": ex.slo.window_s,
            "typed_check": "exempt: the fault damages answer bodies itself" if mangles else "applied",
            "truncated_streams": truncated,
            "seed": ex.seed,
        }
        if aborted_here:
            evidence["aborted"] = True
            evidence["reason"] = ex.aborted
        suggestion = ""
        if any("recover" in x for x in problems):
            suggestion = (
                "something the fault left behind keeps the service down: leaked admission slots or "
                "connections, a dead worker, an open breaker; look at the recovery windows"
            )
        elif untyped:
            suggestion = (
                "errors must reach clients as OpenAI error JSON with a status that says who is at fault; "
                "configure the gateway/load balancer in front to pass the service's errors through"
            )
        elif problems:
            suggestion = "add timeouts and retries that absorb this fault, or relax the fault's expectation"
        return self.finding(
            ctx,
            verdict,
            title,
            severity=severity if verdict == Verdict.FAIL else Severity.INFO,
            metrics=measured(
                during_success_rate=during.success_rate if r is not None and r.attempted else None,
                during_p99_ms=during.p99_ms,
                recovery_s=recovery_s,
                http_errors=float(typed.get("http_errors", 0)),
                untyped_errors=float(untyped),
                transport_errors=float(sum(transport_errors(during).values())),
                truncated_streams=float(truncated) if r is not None else None,
                requests=float(r.sent if r is not None else 0),
            ),
            gate=(
                ("within SLO during; " if guarded else "")
                + ("typed errors; " if g.typed_errors else "")
                + (f"recovers within {p.max_recovery_s:g} s" if g.recovery else "")
            ).strip("; "),
            message="; ".join(problems),
            suggestion=suggestion,
            evidence=jsonable(evidence),
        )


def _truncated_streams(ph: Phase) -> int:
    """Streamed answers of the phase that came back 200 but cut (no ``[DONE]``, no finish_reason):
    the load driver's validator recognised them and counted them as bad bodies."""
    if ph.result is None:
        return 0
    return sum(1 for r in ph.result.records if r.kind.endswith("_stream") and r.error == "bad_body")
