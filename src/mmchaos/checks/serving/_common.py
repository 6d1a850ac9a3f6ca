"""What the four serving checks share: the capability they need, the experiment's closing finding,
and small helpers. Kept here so each check file holds one experiment and nothing else."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from mmchaos.chaos.experiment import Experiment, jsonable
from mmchaos.chaos.spec import ServingParams
from mmchaos.chaos.windows import Phase
from mmchaos.checks.base import AnyCheck, CheckContext
from mmchaos.findings import Finding, Severity, Verdict
from mmchaos.registry import closest
from mmchaos.targets.base import Capability

__all__ = [
    "CHAT_CONCURRENCY",
    "EMBEDS",
    "TRANSPORT_KINDS",
    "chat_params",
    "closest_hint",
    "default_stream_share",
    "experiment_finding",
    "fit_windows",
    "not_run",
    "serves_chat",
    "severity_rank",
    "transport_errors",
]


EMBEDS = (frozenset({Capability.EMBED_IMAGE}), frozenset({Capability.EMBED_TEXT}))

TRANSPORT_KINDS = ("timeout", "connect_error", "reset", "protocol_error", "other")


CHAT_CONCURRENCY = 2
"""Closed-loop chat requests in flight when a check's parameters do not say: a generative request
takes a model call of tens to hundreds of milliseconds, so four at once already queue behind each
other, and a server that sheds on its expected queue wait (``mmchaos serve``: 0.5 s) answers 429 to
clean traffic on a busy machine."""

SP = TypeVar("SP", bound=ServingParams)


def chat_params(params: SP, chat: bool) -> SP:
    """``params`` for a chat target: :data:`CHAT_CONCURRENCY` unless ``concurrency`` was given."""
    if not chat or "concurrency" in params.model_fields_set:
        return params
    return params.model_copy(update={"concurrency": min(params.concurrency, CHAT_CONCURRENCY)})


def serves_chat(capabilities: Iterable[Capability]) -> bool:
    """Whether a target's serving traffic is chat completions: it generates and embeds nothing
    (the predicate of :func:`mmchaos.chaos.payloads.chats`, on a target before it is deployed)."""
    caps = set(capabilities)
    return Capability.GENERATE in caps and not caps & {Capability.EMBED_IMAGE, Capability.EMBED_TEXT}


def default_stream_share(data: Any, share: float) -> Any:
    """For a ``mode="before"`` validator: the check's default ``payload.stream_share`` where none is given."""
    if not isinstance(data, dict):
        return data
    payload = data.get("payload")
    if payload is None:
        return {**data, "payload": {"stream_share": share}}
    if isinstance(payload, dict) and payload.get("stream_share") is None:
        return {**data, "payload": {**payload, "stream_share": share}}
    if not isinstance(payload, dict) and getattr(payload, "stream_share", 0.0) is None:
        return {**data, "payload": payload.model_copy(update={"stream_share": share})}
    return data


def closest_hint(name: str, known: Sequence[str]) -> str:
    return closest(name, known) or f" (known: {', '.join(known)})"


def experiment_finding(
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
    harness = before is not None and not before["steady_state_met"] and bool(before.get("harness_problem"))
    if harness:
        # The service refused the harness's own good traffic: nothing about resilience was measured.
        problems.append(f"the steady state did not hold before any fault: {before['why']}")
        verdict, severity = Verdict.ERROR, Severity.MEDIUM
        suggestion = (
            "make the good traffic acceptable to the endpoint before judging it: compare the journal's "
            "experiment.traffic (endpoint, image form) and the refusals' error codes with what the server takes "
            "(for openai: targets the image form is the one the probe found; check --model and the API key)"
        )
    if ex.aborted:
        problems.append(f"aborted: {ex.aborted}")
        if not harness:
            verdict, severity = Verdict.FAIL, Severity.HIGH
            suggestion = (
                "the safeguard stopped the experiment: find what held the service outside its SLO (the journal "
                "shows the phase and its windows); a service that cannot hold its SLO without faults is not ready"
            )
    if before is not None and not before["steady_state_met"] and not harness:
        problems.append(f"the steady state did not hold before any fault: {before.get('why', 'the SLO was not met')}")
        verdict, severity = Verdict.FAIL, Severity.HIGH
        suggestion = suggestion or "fix the baseline first: the SLO does not hold on clean traffic"
    if after is not None and not after["steady_state_met"]:
        why = after.get("why")
        problems.append("the steady state did not hold after the method (deviated)" + (f": {why}" if why else ""))
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


def fit_windows(ex: Experiment, baseline: Phase, *, headroom: float = 1.5) -> float | None:
    """Widen the SLO windows to hold ``min_window_requests`` answers at the rate the service showed on
    clean traffic (times ``headroom``); the new length, or None when they already do.

    A chat target answers a few requests a second: a window of the suite's length (0.25 s) then
    never holds enough answers to be judged, so the service could never be shown to recover, or a
    fault to break the SLO, however well it did. The change is journaled (``fit_slo_windows``)."""
    r = baseline.result
    if r is None or r.ok == 0 or r.duration_s <= 0:
        return None
    rate = r.ok / r.duration_s
    need = headroom * ex.slo.min_window_requests / rate
    if need <= ex.slo.window_s:
        return None
    window = min(60.0, math.ceil(need / 0.05) * 0.05)
    before = ex.slo.window_s
    ex.slo = ex.slo.model_copy(update={"window_s": window})
    ex.activity("action", "fit_slo_windows", time.monotonic(),
                {"window_s": before, "fitted_window_s": window, "clean_rate_rps": round(rate, 3),
                 "min_window_requests": ex.slo.min_window_requests, "headroom": headroom})  # fmt: skip
    return window


def measured(**values: float | None) -> dict[str, float]:
    """The metrics that were measured; one that was not is left out, never a placeholder number."""
    return {k: float(v) for k, v in values.items() if v is not None}


def transport_errors(ph: Phase) -> dict[str, int]:
    if ph.result is None:
        return {}
    return {k: v for k, v in ph.result.errors.items() if k in TRANSPORT_KINDS}


def not_run(check: AnyCheck, ctx: CheckContext, what: str, why: str) -> Finding:
    return check.finding(ctx, Verdict.SKIPPED, f"{what}: not run ({why})", message=why, evidence={"reason": why})


_SEVERITY_RANK = {s: i for i, s in enumerate(Severity)}


def severity_rank(s: Severity) -> int:
    return _SEVERITY_RANK[s]
