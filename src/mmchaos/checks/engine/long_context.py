"""Step 4: a fact in a long prompt, at its start, middle and end, up to the model's context limit.

A known fact (the needle: "The secret code of <name> is <number>.") is placed at the start, the
middle or the end of filler text, at prompt lengths that grow to the target's limit (its
``context_tokens``, an ``openai:`` endpoint's ``max_model_len`` in ``/models``, or the
``context_tokens`` parameter; without one the check skips and says so), and the target is asked for
it. Answer accuracy is reported by position and length. Token counts are measured, not guessed:
the prompt tokens of a prompt with no filler and with some filler give the base and the slope.

Two serving bugs lose the start of a long prompt without a word, and this tells them apart:

- left truncation (a prompt cut to fewer tokens than the model has, keeping the end): the start is
  lost and the reported prompt tokens fall short of what was sent;
- position ids restarted at 0 past a window (RoPE positions reset by a chunking or packing bug, a
  cache keyed on position ids): every token is counted, but what lies more than the window before
  the question is not read.

The gate: wherever the target recalls the fact in the shortest prompt, it must still recall it, at
the same position, in every longer prompt within the limit. A target that recalls it nowhere, even
in the shortest prompt (a model too small for the task), gets a warning that the check could not
judge it, never a pass. A prompt refused well within the stated limit (by more than 3% of it, the
slack of the estimated counts) fails too: the server's limit is not the one it states.

On a white-box target with a rotary embedding (the built-in tiny-vlm, ``hf:`` VLMs) a second
finding reads the position ids the model gets for the longest prompt: they must count 0 to n-1 (a
restart at 0 fails it, naming the token), which shows the bug on a model too small to recall.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.errors import TargetCallError
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import GenerationParams, Message
from mmchaos.targets.wrappers import unwrap

__all__ = ["LongContextRecall", "context_limit_of", "rotary_modules"]

POSITIONS = ("start", "middle", "end")
_FILLER_TEXT = (
    "The river bends twice before it reaches the old mill, where the grass grows tall and the "
    "wind moves slowly over the fields."
)
_FILLER = _FILLER_TEXT.split()
_NAMES = ("Alder", "Birch", "Cedar", "Hazel", "Maple", "Rowan", "Willow", "Aspen")


def rotary_modules(module: Any) -> list[Any]:
    """The rotary position embeddings of a torch module (transformers' ``*RotaryEmbedding``), which
    get the position ids of every forward pass."""
    return [m for _, m in module.named_modules() if type(m).__name__.endswith("RotaryEmbedding")]


def context_limit_of(target: Target) -> int | None:
    """The target's context limit in tokens, where it states one: ``context_tokens`` (in-process
    targets), or ``max_model_len`` in the ``/models`` card of an ``openai:`` endpoint (vLLM's)."""
    for t in (target, unwrap(target)):
        limit = getattr(t, "context_tokens", None)
        if isinstance(limit, int) and limit > 0:
            return limit
        card = (getattr(t, "metadata", None) or {}).get("card") or {}
        limit = card.get("max_model_len") if isinstance(card, dict) else None
        if isinstance(limit, int) and limit > 0:
            return limit
    return None


class LongContextRecallParams(Params):
    context_tokens: int | None = Field(
        default=None, ge=64, description="the context limit; default: the target's (context_tokens, max_model_len)"
    )
    lengths: list[float] = Field(
        default_factory=lambda: [0.1, 0.35, 0.65, 0.95],
        description="prompt lengths as shares of the limit (less max_new_tokens), shortest first",
    )
    trials: int = Field(2, ge=1, le=16, description="facts asked per length and position (seeded)")
    max_new_tokens: int = Field(12, ge=2, le=64)

    @field_validator("lengths")
    @classmethod
    def _lengths(cls, v: list[float]) -> list[float]:
        if len(v) < 2 or any(not 0 < x <= 1 for x in v):
            raise ValueError("lengths: at least two shares of the limit, each in (0, 1]")
        return sorted(set(v))


class LongContextRecallGate(Gate):
    min_accuracy: float = Field(
        0.5, ge=0.0, le=1.0, description="accuracy at a position where the shortest prompt recalls the fact"
    )


class LongContextRecall(Check[LongContextRecallParams, LongContextRecallGate]):
    """A fact at the start, middle and end of prompts growing to the limit: is it still recalled?"""

    name = "long_context_recall"
    step = Step.ENGINE
    requires = (frozenset({Capability.GENERATE}),)

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        limit = p.context_tokens or context_limit_of(ctx.target)
        if limit is None:
            yield self.finding(
                ctx, Verdict.SKIPPED,
                "the target states no context limit (no context_tokens, no max_model_len in /models): give the "
                "context_tokens parameter",
            )  # fmt: skip
            return
        rng = ctx.rng("facts")
        probe = self._probe(ctx)
        if isinstance(probe, str):
            yield self.finding(ctx, Verdict.SKIPPED, f"prompt token counts cannot be measured: {probe}")
            return
        base, slope = probe
        usable = limit - p.max_new_tokens - 1
        cells: list[dict[str, Any]] = []
        for share in p.lengths:
            filler = max(math.floor((share * usable - base) / slope), 1)
            for position in POSITIONS:
                for trial in range(p.trials):
                    name = _NAMES[int(rng.integers(len(_NAMES)))]
                    code = str(int(rng.integers(10_000, 100_000)))
                    cells.append(self._ask(ctx, share, position, trial, name, code, filler, base, slope))
        recall = self._verdict(ctx, limit, cells)
        recall.evidence["part"] = "recall"
        yield recall
        longest = max(p.lengths)
        positions = self._positions(ctx, limit, max(math.floor((longest * usable - base) / slope), 1))
        if positions is not None:
            yield positions

    def _positions(self, ctx: CheckContext, limit: int, filler: int) -> Finding | None:
        """White-box: the position ids the model's rotary embedding gets for the longest prompt must
        count 0, 1, ..., n-1 (None where the target has no torch module with a rotary embedding)."""
        inner = unwrap(ctx.target)
        if not inner.has(Capability.TORCH_MODULE):
            return None
        rotary = rotary_modules(inner.torch_module())
        if not rotary:
            return None
        seen: list[Any] = []

        def capture(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            ids = args[1] if len(args) > 1 else kwargs.get("position_ids")
            if ids is not None and not seen:
                seen.append((type(module).__name__, ids.detach().cpu().numpy().copy()))

        # every rotary module: a vision tower's own (Qwen2-VL's, called with a length) gives no ids
        handles = [m.register_forward_pre_hook(capture, with_kwargs=True) for m in rotary]
        try:
            params = GenerationParams(max_new_tokens=1, logprobs=False)
            ctx.target.generate([Message("user", (self._prompt("start", "Alder", "12345", filler),))], params=params)
        except TargetCallError as exc:
            return self.finding(
                ctx, Verdict.SKIPPED, f"the position-id probe was refused ({exc.code})", evidence={"part": "positions"}
            )
        finally:
            for h in handles:
                h.remove()
        if not seen:
            return self.finding(ctx, Verdict.SKIPPED, "the rotary embedding was not called with position ids",
                                evidence={"part": "positions"})  # fmt: skip
        name, ids = seen[0][0], np.asarray(seen[0][1])
        rows = ids.reshape(-1, ids.shape[-1])  # (batch,) or mrope's (3, batch): every row counts up here
        n = int(rows.shape[-1])
        want = np.arange(n)
        bad = [int(np.nonzero(r != want)[0][0]) for r in rows if not np.array_equal(r, want)]
        evidence: dict[str, Any] = {"part": "positions", "prompt_tokens": n, "module": name,
                                    "first_ids": rows[0][:4].tolist(), "last_ids": rows[0][-4:].tolist()}  # fmt: skip
        gate = "the prefill's position ids are 0, 1, ..., n-1"
        if not bad:
            return self.finding(
                ctx, Verdict.PASS, f"position ids count 0 to {n - 1} over a {n}-token prompt (limit {limit})",
                metrics={"position_probe_tokens": float(n)}, gate=gate, evidence=evidence,
            )  # fmt: skip
        at = min(bad)
        got = int(rows[0][at])
        what = "restart at 0" if got == 0 else f"jump to {got}"
        evidence["first_wrong"] = at
        return self.finding(
            ctx, Verdict.FAIL, f"position ids {what} at token {at} of a {n}-token prompt (limit {limit})",
            severity=Severity.HIGH, metrics={"position_probe_tokens": float(n), "first_wrong_position": float(at)},
            gate=gate, evidence=evidence,
            message="RoPE sees token i at another position: attention between the parts of the prompt is wrong",
            suggestion="keep position ids increasing over the whole prompt (chunked prefill, packing, cache "
            "offsets); check rope_scaling and the max positions the server was started with",
        )  # fmt: skip

    # -- requests --------------------------------------------------------------------------------

    @staticmethod
    def _prompt(position: str, name: str, code: str, filler: int) -> str:
        words = [_FILLER[i % len(_FILLER)] for i in range(filler)]
        at = {"start": 0, "middle": filler // 2, "end": filler}[position]
        needle = f"The secret code of {name} is {code}.".split()
        body = words[:at] + needle + words[at:]
        return " ".join(body) + f" What is the secret code of {name}? Answer with the number only."

    def _generate(self, ctx: CheckContext, prompt: str) -> Any:
        params = GenerationParams(max_new_tokens=self.params.max_new_tokens, logprobs=False)
        return ctx.target.generate([Message("user", (prompt,))], params=params)

    def _probe(self, ctx: CheckContext) -> tuple[int, float] | str:
        """(prompt tokens with no filler, tokens per filler word), measured: over a whole cycle of the
        filler where it fits (its words tokenize unevenly), else over fewer words."""
        try:
            a = self._generate(ctx, self._prompt("end", "Alder", "12345", 1))
        except TargetCallError as exc:
            return f"a short prompt was refused ({exc.code}: {exc.message[:120]})"
        if a.prompt_tokens is None:
            return "the target reports no prompt token counts"
        for more in (len(_FILLER), 8, 2):
            try:
                b = self._generate(ctx, self._prompt("end", "Alder", "12345", 1 + more))
            except TargetCallError:
                continue  # too long for a small context: measure over fewer words
            if b.prompt_tokens is None:
                return "the target reports no prompt token counts"
            slope = max((b.prompt_tokens - a.prompt_tokens) / more, 1e-6)
            return max(round(a.prompt_tokens - slope), 1), slope
        return "every prompt with filler was refused"

    def _ask(
        self, ctx: CheckContext, share: float, position: str, trial: int, name: str, code: str,
        filler: int, base: int, slope: float,
    ) -> dict[str, Any]:  # fmt: skip
        expected = base + round(slope * filler)
        cell: dict[str, Any] = {"share": share, "position": position, "trial": trial, "code": code,
                                "filler_words": filler, "expected_prompt_tokens": expected}  # fmt: skip
        try:
            result = self._generate(ctx, self._prompt(position, name, code, filler))
        except TargetCallError as exc:
            cell.update(outcome="refused", code_error=exc.code, message=exc.message[:160], correct=False)
            return cell
        cell.update(outcome="answered", answer=result.text[:80], prompt_tokens=result.prompt_tokens,
                    correct=code in result.text)  # fmt: skip
        return cell

    # -- judgement -------------------------------------------------------------------------------

    def _verdict(self, ctx: CheckContext, limit: int, cells: list[dict[str, Any]]) -> Finding:
        g = self.gate
        margin = max(8, round(0.03 * limit))  # token counts are estimated from the probe's slope
        for c in cells:
            c["within_limit"] = c["expected_prompt_tokens"] + self.params.max_new_tokens <= limit - margin
        answered = [c for c in cells if c["outcome"] == "answered"]
        shares = sorted({c["share"] for c in answered})
        acc: dict[str, dict[str, float]] = {}
        tokens: dict[str, int] = {}
        for share in shares:
            row = [c for c in answered if c["share"] == share]
            tokens[f"{share:g}"] = max(c["expected_prompt_tokens"] for c in row)
            acc[f"{share:g}"] = {
                pos: sum(c["correct"] for c in row if c["position"] == pos) / n
                for pos in POSITIONS
                if (n := sum(c["position"] == pos for c in row))
            }
        metrics: dict[str, float] = {"context_tokens": float(limit)}
        for key, by_pos in acc.items():
            for pos, a in by_pos.items():
                metrics[f"accuracy_{pos}_{tokens[key]}"] = a
        evidence: dict[str, Any] = {"accuracy": {f"{tokens[s]} tokens": r for s, r in acc.items()},
                                    "prompt_tokens": tokens, "seed": ctx.seed, "cells": cells}  # fmt: skip
        gate = (
            f"where the shortest prompt recalls the fact, every longer prompt within the {limit}-token limit "
            f"recalls it at the same position (accuracy >= {g.min_accuracy:g})"
        )
        table = "; ".join(
            f"{tokens[s]} tokens: " + ", ".join(f"{pos} {a:.0%}" for pos, a in r.items()) for s, r in acc.items()
        )
        if not shares:
            c = cells[0]
            return self.finding(
                ctx, Verdict.FAIL if c["within_limit"] else Verdict.WARN,
                f"every prompt was refused, the shortest ({c['expected_prompt_tokens']} tokens, limit {limit}) "
                f"included ({c.get('code_error')})", severity=Severity.MEDIUM, metrics=metrics, gate=gate,
                evidence=evidence,
            )  # fmt: skip
        first = acc[f"{shares[0]:g}"]
        judged = [pos for pos in POSITIONS if first.get(pos, 0.0) >= g.min_accuracy]
        if not judged:
            return self.finding(
                ctx, Verdict.WARN,
                f"the target recalls the fact nowhere, even in a {tokens[f'{shares[0]:g}']}-token prompt: "
                "position and length effects cannot be judged",
                severity=Severity.LOW, metrics=metrics, gate=gate, evidence=evidence, message=table,
                suggestion="run it on a model that can answer the question (the tiny built-in models cannot)",
            )  # fmt: skip
        lost = {(pos, s) for pos in judged for s in shares[1:] if acc[f"{s:g}"].get(pos, 1.0) < g.min_accuracy}
        refused = [c for c in cells if c["outcome"] == "refused" and c["within_limit"]]
        evidence["refused_near_the_limit"] = sum(c["outcome"] == "refused" and not c["within_limit"] for c in cells)
        if not lost and not refused:
            return self.finding(
                ctx, Verdict.PASS, f"the fact is recalled at every position up to {max(tokens.values())} tokens "
                f"(limit {limit}): {table}", metrics=metrics, gate=gate, evidence=evidence,
            )  # fmt: skip
        if not lost:
            c = refused[0]
            return self.finding(
                ctx, Verdict.FAIL,
                f"a {c['expected_prompt_tokens']}-token prompt within the {limit}-token limit is refused "
                f"({c['code_error']})", severity=Severity.MEDIUM, metrics=metrics, gate=gate,
                evidence=evidence, message=table,
                suggestion="make the server's max length equal the model's (max_model_len)",
            )  # fmt: skip
        share = min(s for _, s in lost)
        at = tokens[f"{share:g}"]
        short = [c for c in cells if c["share"] == share and c["outcome"] == "answered"
                 and isinstance(c.get("prompt_tokens"), int)
                 and c["prompt_tokens"] < 0.9 * c["expected_prompt_tokens"]]  # fmt: skip
        where = [p for p in POSITIONS if (p, share) in lost]
        if short:
            kept = max(c["prompt_tokens"] for c in short)
            cause = (
                f"truncated on the left: {short[0]['expected_prompt_tokens']} tokens sent, {kept} counted; "
                f"the start of the prompt is dropped without an error"
            )
            evidence["diagnosis"] = "left_truncation"
            evidence["kept_tokens"] = kept
            suggestion = (
                "refuse prompts over the limit with a 400 (never truncate silently), and set the server's "
                "truncation length (truncate_prompt_tokens, max_input_length) to the model's limit"
            )
        else:
            window = max(
                (tokens[f"{s:g}"] for s in shares if all(acc[f"{s:g}"].get(p, 1.0) >= g.min_accuracy for p in where)),
                default=None,
            )
            cause = (
                "every token was counted, yet what lies far before the question is not read: position ids "
                "restarted at 0 past a window"
                + (f" (it still reads {window}-token prompts)" if window else "")
                + ", a sliding window shorter than the limit, or a truncation that reports the full count"
            )
            evidence["diagnosis"] = "positions_not_read"
            suggestion = (
                "keep position ids increasing over the whole prompt (chunked prefill, packing and cache offsets); "
                "check rope_scaling and sliding_window against the context length served"
            )
        return self.finding(
            ctx, Verdict.FAIL,
            f"the fact at the {', '.join(where)} of a {at}-token prompt (limit {limit}) is lost: {cause}",
            severity=Severity.HIGH, metrics=metrics, gate=gate, evidence=evidence, message=table,
            suggestion=suggestion,
        )  # fmt: skip
