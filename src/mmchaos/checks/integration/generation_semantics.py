"""Step 5: the generation parameters mean what the OpenAI API says they mean, and answers end by EOS.

A deployment can answer every request and still not honour its parameters: a server that drops
``max_tokens`` (answers run to its own limit, billing and latency with them), one that cuts an
answer but reports ``finish_reason: "stop"`` (clients then never know it was cut), a stop sequence
that is ignored or left in the text, ``n`` answered with one choice. And a deployment whose answers
end by the token limit far more often than by EOS is running past the end of its answers (a wrong
EOS in ``generation_config.json``, a chat template whose turn end the model never learned).

Four findings (``evidence["part"]``), every request greedy except ``n``'s:

* ``max_tokens`` -- an open prompt about each probe image, answered with a long limit and with each
  of ``max_tokens`` N: no answer has more than N tokens, and one the long answer shows was cut
  (it has more than N tokens, or more text where tokens are not counted) says ``"length"``.
  Tokens are counted from token ids, else per-token logprobs, else the server's ``usage``;
* ``stop`` -- a stop sequence taken from the middle of each long answer: the answer must be the
  long answer's text before it, without it, finishing ``"stop"``;
* ``n`` -- one sampled request with ``n`` choices must give ``n`` completions (the ``openai:``
  target asks again, one at a time, where a server ignores ``n``: reported, not failed);
* ``finish`` -- the run's questions answered with ``max_new_tokens``: the share that ends by the
  limit rather than by EOS must stay under the gate.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import Field

from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.checks.engine.generation_inputs import probe_images, probe_requests
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import Completion, GenerationParams, GenerationResult, Message

__all__ = ["GenerationSemantics", "completion_tokens", "stop_probe"]


class GenerationSemanticsParams(Params):
    requests: int = Field(default=3, ge=1, le=16, description="probe images (max_tokens, stop) and questions (finish)")
    open_prompt: str = Field(
        default="Describe this image in detail.", min_length=1, description="the prompt answers are cut on"
    )
    max_tokens: list[int] = Field(default=[1, 3], min_length=1, description="the limits each open prompt is cut at")
    long_max_tokens: int = Field(default=32, ge=2, le=1024, description="the limit of the uncut answers")
    max_new_tokens: int = Field(default=32, ge=1, le=1024, description="the limit of the finish-reason answers")
    n: int = Field(default=2, ge=2, le=8, description="choices asked for in the n request")


class GenerationSemanticsGate(Gate):
    max_violations: int = Field(default=0, ge=0, description="max_tokens, stop and n violations allowed (each part)")
    max_length_share: float = Field(
        default=0.5, ge=0.0, le=1.0, description="share of the questions' answers that may end by the token limit"
    )


def completion_tokens(result: GenerationResult, completion: Completion) -> int | None:
    """How many tokens ``completion`` has: its token ids, else its logprobs, else the answer's
    ``usage.completion_tokens`` (one choice only); None where the backend tells none of them."""
    if completion.token_ids is not None:
        return len(completion.token_ids)
    if completion.logprobs is not None:
        return len(completion.logprobs)
    usage = result.extra.get("completion_tokens")
    return usage if isinstance(usage, int) and len(result.completions) == 1 else None


def stop_probe(text: str) -> tuple[str, str] | None:
    """A stop sequence from the middle of ``text`` and the text an answer stopped by it keeps (the
    part before its first occurrence); None when ``text`` is too short to hold one past its start."""
    core = text.strip()
    if len(core) < 3:
        return None
    start = text.index(core) + max(1, len(core) // 2)
    stop = text[start : start + 3].strip() or text[start : start + 3]
    if not stop:
        return None
    cut = text.find(stop)
    return (stop, text[:cut]) if cut > 0 else None


def _generate(target: Target, request: Sequence[Message], params: GenerationParams) -> GenerationResult:
    return target.generate(list(request), params=params)


class GenerationSemantics(Check[GenerationSemanticsParams, GenerationSemanticsGate]):
    """max_tokens cuts at N with finish_reason "length", stop sequences stop, n gives n, answers end by EOS."""

    name = "generation_semantics"
    step = Step.INTEGRATION
    requires = (frozenset({Capability.GENERATE}),)

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        target = ctx.target
        opens = [[Message("user", (img, p.open_prompt))] for img in probe_images(ctx, p.requests)]
        longs = [_generate(target, r, GenerationParams(max_new_tokens=p.long_max_tokens)) for r in opens]
        yield self._max_tokens(ctx, opens, longs)
        yield self._stop(ctx, opens, longs)
        yield self._n(ctx, opens[0])
        yield self._finish(ctx)

    # -- max_tokens -----------------------------------------------------------------------------------

    def _max_tokens(self, ctx: CheckContext, opens: list[list[Message]], longs: list[GenerationResult]) -> Finding:
        p, g = self.params, self.gate
        violations: list[dict[str, Any]] = []
        cases: list[dict[str, Any]] = []
        uncounted = 0
        for i, (request, long) in enumerate(zip(opens, longs, strict=True)):
            long_tokens = completion_tokens(long, long.completions[0])
            uncounted += long_tokens is None
            whole = {"request": i, "max_tokens": p.long_max_tokens, "tokens": long_tokens,
                     "finish_reason": long.finish_reason, "cut": None, "text": long.text[:80]}  # fmt: skip
            cases.append(whole)
            if long_tokens is not None and long_tokens > p.long_max_tokens:
                violations.append({**whole, "problem": "more tokens than max_tokens"})
            for limit in p.max_tokens:
                got = _generate(ctx.target, request, GenerationParams(max_new_tokens=limit))
                answer = got.completions[0]
                tokens = completion_tokens(got, answer)
                uncounted += tokens is None
                # not counted: the uncut answer's text says whether there was more to say
                cut = long_tokens > limit if long_tokens is not None else len(long.text) > len(answer.text)
                case = {"request": i, "max_tokens": limit, "tokens": tokens, "finish_reason": answer.finish_reason,
                        "cut": cut, "text": answer.text[:80]}  # fmt: skip
                cases.append(case)
                if tokens is not None and tokens > limit:
                    violations.append({**case, "problem": "more tokens than max_tokens"})
                elif cut and answer.finish_reason != "length":
                    violations.append({**case, "problem": "cut, but finish_reason is not 'length'"})
        over = max(((c["tokens"] or 0) - c["max_tokens"] for c in cases), default=0)
        metrics = {"cases": float(len(cases)), "violations": float(len(violations)), "uncounted": float(uncounted),
                   "max_tokens_over": float(max(over, 0))}  # fmt: skip
        evidence: dict[str, Any] = {"part": "max_tokens", "seed": ctx.seed, "prompt": p.open_prompt,
                                    "cases": cases[:12], "violations": violations[:6]}  # fmt: skip
        gate = f"at most {g.max_violations} answers over max_tokens or cut without finish_reason 'length'"
        limits = "/".join(str(n) for n in p.max_tokens)
        if len(violations) <= g.max_violations:
            note = f"; {uncounted} answers' tokens not counted (no token ids, logprobs or usage)" if uncounted else ""
            return self.finding(
                ctx, Verdict.PASS,
                f"max_tokens {limits} honoured: {len(cases)} answers within the limit, cut ones say 'length'{note}",
                metrics=metrics, gate=gate, evidence=evidence,
            )  # fmt: skip
        worst = violations[0]
        shown = f"{worst['tokens']} tokens" if worst.get("tokens") is not None else "an answer"
        return self.finding(
            ctx, Verdict.FAIL,
            f"max_tokens not honoured: {len(violations)} of {len(cases)} answers ({shown} for max_tokens "
            f"{worst['max_tokens']}: {worst['problem']})",
            severity=Severity.HIGH, metrics=metrics, gate=gate, evidence=evidence,
            message="a client cannot bound an answer's length, cost or latency, or tell a cut answer from a whole one",
            suggestion="pass the request's max_tokens (max_completion_tokens) to the engine as max_new_tokens and "
            "report finish_reason 'length' for an answer cut there",
        )  # fmt: skip

    # -- stop -------------------------------------------------------------------------------------------

    def _stop(self, ctx: CheckContext, opens: list[list[Message]], longs: list[GenerationResult]) -> Finding:
        g = self.gate
        cases: list[dict[str, Any]] = []
        violations: list[dict[str, Any]] = []
        for i, (request, long) in enumerate(zip(opens, longs, strict=True)):
            probe = stop_probe(long.text)
            if probe is None:
                continue
            stop, want = probe
            got = _generate(ctx.target, request, GenerationParams(max_new_tokens=self.params.long_max_tokens,
                                                                  stop=(stop,))).completions[0]  # fmt: skip
            case = {"request": i, "stop": stop, "expected": want[:80], "got": got.text[:80],
                    "finish_reason": got.finish_reason}  # fmt: skip
            cases.append(case)
            if stop in got.text:
                problem = "the stop sequence is left in the text" if got.text.startswith(want + stop) else "ignored"
                violations.append({**case, "problem": problem})
            elif got.text != want or got.finish_reason != "stop":
                violations.append({**case, "problem": "not the text before the stop sequence, finishing 'stop'"})
        metrics = {"cases": float(len(cases)), "violations": float(len(violations))}
        evidence: dict[str, Any] = {"part": "stop", "seed": ctx.seed, "cases": cases[:6]}
        gate = f"at most {g.max_violations} answers not stopped at (and without) the stop sequence"
        if not cases:
            return self.finding(
                ctx, Verdict.SKIPPED,
                "stop sequences not judged: every uncut answer was too short to hold one past its start",
                metrics=metrics, evidence=evidence,
            )  # fmt: skip
        if len(violations) <= g.max_violations:
            return self.finding(
                ctx, Verdict.PASS, f"stop sequences stop: {len(cases)} answers end before their stop sequence",
                metrics=metrics, gate=gate, evidence=evidence,
            )  # fmt: skip
        evidence["violations"] = violations[:6]
        first = violations[0]
        return self.finding(
            ctx, Verdict.FAIL,
            f"stop sequences do not stop: {len(violations)} of {len(cases)} answers ({first['problem']}: stop "
            f"{first['stop']!r}, got {first['got'][:40]!r})",
            severity=Severity.MEDIUM, metrics=metrics, gate=gate, evidence=evidence,
            suggestion="pass the request's stop strings to the engine, end the answer at the first one and leave it "
            "out of the text, with finish_reason 'stop'",
        )  # fmt: skip

    # -- n ----------------------------------------------------------------------------------------------

    def _n(self, ctx: CheckContext, request: list[Message]) -> Finding:
        n = self.params.n
        params = GenerationParams(max_new_tokens=4, temperature=1.0, seed=ctx.seed, n=n)
        got = _generate(ctx.target, request, params)
        emulated = got.extra.get("n_emulated_requests")
        metrics = {"n": float(n), "choices": float(len(got.completions)),
                   "emulated_requests": float(emulated) if isinstance(emulated, int) else 0.0}  # fmt: skip
        evidence = {"part": "n", "seed": ctx.seed, "texts": [c.text[:40] for c in got.completions]}
        if len(got.completions) < n:
            return self.finding(
                ctx, Verdict.FAIL, f"n={n} gives {len(got.completions)} choices", severity=Severity.MEDIUM,
                metrics=metrics, gate=f"n={n} gives {n} choices", evidence=evidence,
                suggestion="return n choices (vLLM: SamplingParams(n=...)), or refuse n > 1 with a 400",
            )  # fmt: skip
        note = f" (the server answered one; {emulated} more asked one at a time)" if emulated else ""
        return self.finding(ctx, Verdict.PASS, f"n={n} gives {n} choices{note}", metrics=metrics, evidence=evidence)

    # -- how answers end --------------------------------------------------------------------------------

    def _finish(self, ctx: CheckContext) -> Finding:
        p, g = self.params, self.gate
        requests, ids = probe_requests(ctx, p.requests)
        params = GenerationParams(max_new_tokens=p.max_new_tokens)
        answers = [_generate(ctx.target, r, params) for r in requests]
        by_length = [i for i, a in zip(ids, answers, strict=True) if a.finish_reason == "length"]
        share = len(by_length) / len(answers)
        metrics = {"answers": float(len(answers)), "ended_by_length": float(len(by_length)), "length_share": share}
        evidence: dict[str, Any] = {"part": "finish", "seed": ctx.seed, "max_new_tokens": p.max_new_tokens,
                                    "ended_by_length": by_length,
                                    "answers": [a.text[:60] for a in answers]}  # fmt: skip
        gate = f"at most {g.max_length_share:.0%} of answers end by max_new_tokens"
        title = f"{len(by_length)} of {len(answers)} answers end by the {p.max_new_tokens}-token limit, the rest by EOS"
        if share <= g.max_length_share:
            return self.finding(ctx, Verdict.PASS, title, metrics=metrics, gate=gate, evidence=evidence)
        return self.finding(
            ctx, Verdict.FAIL, f"answers run on: {title}", severity=Severity.HIGH, metrics=metrics, gate=gate,
            evidence=evidence,
            message="answers that end by the token limit far more often than by EOS run past their end: the EOS "
            "generate stops on is not the one the model ends answers with",
            suggestion="serve the checkpoint's generation_config.json eos_token_id (it must include the tokenizer's "
            "EOS and the chat template's turn end); fingerprint_match names a mismatch",
        )  # fmt: skip
