"""Step 6: the deployment under faults and load, as Chaos Toolkit experiments.

Four checks, each one experiment with a steady-state hypothesis (success rate and p99), a bounded
method, rollbacks that always run and a journal (in the evidence of its ``experiment`` finding):

- ``serving_faults``: each proxy fault in turn, at moderate and heavy settings;
- ``serving_poison``: malformed, huge and decompression-bomb inputs mixed into good traffic;
- ``serving_overload``: concurrency raised step by step until the SLO breaks (the knee);
- ``serving_resilience``: the circuit breaker when the model fails, and client retries under 429/503.

They run against an ``openai:`` target as it is, or serve an in-process target with the reference
server (``mmchaos serve``) on a loopback port; a fault proxy sits in front. See docs/serving-suite.md.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
from pydantic import Field, field_validator

from mmchaos.chaos.experiment import (
    PROBE_HEADER,
    Experiment,
    Phase,
    ServingParams,
    _Spec,
    bomb_png,
    declared_png,
    gradient_jpeg,
    image_request_body,
    jsonable,
    png_data_url,
)
from mmchaos.checks.base import AnyCheck, Check, CheckContext, Gate
from mmchaos.checks.evidence import png_bytes
from mmchaos.findings import Artifact, Finding, Severity, Step, Verdict
from mmchaos.registry import closest
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.wrappers import DelegatingTarget, unwrap

if TYPE_CHECKING:
    import random

    from mmchaos.chaos.load import LoadRequest, LoadResult, PayloadMix

__all__ = ["FAULT_CATALOGUE", "ServingFaults", "ServingOverload", "ServingPoison", "ServingResilience"]

_EMBEDS = (frozenset({Capability.EMBED_IMAGE}), frozenset({Capability.EMBED_TEXT}))
Level = Literal["moderate", "heavy"]
Expect = Literal["within_slo", "degraded"]
_LEVELS: tuple[Level, ...] = ("moderate", "heavy")

R = TypeVar("R")


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
_MANGLES_BODIES = frozenset({"http_corrupt", "http_truncate", "http_drop_header", "limit_data"})
"""Toxic types that damage answers themselves: an unreadable error body there is the fault's doing."""
_TRANSPORT_KINDS = ("timeout", "connect_error", "reset", "protocol_error", "other")


def _closest(name: str, known: Sequence[str]) -> str:
    return closest(name, known) or f" (known: {', '.join(known)})"


class CustomFault(_Spec):
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


# --- shared finding helpers ------------------------------------------------------------------------


def _experiment_finding(
    check: AnyCheck, ctx: CheckContext, ex: Experiment, *, title: str, extra: dict[str, Any] | None = None
) -> Finding:
    """The experiment as a whole: verdict from its status, the journal in the evidence."""
    journal = ex.finish()
    budget = journal["budget"]
    before = journal["steady_states"]["before"]
    after = journal["steady_states"]["after"]
    problems = []
    verdict = Verdict.PASS
    severity = Severity.INFO
    suggestion = ""
    if ex.aborted:
        problems.append(f"aborted: {ex.aborted}")
        verdict, severity = Verdict.FAIL, Severity.HIGH
        suggestion = (
            "the safeguard stopped the experiment: find what held the service outside its SLO (the journal "
            "shows the phase and its windows); a service that cannot hold its SLO without faults is not ready"
        )
    if before is not None and not before["steady_state_met"]:
        problems.append("the steady state did not hold before any fault")
        verdict, severity = Verdict.FAIL, Severity.HIGH
        suggestion = suggestion or "fix the baseline first: the SLO does not hold on clean traffic"
    if after is not None and not after["steady_state_met"]:
        problems.append("the steady state did not hold after the method (deviated)")
        verdict, severity = Verdict.FAIL, Severity.HIGH
        suggestion = suggestion or "the service did not come back to its SLO after the faults were removed"
    if not budget["respected"]:
        problems.append(f"the budget was exceeded: {budget}")
        verdict, severity = Verdict.FAIL, Severity.CRITICAL
    teardown = journal.get("teardown") or {}
    if teardown and not teardown.get("clean", True):
        problems.append(f"left behind: {teardown.get('still_listening')} {teardown.get('threads_left')}")
        verdict, severity = Verdict.FAIL, Severity.HIGH
    if ex.interrupted and verdict == Verdict.PASS:
        problems.append(f"interrupted: {ex.interrupted}")
        verdict, severity = Verdict.ERROR, Severity.MEDIUM
        suggestion = "raise budget.max_requests / budget.max_duration_s, or shorten the phases"
    status = journal["status"]
    evidence: dict[str, Any] = {
        "aborted": ex.aborted is not None,
        "status": status,
        "journal": jsonable(journal),
    }
    if ex.aborted:
        evidence["reason"] = ex.aborted
    evidence.update(extra or {})
    return check.finding(
        ctx,
        verdict,
        f"{title}: {status}" + (f" ({problems[0]})" if problems else ""),
        severity=severity,
        metrics={
            "requests_sent": float(budget["sent"]),
            "max_rate_observed": float(budget["max_rate_observed"]),
            "duration_s": float(budget["duration_s"]),
            "aborted": 1.0 if ex.aborted else 0.0,
            "deviated": 1.0 if journal["deviated"] else 0.0,
        },
        gate=(
            f"steady state ({ex.slo.describe()}) before and after; no safeguard abort "
            f"({ex.params.abort_after_windows} breached {ex.slo.window_s:g} s windows in a row); budget respected; "
            "nothing left running"
        ),
        message="; ".join(problems),
        suggestion=suggestion,
        evidence=evidence,
    )


def _transport_errors(ph: Phase) -> dict[str, int]:
    if ph.result is None:
        return {}
    return {k: v for k, v in ph.result.errors.items() if k in _TRANSPORT_KINDS}


def _not_run(check: AnyCheck, ctx: CheckContext, what: str, why: str) -> Finding:
    return check.finding(ctx, Verdict.SKIPPED, f"{what}: not run ({why})", message=why, evidence={"reason": why})


# --- serving_faults --------------------------------------------------------------------------------


class ServingFaultsParams(ServingParams):
    faults: list[str] = Field(default_factory=lambda: list(DEFAULT_FAULTS), description="catalogue names")
    levels: list[Level] = Field(default_factory=lambda: list(_LEVELS), min_length=1)
    custom: list[CustomFault] = Field(default_factory=list, description="faults of your own, run after the rest")
    fault_s: float = Field(1.0, gt=0.0, le=600.0, description="seconds each fault is held")

    @field_validator("faults")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in FAULT_CATALOGUE:
                raise ValueError(f"unknown fault {name!r}{_closest(name, list(FAULT_CATALOGUE))}")
        return value


class ServingFaultsGate(Gate):
    typed_errors: bool = Field(True, description="every HTTP error answer is an OpenAI error JSON")
    recovery: bool = Field(True, description="the SLO holds again within max_recovery_s of removing a fault")
    within_slo: bool = Field(True, description="faults expected within the SLO (moderate latency ...) stay in it")


class ServingFaults(Check[ServingFaultsParams, ServingFaultsGate]):
    """Each proxy fault in turn (moderate, heavy): SLO during, typed errors, recovery and its time."""

    name = "serving_faults"
    step = Step.SERVING
    requires = _EMBEDS
    Params = ServingFaultsParams
    Gate = ServingFaultsGate

    def plan(self) -> list[tuple[str, str, FaultLevel]]:
        p = self.params
        out: list[tuple[str, str, FaultLevel]] = [
            (f, lvl, FAULT_CATALOGUE[f][lvl]) for f in p.faults for lvl in p.levels
        ]
        out += [(c.name, "custom", FaultLevel(c.toxic, c.expect)) for c in p.custom]
        return out

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        plan = self.plan()
        bar = ctx.progress.task(f"{ctx.check_id}: faults", total=len(plan) + 2)
        findings: list[Finding] = []
        not_run: list[str] = []
        ex = Experiment(
            ctx,
            p,
            title="serving faults",
            description="each proxy fault in turn; SLO during, typed errors, recovery after removal",
        )
        try:
            with ex:
                ex.warmup()
                before = ex.steady_state("before")
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
                bar.advance()
        finally:
            bar.close()
        yield from findings
        extra = {"not_run": not_run} if not_run else {}
        yield _experiment_finding(self, ctx, ex, title="serving faults experiment", extra=extra)

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
            severity = max(severity, Severity.MEDIUM, key=_rank)
        if guarded and not within and not aborted_here:
            problems.append(f"outside the SLO during a fault it should absorb ({ex.slo.describe()})")
            severity = max(severity, Severity.MEDIUM, key=_rank)
        verdict = Verdict.FAIL if problems else Verdict.PASS
        r = during.result
        if problems:
            title = f"{label}: " + "; ".join(problems)
        else:
            slo_note = "within SLO" if within else "outside SLO (expected)"
            rec = "n/a" if recovery_s is None else f"{recovery_s:.2f} s"
            title = f"{label}: {slo_note} during the fault, errors typed, recovered in {rec}"
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
            metrics={
                "during_success_rate": during.success_rate,
                "during_p99_ms": float(during.p99_ms if during.p99_ms is not None else -1.0),
                "recovery_s": float(recovery_s if recovery_s is not None else -1.0),
                "http_errors": float(typed.get("http_errors", 0)),
                "untyped_errors": float(untyped),
                "transport_errors": float(sum(_transport_errors(during).values())),
                "requests": float(r.sent if r is not None else 0),
            },
            gate=(
                ("within SLO during; " if guarded else "")
                + ("typed errors; " if g.typed_errors else "")
                + (f"recovers within {p.max_recovery_s:g} s" if g.recovery else "")
            ).strip("; "),
            message="; ".join(problems),
            suggestion=suggestion,
            evidence=jsonable(evidence),
        )


_SEVERITY_RANK = {s: i for i, s in enumerate(Severity)}


def _rank(s: Severity) -> int:
    return _SEVERITY_RANK[s]


# --- serving_poison -------------------------------------------------------------------------------

Outcome = Literal["refused", "any"]


@dataclass(frozen=True)
class PoisonKind:
    name: str
    needs: Capability | None
    outcome: Outcome
    what: str


POISONS: dict[str, PoisonKind] = {
    p.name: p
    for p in (
        PoisonKind("malformed_base64", Capability.EMBED_IMAGE, "refused", "a data: URL whose base64 is invalid"),
        PoisonKind("garbage_image", Capability.EMBED_IMAGE, "refused", "random bytes labelled image/png"),
        PoisonKind("truncated_png", Capability.EMBED_IMAGE, "refused", "the first half of a valid PNG"),
        PoisonKind("declared_huge", Capability.EMBED_IMAGE, "refused", "a PNG header declaring 30000x30000 RGB"),
        PoisonKind("decompression_bomb", Capability.EMBED_IMAGE, "refused", "a 1-bit PNG bomb, KBs -> GBs"),
        PoisonKind("huge_image", Capability.EMBED_IMAGE, "any", "a legitimate large image within the limits"),
        PoisonKind("huge_text", Capability.EMBED_TEXT, "any", "a text of about 1 MB"),
        PoisonKind("invalid_json", None, "refused", "a body that is not JSON"),
        PoisonKind("wrong_schema", None, "refused", "JSON of the wrong shape"),
    )
}


class ServingPoisonParams(ServingParams):
    poisons: list[str] = Field(default_factory=lambda: list(POISONS))
    poison_share: float = Field(0.2, gt=0.0, lt=1.0, description="share of the requests that are poison")
    poison_s: float = Field(3.0, gt=0.0, le=3600.0, description="seconds of mixed traffic")
    huge_side: int = Field(3072, ge=64, le=16384, description="side of the legitimate large image")
    declared_side: int = Field(30000, ge=1000, le=1_000_000)
    bomb_side: int = Field(20000, ge=1000, le=200_000)
    huge_text_bytes: int = Field(1_000_000, ge=1000, le=50_000_000)

    @field_validator("poisons")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in POISONS:
                raise ValueError(f"unknown poison {name!r}{_closest(name, list(POISONS))}")
        if not value:
            raise ValueError("give at least one poison")
        return value


class ServingPoisonGate(Gate):
    min_good_success_rate: float = Field(1.0, ge=0.0, le=1.0, description="of good requests during the poison")
    good_within_slo: bool = Field(True, description="good requests also keep the SLO's p99")


def _poison_bodies(p: ServingPoisonParams, model: str, path: str, ctx: CheckContext) -> dict[str, bytes]:
    import json

    rng = ctx.rng("poison")
    sample = ctx.dataset[0] if len(ctx.dataset) and ctx.dataset.has_images else None
    png = png_bytes(sample.load_image()) if sample is not None else png_bytes(np.full((64, 64, 3), 90, np.uint8))
    out: dict[str, bytes] = {}
    for name in p.poisons:
        if name == "malformed_base64":
            out[name] = image_request_body(model, "data:image/png;base64,iVBORw0KGgo!!not*base64@@")
        elif name == "garbage_image":
            blob = rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
            out[name] = image_request_body(model, png_data_url(blob))
        elif name == "truncated_png":
            out[name] = image_request_body(model, png_data_url(png[: len(png) // 2]))
        elif name == "declared_huge":
            out[name] = image_request_body(model, png_data_url(declared_png(p.declared_side, p.declared_side)))
        elif name == "decompression_bomb":
            out[name] = image_request_body(model, png_data_url(bomb_png(p.bomb_side)))
        elif name == "huge_image":
            out[name] = image_request_body(model, png_data_url(gradient_jpeg(p.huge_side), "image/jpeg"))
        elif name == "huge_text":
            words = ("lorem", "ipsum", "dolor", "sit", "amet")
            text = " ".join(words[i % 5] for i in range(p.huge_text_bytes // 6))
            out[name] = json.dumps({"model": model, "input": text}).encode()
        elif name == "invalid_json":
            out[name] = b'{"model": "' + model.encode() + b'", "input": ["unterminated'
        elif name == "wrong_schema":
            out[name] = json.dumps({"model": model, "input": {"nested": [1, 2, 3]}}).encode()
    del path
    return out


def _poison_mix(good: PayloadMix, bodies: Mapping[str, bytes], share: float, path: str) -> PayloadMix:
    """Good traffic with a ``share`` of poison, the poison kinds taken in turn (so each is sent)."""
    from mmchaos.chaos.load import LoadRequest, MixEntry, PayloadMix

    kinds = list(bodies)
    turn = [0]

    def good_factory(rng: random.Random) -> LoadRequest:
        return good.pick(rng)

    def poison_factory(rng: random.Random) -> LoadRequest:
        kind = kinds[turn[0] % len(kinds)]
        turn[0] += 1
        headers = {"Content-Type": "application/json", PROBE_HEADER: kind}
        return LoadRequest(kind, path, "POST", content=bodies[kind], headers=headers)

    return PayloadMix([MixEntry(good_factory, 1.0 - share), MixEntry(poison_factory, share)])


class ServingPoison(Check[ServingPoisonParams, ServingPoisonGate]):
    """Malformed, huge and bomb inputs mixed into good traffic: every good request must still succeed."""

    name = "serving_poison"
    step = Step.SERVING
    requires = _EMBEDS
    Params = ServingPoisonParams
    Gate = ServingPoisonGate

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        g = self.gate
        caps = unwrap(ctx.target).capabilities
        kinds = [k for k in p.poisons if POISONS[k].needs is None or POISONS[k].needs in caps]
        if Capability.EMBED_IMAGE in caps and not ctx.dataset.has_images:
            kinds = [k for k in kinds if POISONS[k].needs != Capability.EMBED_IMAGE]
        bar = ctx.progress.task(f"{ctx.check_id}: poison", total=3)
        findings: list[Finding] = []
        ex = Experiment(
            ctx, p, title="poison isolation", description="poison inputs mixed into good traffic; good must succeed"
        )
        mixed: Phase | None = None
        settle: float | None = None
        try:
            with ex:
                path = f"{ex.dep.prefix}/embeddings"
                bodies = {k: v for k, v in _poison_bodies(p, ex.dep.model, path, ctx).items() if k in kinds}
                ex.warmup()
                before = ex.steady_state("before")
                bar.advance()
                if before.met(ex.slo) and not ex.stopped and bodies:
                    mix = _poison_mix(ex.mix, bodies, p.poison_share, path)
                    mixed = ex.phase(
                        "poison", seconds=p.poison_s, guarded=True, mix=mix, track=lambda r: r.kind not in bodies
                    )
                    bar.advance()
                    if not ex.stopped:
                        settle = ex.recover("poison:recovery")[1]
                    if not ex.stopped:
                        ex.steady_state("after")
                bar.advance()
        finally:
            bar.close()
        if mixed is not None and mixed.result is not None:
            findings.append(self._isolation(ctx, ex, mixed, before.p99_ms, set(bodies), g, settle))
            for kind in bodies:
                findings.append(self._kind(ctx, ex, mixed, kind, bodies[kind]))
        yield from findings
        yield _experiment_finding(self, ctx, ex, title="poison isolation experiment", extra={"poisons": kinds})

    def _isolation(
        self,
        ctx: CheckContext,
        ex: Experiment,
        ph: Phase,
        baseline_p99: float | None,
        poison: set[str],
        g: ServingPoisonGate,
        settle: float | None,
    ) -> Finding:
        assert ph.result is not None
        good = [r for r in ph.result.records if r.kind not in poison and r.error != "client_shed"]
        ok = [r for r in good if r.ok]
        rate = len(ok) / len(good) if good else 0.0
        lat = sorted(r.latency * 1000.0 for r in ok)
        p99 = round(float(np.percentile(lat, 99)), 3) if lat else None
        failures: dict[str, int] = {}
        first_failure: float | None = None
        for r in good:
            if not r.ok:
                label = f"{r.error}:{r.status}" if r.status else str(r.error)
                failures[label] = failures.get(label, 0) + 1
                first_failure = r.start if first_failure is None else min(first_failure, r.start)
        problems = []
        if rate < g.min_good_success_rate:
            problems.append(f"{len(good) - len(ok)} of {len(good)} good requests failed next to poison")
        if g.good_within_slo and (p99 is None or p99 > ex.slo.p99_ms):
            problems.append(f"good requests' p99 {p99} ms is over the SLO's {ex.slo.p99_ms:g} ms")
        aborted = ex.aborted is not None and "poison" in ex.aborted
        if aborted:
            problems.append(f"aborted: {ex.aborted}")
        verdict = Verdict.FAIL if problems else Verdict.PASS
        poison_requests = sum(1 for r in ph.result.records if r.kind in poison)
        title = (
            "; ".join(problems)
            if problems
            else f"{len(good)} good requests all succeeded next to {poison_requests} poison requests"
        )
        evidence: dict[str, Any] = {
            "good_requests": len(good),
            "good_ok": len(ok),
            "good_failures": failures,
            "first_good_failure_s": first_failure,
            "poison_requests": poison_requests,
            "baseline_p99_ms": baseline_p99,
            "settled_after_s": settle,
            "phase": ph.summary(ex.slo, windows=True),
            "seed": ex.seed,
        }
        if aborted:
            evidence["aborted"] = True
            evidence["reason"] = ex.aborted
        return self.finding(
            ctx,
            verdict,
            f"isolation: {title}",
            severity=Severity.CRITICAL
            if rate < g.min_good_success_rate
            else Severity.HIGH
            if problems
            else Severity.INFO,
            metrics={
                "good_success_rate": rate,
                "good_p99_ms": float(p99 if p99 is not None else -1.0),
                "baseline_p99_ms": float(baseline_p99 if baseline_p99 is not None else -1.0),
                "good_requests": float(len(good)),
                "poison_requests": float(poison_requests),
            },
            gate=f"good success rate >= {g.min_good_success_rate:.2%}"
            + (f" and good p99 <= {ex.slo.p99_ms:g} ms" if g.good_within_slo else ""),
            message="; ".join(problems),
            suggestion=(
                "one bad input must never reach shared state: validate and size-check inputs before the model "
                "(the server's Preflight does), decode in the request's own worker, and keep a model failure "
                "from poisoning the engine for everyone"
                if problems
                else ""
            ),
            evidence=jsonable(evidence),
        )

    def _kind(self, ctx: CheckContext, ex: Experiment, ph: Phase, kind: str, body: bytes) -> Finding:
        assert ph.result is not None
        spec = POISONS[kind]
        mine = [r for r in ph.result.records if r.kind == kind and r.error != "client_shed"]
        outcomes = ex.inspector.outcomes(ph.label, kind)
        accepted = sum(1 for r in mine if r.ok)
        untyped = sum(n for k, n in outcomes.items() if k.endswith(":untyped"))
        fivexx = sum(n for k, n in outcomes.items() if k.startswith("5"))
        transport = sum(1 for r in mine if r.error in _TRANSPORT_KINDS)
        bad_body = sum(1 for r in mine if r.error == "bad_body")
        problems = []
        if not mine:
            return self.finding(
                ctx, Verdict.SKIPPED, f"poison {kind}: none was sent in the time given", evidence={"poison": kind}
            )
        if fivexx:
            problems.append(f"{fivexx} answered 5xx (a server failure, not a refusal)")
        if transport:
            problems.append(f"{transport} got no HTTP answer (timeout/reset)")
        if untyped:
            problems.append(f"{untyped} refusals were not OpenAI error JSON")
        if spec.outcome == "refused" and accepted:
            problems.append(f"{accepted} were accepted (200) instead of refused")
        if bad_body:
            problems.append(f"{bad_body} got a 200 without a valid embedding")
        verdict = Verdict.FAIL if problems else Verdict.PASS
        shown = ", ".join(f"{k} x{n}" for k, n in sorted(outcomes.items())) or "200"
        artifacts = (
            [Artifact(f"{ctx.check_id}-{kind}.json", body, "application/json")]
            if problems and len(body) <= 256_000
            else []
        )
        return self.finding(
            ctx,
            verdict,
            f"poison {kind}: " + ("; ".join(problems) if problems else f"answered {shown}"),
            severity=Severity.HIGH if fivexx or transport else Severity.MEDIUM if problems else Severity.INFO,
            metrics={
                "sent": float(len(mine)),
                "accepted": float(accepted),
                "answers_5xx": float(fivexx),
                "no_answer": float(transport),
                "untyped": float(untyped),
            },
            gate="a typed 4xx refusal" if spec.outcome == "refused" else "a 200 or a typed 4xx, never 5xx or no answer",
            message="; ".join(problems),
            suggestion=(
                "refuse bad inputs at the edge with a typed 4xx (Preflight: size, declared pixels and element "
                "count before decoding, decompression ratio)"
                if problems
                else ""
            ),
            evidence={
                "poison": kind,
                "what": spec.what,
                "expected": spec.outcome,
                "outcomes": outcomes,
                "body_bytes": len(body),
            },
            artifacts=artifacts,
        )


# --- serving_overload -----------------------------------------------------------------------------


class ServingOverloadParams(ServingParams):
    concurrency_steps: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64], min_length=1)
    step_s: float = Field(1.0, gt=0.0, le=600.0)
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
    min_goodput_ratio: float = Field(
        0.5, ge=0.0, le=1.0, description="goodput at the first breaking step, relative to at the knee (no collapse)"
    )


def _goodput(result: LoadResult) -> float:
    """Good answers per second between the first and the last good completion: a short step's
    pipeline fill (the first answers of a deep queue) and its cut-off do not count against it."""
    done = sorted(r.start + r.latency for r in result.records if r.good)
    if len(done) < 3 or done[-1] - done[0] <= 0:
        return result.goodput_rps
    return (len(done) - 1) / (done[-1] - done[0])


class ServingOverload(Check[ServingOverloadParams, ServingOverloadGate]):
    """Raise concurrency until the SLO breaks: the knee, how overload fails, and recovery after it."""

    name = "serving_overload"
    step = Step.SERVING
    requires = _EMBEDS
    Params = ServingOverloadParams
    Gate = ServingOverloadGate

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        g = self.gate
        bar = ctx.progress.task(f"{ctx.check_id}: ramp", total=len(p.concurrency_steps) + 1)
        steps: list[tuple[int, Phase]] = []
        recovery_s: float | None = None
        recovery: Phase | None = None
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
                    ph = ex.phase(f"concurrency={c}", seconds=p.step_s, guarded=False, concurrency=c)
                    if ph.result is None:
                        break
                    steps.append((c, ph))
                    bar.advance()
                    if past >= 0 or not ph.met(ex.slo):
                        past += 1
                        if past >= p.steps_past_knee:
                            break
                if steps and not ex.stopped:
                    recovery, recovery_s = ex.recover("after_ramp:recovery")
                bar.advance()
        finally:
            bar.close()
        if steps:
            yield from self._findings(ctx, ex, steps, recovery, recovery_s, g)
        yield _experiment_finding(self, ctx, ex, title="overload experiment")

    def _findings(
        self,
        ctx: CheckContext,
        ex: Experiment,
        steps: list[tuple[int, Phase]],
        recovery: Phase | None,
        recovery_s: float | None,
        g: ServingOverloadGate,
    ) -> Iterator[Finding]:
        p = self.params
        table: list[list[Any]] = []
        throughputs: list[float] = []
        knee: int | None = 0
        knee_goodput = 0.0
        broke_at: int | None = None
        rate_capped = False
        for c, ph in steps:
            r = ph.result
            assert r is not None
            met = ph.met(ex.slo)
            capped = r.throughput_rps >= 0.9 * p.budget.max_rate
            rate_capped = rate_capped or capped
            throughputs.append(r.throughput_rps)
            goodput = _goodput(r)
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
                knee, knee_goodput = c, goodput
            elif broke_at is None:
                broke_at = c
        if broke_at == steps[0][0]:
            knee = None
        # graceful degradation is judged where the SLO first breaks; steps further out are shown, not gated
        first_broken = next((ph for c, ph in steps if c == broke_at), None)
        worst_goodput = _goodput(first_broken.result) if first_broken and first_broken.result else None
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
                "breaking_concurrency": float(broke_at if broke_at is not None else -1),
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
            },
        )
        # how overload fails
        untyped = sum(int(ph.errors.get("untyped", 0)) for _, ph in steps)
        missing_ra = sum(int(ph.errors.get("missing_retry_after", 0)) for _, ph in steps)
        transport: dict[str, int] = {}
        for _, ph in steps:
            for k, v in _transport_errors(ph).items():
                transport[k] = transport.get(k, 0) + v
        problems = []
        if g.typed_errors and untyped:
            problems.append(f"{untyped} overload answers were not OpenAI error JSON")
        if g.retry_after and missing_ra:
            problems.append(f"{missing_ra} 429/503 answers had no Retry-After")
        if transport:
            problems.append(f"requests went unanswered under overload ({transport})")
        collapse = worst_goodput is not None and knee_goodput > 0 and worst_goodput < g.min_goodput_ratio * knee_goodput
        if collapse:
            problems.append(
                f"goodput collapsed where the SLO broke (concurrency {broke_at}: {worst_goodput:.1f} vs "
                f"{knee_goodput:.1f} good req/s at the knee)"
            )
        if recovery is not None and recovery_s is None:
            problems.append(f"did not recover within {p.max_recovery_s:g} s after the ramp")
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
                + (f" in {recovery_s:.2f} s" if recovery_s is not None else "")
            ),
            severity=Severity.HIGH if problems else Severity.INFO,
            metrics={
                "untyped_errors": float(untyped),
                "missing_retry_after": float(missing_ra),
                "unanswered": float(sum(transport.values())),
                "goodput_ratio_past_knee": float(
                    worst_goodput / knee_goodput if worst_goodput is not None and knee_goodput > 0 else 1.0
                ),
                "recovery_s": float(recovery_s if recovery_s is not None else -1.0),
            },
            gate="typed 429/503/504 with Retry-After, every request answered, goodput kept past the knee, recovery",
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
                }
            ),
        )


# --- serving_resilience ---------------------------------------------------------------------------


class FailSwitch(DelegatingTarget):
    """The served target with a switch that makes every model call fail (the upstream failing)."""

    def __init__(self, inner: Target) -> None:
        super().__init__(inner)
        self.failing = False
        self.calls = 0
        self.calls_while_open = 0
        self.failed_calls = 0
        self.state_of: Callable[[], str] = lambda: "closed"

    def call(self, fn: Callable[..., R], *args: Any) -> R:
        self.calls += 1
        if self.state_of() in ("open", "forced_open"):
            self.calls_while_open += 1
        if self.failing:
            self.failed_calls += 1
            raise RuntimeError(_INJECTED)
        return fn(*args)


_INJECTED = "injected upstream failure (mmchaos serving_resilience)"


class _DropInjected(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _INJECTED not in record.getMessage()


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if n <= 0 or k >= n:
        return 1.0
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    total = 0.0
    for i in range(k + 1):
        log_term = math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
        total += math.exp(log_term + i * math.log(p) + (n - i) * math.log1p(-p))
    return min(1.0, total)


class ServingResilienceParams(ServingParams):
    failure_s: float = Field(1.5, gt=0.0, le=600.0, description="seconds the model fails")
    max_recovery_s: float = Field(8.0, gt=0.0, le=3600.0, description="includes the breaker's open wait")
    breaker: bool = Field(True, description="run the breaker experiment (in-process targets only)")
    retries: bool = Field(True, description="run the client-retry experiment")
    client_max_retries: int = Field(3, ge=0, le=10, description="the reference client's retries")
    retry_calls: int = Field(20, ge=1, le=10_000)
    retry_toxicity: float = Field(0.5, gt=0.0, lt=1.0, description="share of answers turned into 429")
    retry_after_s: int = Field(1, ge=1, le=30, description="Retry-After of the 503 the client must honour")


class ServingResilienceGate(Gate):
    max_failures_to_open: int = Field(50, ge=1, description="failed model calls before the breaker opens")
    max_calls_while_open: int = Field(0, ge=0, description="model calls while the breaker is open")
    min_retry_success_rate: float = Field(
        0.85, ge=0.0, le=1.0, description="calls the client's retry policy gets through the 429s (expected rate)"
    )


class ServingResilience(Check[ServingResilienceParams, ServingResilienceGate]):
    """Breaker behaviour when the model fails (opens, sheds, recovers) and client retries under 429/503."""

    name = "serving_resilience"
    step = Step.SERVING
    requires = _EMBEDS
    Params = ServingResilienceParams
    Gate = ServingResilienceGate

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        from mmchaos.targets.openai_http import OpenAITarget

        inner = unwrap(ctx.target)
        remote = isinstance(inner, OpenAITarget)
        switch = None if remote or not p.breaker else FailSwitch(inner)
        bar = ctx.progress.task(f"{ctx.check_id}: resilience", total=3)
        findings: list[Finding] = []
        ex = Experiment(
            ctx,
            p,
            title="resilience",
            description="the model fails behind the breaker; clients meet 429 and 503",
            served=switch,
        )
        try:
            with ex:
                ex.warmup()
                before = ex.steady_state("before")
                bar.advance()
                if before.met(ex.slo):
                    if switch is not None:
                        findings.append(self._breaker(ctx, ex, switch))
                    bar.advance()
                    if p.retries and not ex.stopped:
                        findings.append(self._retries(ctx, ex))
                    if not ex.stopped:
                        ex.steady_state("after")
                bar.advance()
        finally:
            bar.close()
        if p.breaker and remote:
            findings.insert(
                0,
                _not_run(
                    self,
                    ctx,
                    "breaker",
                    "the model behind an openai: endpoint cannot be made to fail from here; serve an in-process "
                    "target to test the reference server's breaker",
                ),
            )
        yield from findings
        yield _experiment_finding(self, ctx, ex, title="resilience experiment")

    def _breaker(self, ctx: CheckContext, ex: Experiment, switch: FailSwitch) -> Finding:
        import httpx

        p = self.params
        g = self.gate
        server = ex.dep.server
        breaker = server.state.breaker
        switch.state_of = lambda: str(breaker.state.value)
        calls_before = switch.calls
        started = time.monotonic()
        switch.failing = True
        opened_after: int | None = None
        ready_while_open: int | None = None
        transitions: list[dict[str, Any]] = []

        def on_change(t: Any) -> None:
            transitions.append(
                {
                    "from": t.from_state.value,
                    "to": t.to_state.value,
                    "failed_model_calls": switch.failed_calls,
                    "failure_rate": round(t.failure_rate, 2),
                    "at_s": round(time.monotonic() - started, 3),
                }
            )

        breaker.add_listener(on_change)
        quiet = _DropInjected()
        server_log = logging.getLogger("mmchaos.server")
        server_log.addFilter(quiet)  # the server logs each model failure with its trace: ours are expected
        try:
            failing = ex.phase("model_failing", seconds=p.failure_s, guarded=False, activity="action")
            if breaker.state.value in ("open", "forced_open"):
                with httpx.Client(base_url=ex.dep.root, trust_env=False, timeout=5.0) as c:
                    ready_while_open = c.get("/readyz").status_code
        finally:
            switch.failing = False
            calls_failing = switch.calls - calls_before
            server_log.removeFilter(quiet)
            ex.activity("action", "model_recovers", started, {"failed_calls": switch.failed_calls})
        failed_calls = switch.failed_calls
        outcomes = failing.errors
        rejected = sum(n for k, n in outcomes.get("by_kind_status_code", {}).items() if k.split(":")[1] == "503")
        opened = next((t for t in transitions if t["to"] in ("open", "forced_open")), None)
        if opened is not None:
            opened_after = int(opened["failed_model_calls"])
        recovery, recovery_s = ex.recover("model_recovered:recovery")
        problems = []
        if opened_after is None:
            problems.append(f"the breaker never opened: all {failed_calls} failing requests reached the model")
        elif opened_after > g.max_failures_to_open:
            problems.append(f"the breaker opened only after {opened_after} failed requests")
        if switch.calls_while_open > g.max_calls_while_open:
            problems.append(f"{switch.calls_while_open} model calls were made while the breaker was open")
        if int(outcomes.get("untyped", 0)):
            problems.append(f"{outcomes['untyped']} failure answers were not OpenAI error JSON")
        if rejected and int(outcomes.get("missing_retry_after", 0)):
            problems.append("503s from the open breaker had no Retry-After")
        if ready_while_open is not None and ready_while_open != 503:
            problems.append(f"/readyz answered {ready_while_open} while the breaker was open")
        if recovery_s is None:
            problems.append(f"the service did not recover within {p.max_recovery_s:g} s of the model recovering")
        verdict = Verdict.FAIL if problems else Verdict.PASS
        return self.finding(
            ctx,
            verdict,
            "breaker: "
            + (
                "; ".join(problems)
                if problems
                else f"opened after {opened_after} failures, shed {rejected} requests with 503 + Retry-After, "
                f"recovered in {recovery_s:.2f} s"
            ),
            severity=Severity.HIGH if problems else Severity.INFO,
            metrics={
                "failures_to_open": float(opened_after if opened_after is not None else -1),
                "rejected_503": float(rejected),
                "model_calls_while_failing": float(calls_failing),
                "model_calls_while_open": float(switch.calls_while_open),
                "recovery_s": float(recovery_s if recovery_s is not None else -1.0),
            },
            gate=(
                f"opens within {g.max_failures_to_open} failures; <= {g.max_calls_while_open} model calls while "
                f"open; typed 503 + Retry-After; /readyz 503 while open; recovers within {p.max_recovery_s:g} s"
            ),
            message="; ".join(problems),
            suggestion=(
                "put a circuit breaker around the model call (failure-rate window, open wait, half-open trials) "
                "so a failing model is not hammered and clients are told when to come back"
                if problems
                else ""
            ),
            evidence=jsonable(
                {
                    "breaker_config": ex.params.server.breaker_config().model_dump(mode="json"),
                    "failing": failing.summary(ex.slo, windows=True),
                    "recovery": None if recovery is None else recovery.summary(ex.slo, windows=True),
                    "readyz_while_open": ready_while_open,
                    "transitions": transitions,
                    "final_state": str(breaker.state.value),
                }
            ),
        )

    def _retries(self, ctx: CheckContext, ex: Experiment) -> Finding:
        import httpx

        from mmchaos.chaos.experiment import budgeted_transports
        from mmchaos.targets.openai_http import EndpointError, OpenAITarget

        p = self.params
        g = self.gate
        _, sync_cls = budgeted_transports()
        inner = unwrap(ctx.target)
        key_env = inner.api_key_env if isinstance(inner, OpenAITarget) else "MMCHAOS_SERVING_NO_API_KEY"
        caps = ex.dep.capabilities
        text = Capability.EMBED_TEXT in caps
        image = np.full((32, 32, 3), 120, np.uint8)

        def client(max_retries: int) -> tuple[OpenAITarget, Any]:
            transport = sync_cls(httpx.HTTPTransport(), ex.ledger, ex.inspector)
            target = OpenAITarget(
                f"{ex.dep.url}{ex.dep.prefix}",
                model=ex.dep.model,
                capabilities=[Capability.EMBED_TEXT if text else Capability.EMBED_IMAGE],
                image_input="messages",
                api_key_env=key_env,
                timeout=p.request_timeout_s,
                max_retries=max_retries,
                max_retry_after=float(p.retry_after_s) + 5.0,
                max_concurrency=1,
                allow_remote=not p.budget.loopback_only,
                transport=transport,
                seed=ex.seed,
            )
            return target, transport

        def call(t: OpenAITarget) -> str | None:
            try:
                if text:
                    t.embed_texts(["a photo of a red circle"])
                else:
                    t.embed_images([image])
            except EndpointError as exc:
                return exc.code
            return None

        probes: dict[str, Any] = {}
        problems: list[str] = []
        # 1. a 503 with Retry-After on every answer: exactly 1 + max_retries attempts, spaced by Retry-After
        started = time.monotonic()
        ex.inspector.phase = "retry_after"
        ex.add_toxic(
            {"name": "all-503", "type": "http_status", "attributes": {"status": 503, "retry_after": p.retry_after_s}}
        )
        try:
            t, tr = client(1)
            try:
                outcome = call(t)
            finally:
                t.close()
        finally:
            ex.remove_faults("end of retry_after probe")
        gaps = [round(b[0] - a[0], 3) for a, b in zip(tr.attempts, tr.attempts[1:], strict=False)]
        probes["retry_after"] = {"attempts": len(tr.attempts), "gaps_s": gaps, "outcome": outcome}
        if len(tr.attempts) != 2:
            problems.append(f"a 503 with max_retries=1 took {len(tr.attempts)} attempts, not 2")
        elif gaps and gaps[0] < p.retry_after_s - 0.05:
            problems.append(f"the client retried after {gaps[0]} s, before Retry-After ({p.retry_after_s} s)")
        # 2. 500 is not retried
        ex.inspector.phase = "no_retry_500"
        ex.add_toxic({"name": "all-500", "type": "http_status", "attributes": {"status": 500}})
        try:
            t, tr = client(p.client_max_retries)
            try:
                outcome = call(t)
            finally:
                t.close()
        finally:
            ex.remove_faults("end of no_retry_500 probe")
        probes["no_retry_on_500"] = {"attempts": len(tr.attempts), "outcome": outcome}
        if len(tr.attempts) != 1:
            problems.append(f"a 500 was retried ({len(tr.attempts)} attempts): only 429/503 should be")
        # 3. half the answers 429: retries get the calls through, amplification bounded
        ex.inspector.phase = "retry_429"
        ex.add_toxic(
            {"name": "some-429", "type": "http_status", "toxicity": p.retry_toxicity, "attributes": {"status": 429}}
        )
        try:
            t, tr = client(p.client_max_retries)
            try:
                results = [call(t) for _ in range(p.retry_calls) if ex.ledger.remaining_requests() > 8]
            finally:
                t.close()
        finally:
            ex.remove_faults("end of retry_429 probe")
        ok = sum(1 for r in results if r is None)
        rate = ok / len(results) if results else 0.0
        amplification = len(tr.attempts) / len(results) if results else 0.0
        probes["retry_429"] = {
            "calls": len(results),
            "succeeded": ok,
            "attempts": len(tr.attempts),
            "amplification": round(amplification, 3),
            "toxicity": p.retry_toxicity,
            "max_retries": p.client_max_retries,
            "expected_success": round(1.0 - p.retry_toxicity ** (p.client_max_retries + 1), 4),
        }
        expected = 1.0 - p.retry_toxicity ** (p.client_max_retries + 1)
        # Judged on the policy (what its retries should get through) and on whether the client did as
        # well as that policy predicts (a one-sided binomial test), not on a handful of noisy calls.
        p_value = _binom_cdf(ok, len(results), expected)
        probes["retry_429"]["p_value"] = round(p_value, 6)
        if expected < g.min_retry_success_rate:
            problems.append(
                f"{p.client_max_retries} retries get only {expected:.0%} of calls through {p.retry_toxicity:.0%} "
                f"429s (observed {ok}/{len(results)})"
            )
        elif p_value < 0.001:
            problems.append(
                f"only {ok}/{len(results)} calls got through {p.retry_toxicity:.0%} 429s; its retries should get "
                f"{expected:.0%} (p = {p_value:.2g})"
            )
        if amplification > p.client_max_retries + 1 + 1e-9:
            problems.append(f"retry amplification {amplification:.2f} exceeds 1 + max_retries")
        ex.activity("probe", "client_retries", started, probes)
        return self.finding(
            ctx,
            Verdict.FAIL if problems else Verdict.PASS,
            "client retries: "
            + (
                "; ".join(problems)
                if problems
                else f"honours Retry-After, does not retry 500, {ok}/{len(results)} calls through 429s "
                f"at {amplification:.2f}x amplification"
            ),
            severity=Severity.MEDIUM if problems else Severity.INFO,
            metrics={
                "retry_success_rate": rate,
                "amplification": amplification,
                "attempts_on_503": float(probes["retry_after"]["attempts"]),
                "attempts_on_500": float(probes["no_retry_on_500"]["attempts"]),
            },
            gate=(
                f"503 + Retry-After honoured; 500 not retried; the retry policy gets >= {g.min_retry_success_rate:.0%} "
                f"of calls through {p.retry_toxicity:.0%} 429s and the client does as well; amplification <= 1 + "
                "max_retries"
            ),
            message="; ".join(problems),
            suggestion=(
                "retry only 429/503 (and idempotent timeouts), with jittered exponential backoff that honours "
                "Retry-After and a bounded number of attempts"
                if problems
                else ""
            ),
            evidence=jsonable({"client": "mmchaos openai: target (the reference client)", "probes": probes}),
        )
