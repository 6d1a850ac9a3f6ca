"""``serving_resilience``: the circuit breaker when the model fails, and client retries under 429/503.

The served target is wrapped in a :class:`FailSwitch` so the upstream can be made to fail on cue;
the breaker must open, shed calls while open and close again; a reference client must retry
retryable answers and honour Retry-After.

A generative target is driven with chat completions, half of them streamed (``payload.stream_share``);
the breaker sees streamed model calls fail too, the reference client retries chat requests, and one
more probe cuts the client's streams mid-way (the proxy closes each connection half-way through its
answer): every cut stream must end in a typed client error, never come back as a complete answer.
Known-answer questions asked before and after must still be answered right (:mod:`._answers`)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from pydantic import Field, model_validator

from mmchaos.chaos.experiment import Experiment, jsonable
from mmchaos.chaos.spec import ServingParams
from mmchaos.checks.base import Check, CheckContext, Gate
from mmchaos.checks.serving._answers import answers_finding, known_answer_samples_for, probe_answers
from mmchaos.checks.serving._common import (
    EMBEDS,
    chat_params,
    default_stream_share,
    experiment_finding,
    fit_windows,
    measured,
    not_run,
    serves_chat,
)
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import GenerationParams
from mmchaos.targets.wrappers import DelegatingTarget, unwrap

if TYPE_CHECKING:
    from mmchaos.data.base import Sample
    from mmchaos.targets.openai_http import OpenAITarget

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

    def generate_stream(
        self, prompt: Any, images: Sequence[Any] = (), params: GenerationParams | None = None
    ) -> Iterator[str]:
        # A stream is a model call too: it fails at its start, before its first delta, as a
        # model that is down does (the delegate passes streams through uncounted).
        return self.call(super().generate_stream, prompt, images, params)


CHAT_STREAM_SHARE = 0.5
"""Chat targets: the share of the good traffic streamed, unless ``payload.stream_share`` says."""
_INJECTED = "injected upstream failure (mmchaos serving_resilience)"
_CHAT_PARAMS = GenerationParams(max_new_tokens=4, temperature=0.0)
"""What the retry probes ask a chat target: greedy and short (what is judged is the retrying)."""
_OPEN_QUESTION = "Describe the picture in a few words."
"""What the cut-stream probe asks: an open question, so the answer runs to max_tokens and a stream
cut half-way through its bytes is cut in its text too."""
_BREAKER_GRACE_S = 5.0
"""How long past ``failure_s`` the model keeps failing, at most, while fewer requests than the
breaker's minimum calls have reached it."""
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
    stream_calls: int = Field(3, ge=0, le=100, description="chat targets: client streams cut mid-way (0: no probe)")
    known_answers: int = Field(
        3, ge=0, le=6, description="chat targets: known-answer questions asked before and after the method"
    )

    @model_validator(mode="before")
    @classmethod
    def _streamed(cls, data: Any) -> Any:
        return default_stream_share(data, CHAT_STREAM_SHARE)


class ServingResilienceGate(Gate):
    max_failures_to_open: int = Field(50, ge=1, description="failed model calls before the breaker opens")
    max_calls_while_open: int = Field(0, ge=0, description="model calls while the breaker is open")
    min_retry_success_rate: float = Field(
        0.85, ge=0.0, le=1.0, description="calls the client's retry policy gets through the 429s (expected rate)"
    )
    answers_kept: bool = Field(
        True, description="chat targets: known-answer questions answered right before the method still are after"
    )


class ServingResilience(Check[ServingResilienceParams, ServingResilienceGate]):
    """Breaker behaviour when the model fails (opens, sheds, recovers) and client retries under 429/503."""

    name = "serving_resilience"
    step = Step.SERVING
    requires = (*EMBEDS, frozenset({Capability.GENERATE}))  # generative targets: chat completions

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        from mmchaos.targets.openai_http import OpenAITarget

        inner = unwrap(ctx.target)
        remote = isinstance(inner, OpenAITarget)
        switch = None if remote or not p.breaker else FailSwitch(ctx.target)  # timed: model time
        chat = serves_chat(inner.capabilities)
        samples = known_answer_samples_for(ctx, p.known_answers) if chat else []
        answers_before = answers_after = None
        ran: list[str] = []  # what the method did, for the known-answer finding's wording
        bar = ctx.progress.task(f"{ctx.check_id}: resilience", total=3)
        findings: list[Finding] = []
        ex = Experiment(
            ctx,
            chat_params(p, chat),
            title="resilience",
            description="the model fails behind the breaker; clients meet 429 and 503",
            served=switch,
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
                if before.met(ex.slo):
                    if switch is not None:
                        findings.append(self._breaker(ctx, ex, switch))
                        ran.append("the model failed")
                    bar.advance()
                    if p.retries and not ex.stopped:
                        findings.append(self._retries(ctx, ex))
                        ran.append("clients met 429 and 503")
                    if chat and p.stream_calls and samples and not ex.stopped:
                        findings.append(self._cut_streams(ctx, ex, samples))
                        ran.append("streams were cut")
                    if not ex.stopped:
                        ex.steady_state("after")
                    if answers_before is not None and not ex.stopped:
                        answers_after = probe_answers(ex, "known_answers_after", samples, p.payload.max_tokens)
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
        if answers_before is not None:
            what = f"the method ({', '.join(ran)})" if ran else "the method"
            yield answers_finding(self, ctx, answers_before, answers_after, gated=self.gate.answers_kept,
                                  after_what=what)  # fmt: skip
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
        failed_before = switch.failed_calls

        def breaker_had_its_chance(_: Any) -> str | None:
            # At least failure_s of failing, then until the breaker opened or as many failures reached
            # the model as it needs to open (its minimum calls): on a busy machine failure_s alone may
            # hold fewer requests than that, and "never opened" would then be a verdict on speed.
            if time.monotonic() - started < p.failure_s:
                return None
            if breaker.state.value in ("open", "forced_open"):
                return "the breaker opened"
            if switch.failed_calls - failed_before >= breaker.minimum_calls:
                return "the breaker's minimum calls failed"
            return None

        try:
            failing = ex.phase(
                "model_failing", seconds=p.failure_s + max(p.failure_s, _BREAKER_GRACE_S), guarded=False,
                stop_when=breaker_had_its_chance, activity="action",
            )  # fmt: skip
            if breaker.state.value in ("open", "forced_open"):
                seen = len(transitions)
                with httpx.Client(base_url=ex.dep.root, trust_env=False, timeout=5.0, verify=ex.tls) as c:
                    ready = c.get("/readyz").status_code
                # judged only if the breaker stayed open while /readyz answered: past its open wait a
                # straggling call may turn it half-open meanwhile, and 200 is then the right answer
                if len(transitions) == seen and breaker.state.value in ("open", "forced_open"):
                    ready_while_open = ready
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
                # what was not measured (the breaker never opened, the service never recovered) is
                # left out, never a placeholder number
                **measured(failures_to_open=opened_after),
                "rejected_503": float(rejected),
                "model_calls_while_failing": float(calls_failing),
                "model_calls_while_open": float(switch.calls_while_open),
                **measured(recovery_s=recovery_s),
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

    def _client(self, ctx: CheckContext, ex: Experiment, max_retries: int) -> tuple[OpenAITarget, Any]:
        """The reference client (mmchaos's own ``openai:`` target) through the proxy, its requests in
        the experiment's ledger and its attempts recorded by the transport."""
        import httpx

        from mmchaos.chaos.budget import budgeted_transports
        from mmchaos.targets.openai_http import OpenAITarget

        p = self.params
        _, sync_cls = budgeted_transports()
        inner = unwrap(ctx.target)
        key_env = inner.api_key_env if isinstance(inner, OpenAITarget) else "MMCHAOS_SERVING_NO_API_KEY"
        caps = ex.dep.capabilities
        text = Capability.EMBED_TEXT in caps
        capability = (
            Capability.GENERATE if serves_chat(caps) else Capability.EMBED_TEXT if text else Capability.EMBED_IMAGE
        )
        transport = sync_cls(httpx.HTTPTransport(verify=ex.tls), ex.ledger, ex.inspector)
        target = OpenAITarget(
            f"{ex.dep.url}{ex.dep.prefix}",
            model=ex.dep.model,
            capabilities=[capability],
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

    def _retries(self, ctx: CheckContext, ex: Experiment) -> Finding:
        from mmchaos.targets.openai_http import EndpointError

        p = self.params
        g = self.gate
        caps = ex.dep.capabilities
        chat = serves_chat(caps)
        text = Capability.EMBED_TEXT in caps
        image = np.full((32, 32, 3), 120, np.uint8)

        def client(max_retries: int) -> tuple[OpenAITarget, Any]:
            return self._client(ctx, ex, max_retries)

        def call(t: OpenAITarget) -> str | None:
            try:
                if chat:
                    t.generate("What colour is the shape?", [image], _CHAT_PARAMS)
                elif text:
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

    def _cut_streams(self, ctx: CheckContext, ex: Experiment, samples: Sequence[Sample]) -> Finding:
        """The proxy closes each of the reference client's streams half-way through its answer: every
        one must end in a typed client error (or, retried, in the complete answer), never come back
        to the caller as if it were complete."""
        import httpx

        from mmchaos.chaos.budget import budgeted_transports
        from mmchaos.targets.openai_http import EndpointError

        p = self.params
        params = GenerationParams(max_new_tokens=p.payload.max_tokens, temperature=0.0)
        started = time.monotonic()
        ex.inspector.phase = "cut_streams"
        rows: list[dict[str, Any]] = []
        t, _ = self._client(ctx, ex, p.client_max_retries)
        _, sync_cls = budgeted_transports()
        raw = httpx.Client(transport=sync_cls(httpx.HTTPTransport(verify=ex.tls), ex.ledger, ex.inspector),
                           headers=dict(ex.dep.auth), timeout=p.request_timeout_s, trust_env=False)  # fmt: skip
        try:
            for i in range(p.stream_calls):
                if ex.ledger.remaining_requests() <= 8 or ex.stopped:
                    break
                s = samples[i % len(samples)]
                image, question = s.load_image(), _OPEN_QUESTION
                row: dict[str, Any] = {"call": i, "question": question}
                try:  # the clean stream: what the complete answer is, and how many bytes it takes
                    clean = "".join(t.generate_stream(question, [image], params))
                except EndpointError as exc:
                    rows.append({**row, "outcome": f"clean stream failed: {exc.code}"})
                    continue
                cut_at = _half_way(raw, ex, question, image, p.payload.max_tokens)
                if cut_at is None:
                    rows.append({**row, "outcome": "clean stream not measured"})
                    continue
                row.update(clean=clean[:80], cut_after_bytes=cut_at)
                ex.add_toxic({"name": "cut-streams", "type": "limit_data", "attributes": {"bytes": cut_at}})
                try:
                    got = "".join(t.generate_stream(question, [image], params))
                except EndpointError as exc:
                    row.update(outcome="typed error", code=exc.code)
                else:
                    row.update(outcome="complete" if got == clean else "accepted cut", got=got[:80])
                finally:
                    ex.remove_faults("end of cut stream")
                rows.append(row)
        finally:
            t.close()
            raw.close()
        ex.activity("probe", "cut_streams", started, {"calls": rows})
        cut = [r for r in rows if "cut_after_bytes" in r]
        typed = [r for r in cut if r["outcome"] == "typed error"]
        accepted = [r for r in cut if r["outcome"] == "accepted cut"]
        complete = [r for r in cut if r["outcome"] == "complete"]
        codes: dict[str, int] = {}
        for r in typed:
            codes[r["code"]] = codes.get(r["code"], 0) + 1
        metrics = {"cut_calls": float(len(cut)), "typed_errors": float(len(typed)),
                   "accepted_cut": float(len(accepted)), "complete": float(len(complete))}  # fmt: skip
        gate = "a stream cut mid-way ends in a typed client error or the complete answer, never a partial one"
        evidence = jsonable({"client": "mmchaos openai: target (the reference client)", "calls": rows})
        if accepted:
            message = (f"{len(accepted)} of {len(cut)} streams cut half-way came back to the caller as complete "
                       f"answers (e.g. {accepted[0]['got']!r} for {accepted[0]['clean']!r})")  # fmt: skip
            return self.finding(
                ctx, Verdict.FAIL, f"cut streams: {message}", severity=Severity.HIGH, metrics=metrics, gate=gate,
                message=message, evidence=evidence,
                suggestion="a stream is complete only at data: [DONE] or choice 0's finish_reason: raise on "
                "anything else (the openai SDK and mmchaos's client do), never hand a cut answer on as whole",
            )  # fmt: skip
        if not typed:
            why = ("no stream could be cut: " + "; ".join(sorted({str(r["outcome"]) for r in rows}))) if rows else (
                "no stream was asked (budget)")  # fmt: skip
            return self.finding(ctx, Verdict.WARN, f"cut streams: not tested ({why})", severity=Severity.LOW,
                                metrics=metrics, gate=gate, message=why, evidence=evidence)  # fmt: skip
        shown = ", ".join(f"{c} x{n}" for c, n in sorted(codes.items()))
        extra = f"; {len(complete)} completed before the cut" if complete else ""
        return self.finding(
            ctx, Verdict.PASS,
            f"cut streams: {len(typed)} of {len(cut)} streams cut half-way ended in a typed client error ({shown})"
            + extra, metrics=metrics, gate=gate, evidence=evidence,
        )  # fmt: skip


def _half_way(raw: Any, ex: Experiment, question: str, image: Any, max_tokens: int) -> int | None:
    """Bytes of a clean streamed answer's status line, headers and half its body: a ``limit_data``
    toxic of that size closes the connection in the middle of its events (None: it did not answer)."""
    from mmchaos.chaos.payloads import png_data_url
    from mmchaos.checks.evidence import png_bytes
    from mmchaos.targets.openai_forms import chat_body, chat_image_content

    content = chat_image_content([png_data_url(png_bytes(image))], question)
    body = chat_body(ex.dep.model, content, max_tokens=max_tokens, temperature=0, stream=True)
    try:
        resp = raw.post(f"{ex.dep.url}{ex.dep.prefix}/chat/completions", json=body)
    except Exception:  # the transport failed: nothing measured, never raised
        return None
    if resp.status_code != 200:
        return None
    head = len(b"HTTP/1.1 200 OK\r\n") + sum(len(k) + len(v) + 4 for k, v in resp.headers.raw) + 2
    return head + max(1, len(resp.content) // 2)
