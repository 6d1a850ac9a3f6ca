"""Step 4: images that eat the context: what happens at the model's limit.

Image tokens are a large, indivisible part of a VLM prompt. Requests with two images and a
growing text are sent at lengths around the context limit (the target's ``context_tokens``, or
the ``context_tokens`` parameter), with the images before the text and after it, so truncation
from either side would reach them; the farthest request is over the limit by a whole prompt
without filler, so whatever a truncation cuts, it reaches the images. Token counts are measured,
not guessed: the prompt tokens of the images with no filler and with a little filler give each
arrangement's base and slope.

Within the limit the target must answer with every image token. Past it (prompt plus
``max_new_tokens`` over the limit) the acceptable outcomes are a typed refusal before the model,
or a truncation that keeps every image token (text dropped, images whole). A failure is an answer
with fewer image tokens than the images make (truncated or silently dropped images), an answer
that ran past the model's positions without a word, or a crash inside the model.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from pydantic import Field

from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.checks.engine.generation_inputs import probe_images
from mmchaos.errors import TargetCallError
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability
from mmchaos.targets.generation import GenerationParams, GenerationResult, Message

__all__ = ["ImageContextBoundary"]

_FILLER = " the"
_QUESTION = " What do the images show?"


class ImageContextBoundaryParams(Params):
    context_tokens: int | None = Field(
        default=None, ge=8, description="the context limit; default: the target's context_tokens"
    )
    images: int = Field(default=2, ge=1, le=8)
    max_new_tokens: int = Field(default=4, ge=1, le=64)
    max_filler: int = Field(default=100_000, ge=1, description="largest filler count sent (bounds the request)")


class ImageContextBoundaryGate(Gate):
    allow_refusal_within_limit: bool = Field(
        default=False, description="accept a target that refuses requests that fit (a conservative margin)"
    )


class ImageContextBoundary(Check[ImageContextBoundaryParams, ImageContextBoundaryGate]):
    """At the context limit with images: a typed refusal or whole image tokens, never silent truncation."""

    name = "image_context_boundary"
    step = Step.ENGINE
    requires = (frozenset({Capability.GENERATE}),)

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        limit = p.context_tokens or getattr(ctx.target, "context_tokens", None)
        if not isinstance(limit, int) or limit <= 0:
            yield self.finding(
                ctx, Verdict.SKIPPED, "the target states no context limit; give the context_tokens parameter",
                evidence={"part": "boundary"},
            )  # fmt: skip
            return
        images = probe_images(ctx, p.images)
        cases: list[dict[str, Any]] = []
        for arrangement in ("images_first", "images_last"):
            cases += self._arrangement(ctx, arrangement, images, limit)
        yield self._verdict(ctx, limit, cases)

    def _request(self, arrangement: str, images: list[Any], filler: int) -> list[Message]:
        text = _FILLER * filler
        parts = (*images, text + _QUESTION) if arrangement == "images_first" else (text, *images, _QUESTION)
        return [Message("user", parts)]

    def _ask(self, ctx: CheckContext, request: list[Message], new: int) -> GenerationResult | dict[str, Any]:
        try:
            return ctx.target.generate(request, params=GenerationParams(max_new_tokens=new, logprobs=False))
        except TargetCallError as exc:
            outcome = "model_crash" if exc.code == "generate_failed" else "refused"
            return {"outcome": outcome, "code": exc.code, "message": exc.message[:200]}
        except Exception as exc:  # an untyped error is a crash this check reports
            return {"outcome": "untyped_error", "message": f"{type(exc).__name__}: {exc}"[:200]}

    def _arrangement(self, ctx: CheckContext, arrangement: str, images: list[Any], limit: int) -> list[dict[str, Any]]:
        p = self.params
        probe = 2
        base, more = self._ask(ctx, self._request(arrangement, images, 0), 1), None
        if isinstance(base, GenerationResult):
            more = self._ask(ctx, self._request(arrangement, images, probe), 1)
        if not isinstance(base, GenerationResult) or not isinstance(more, GenerationResult):
            failed = base if isinstance(base, dict) else more if isinstance(more, dict) else {}
            # the images and question alone: whether they fit is unknown, so only a crash counts
            return [{"arrangement": arrangement, "case": "measure", "expected_fit": None, **failed}]
        if base.prompt_tokens is None or more.prompt_tokens is None:
            return [{"arrangement": arrangement, "case": "measure", "outcome": "no_token_counts"}]
        p0, image_tokens = base.prompt_tokens, base.extra.get("image_tokens")
        slope = max((more.prompt_tokens - p0) / probe, 1e-9)
        new = p.max_new_tokens
        targets = {"fits": limit - new - 1, "prompt_fits_generation_does_not": limit - max(new // 2, 1),
                   "just_over": limit + 2, "over_by_a_whole_prompt": limit + p0 + new}  # fmt: skip
        out = []
        for case, total in targets.items():
            filler = min(max(math.ceil((total - p0) / slope), 0), p.max_filler)
            expected_prompt = p0 + round(slope * filler)
            row: dict[str, Any] = {"arrangement": arrangement, "case": case, "filler": filler,
                                   "expected_prompt_tokens": expected_prompt, "expected_image_tokens": image_tokens,
                                   "expected_fit": expected_prompt + new <= limit}  # fmt: skip
            got = self._ask(ctx, self._request(arrangement, images, filler), new)
            if isinstance(got, dict):
                row.update(got)
            else:
                row.update(outcome="answered", prompt_tokens=got.prompt_tokens,
                           image_tokens=got.extra.get("image_tokens"),
                           generated_tokens=len(got.token_ids) if got.token_ids is not None else None)  # fmt: skip
            out.append(row)
        return out

    @staticmethod
    def _problem(row: dict[str, Any], limit: int, allow_refusal: bool) -> str | None:
        outcome = row.get("outcome")
        where = f"{row['arrangement']}/{row['case']}"
        if outcome in ("model_crash", "untyped_error"):
            return f"{where}: crashed ({row.get('message', '')[:80]})"
        if outcome == "refused":
            if row.get("expected_fit") and not allow_refusal:
                return f"{where}: refused a request that fits ({row.get('code')})"
            return None
        if outcome != "answered":
            return None
        want, got = row.get("expected_image_tokens"), row.get("image_tokens")
        if isinstance(want, int) and isinstance(got, int) and got < want:
            return f"{where}: answered with {got} of {want} image tokens (images truncated or dropped silently)"
        prompt = row.get("prompt_tokens") or 0
        total = prompt + (row.get("generated_tokens") or 0)
        if total > limit:
            return f"{where}: ran {total} tokens past the {limit}-token limit without an error"
        return None

    def _verdict(self, ctx: CheckContext, limit: int, cases: list[dict[str, Any]]) -> Finding:
        problems = [x for x in (self._problem(r, limit, self.gate.allow_refusal_within_limit) for r in cases) if x]
        over = [r for r in cases if r.get("expected_fit") is False]
        metrics = {"context_tokens": float(limit), "cases": float(len(cases)), "problems": float(len(problems)),
                   "refused_over_limit": float(sum(r.get("outcome") == "refused" for r in over)),
                   "truncated_images_whole": float(sum(r.get("outcome") == "answered" for r in over))}  # fmt: skip
        evidence: dict[str, Any] = {"part": "boundary", "seed": ctx.seed, "cases": cases}
        gate = "over the limit: typed refusal or image tokens kept whole; within it: an answer with every image token"
        if not problems:
            return self.finding(
                ctx, Verdict.PASS,
                f"at the {limit}-token limit with {self.params.images} images: {int(metrics['refused_over_limit'])} "
                f"over-limit requests refused, {int(metrics['truncated_images_whole'])} truncated with images whole",
                metrics=metrics, gate=gate, evidence=evidence,
            )  # fmt: skip
        silent = any("image tokens" in x or "past the" in x for x in problems)
        return self.finding(
            ctx, Verdict.FAIL, "; ".join(problems)[:400],
            severity=Severity.HIGH if silent else Severity.MEDIUM, metrics=metrics, gate=gate, evidence=evidence,
            message="requests whose images fill the context are not handled safely at the limit",
            suggestion="count image tokens after expansion and refuse prompt + max_tokens over the model's length "
            "with a 400; if you truncate, cut text only and never inside an image's tokens",
        )  # fmt: skip
