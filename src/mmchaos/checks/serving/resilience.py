"""``serving_resilience``: the circuit breaker when the model fails, and client retries under 429/503.

The served target is wrapped in a :class:`FailSwitch` so the upstream can be made to fail on cue;
the breaker must open, shed calls while open and close again; a reference client must retry
retryable answers and honour Retry-After."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
from pydantic import Field

from mmchaos.chaos.experiment import Experiment, jsonable
from mmchaos.chaos.spec import ServingParams
from mmchaos.checks.base import Check, CheckContext, Gate
from mmchaos.checks.serving._common import (
    EMBEDS,
    experiment_finding,
    not_run,
)
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.wrappers import DelegatingTarget, unwrap

__all__ = ["FailSwitch", "ServingResilience"]


R = TypeVar("R")


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
_PROBE_BACKOFF_S = 0.01
"""Backoff base of the reference client in the retry probes (its default is 0.1 s)."""


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
    requires = EMBEDS

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        from mmchaos.targets.openai_http import OpenAITarget

        inner = unwrap(ctx.target)
        remote = isinstance(inner, OpenAITarget)
        switch = None if remote or not p.breaker else FailSwitch(ctx.target)  # timed: model time
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
                not_run(
                    self,
                    ctx,
                    "breaker",
                    "the model behind an openai: endpoint cannot be made to fail from here; serve an in-process "
                    "target to test the reference server's breaker",
                ),
            )
        yield from findings
        yield experiment_finding(self, ctx, ex, title="resilience experiment")

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
                with httpx.Client(base_url=ex.dep.root, trust_env=False, timeout=5.0, verify=ex.tls) as c:
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

        from mmchaos.chaos.budget import budgeted_transports
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
            transport = sync_cls(httpx.HTTPTransport(verify=ex.tls), ex.ledger, ex.inspector)
            target = OpenAITarget(
                f"{ex.dep.url}{ex.dep.prefix}",
                model=ex.dep.model,
                capabilities=[Capability.EMBED_TEXT if text else Capability.EMBED_IMAGE],
                image_input=ex.dep.image_form,
                api_key_env=key_env,
                timeout=p.request_timeout_s,
                max_retries=max_retries,
                # What the probes judge (which answers are retried, how many calls get through, the
                # amplification, Retry-After honoured) does not depend on how long the client backs
                # off between retries without a Retry-After; a short base keeps the 429 probe short.
                backoff_base=_PROBE_BACKOFF_S,
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
            "backoff_base_s": _PROBE_BACKOFF_S,
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
