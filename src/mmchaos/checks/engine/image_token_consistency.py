"""Step 4: every image becomes exactly its own image tokens, and mismatches are refused cleanly.

Expansion: one image A, one image B, both together, and no image, under the same question. The
image tokens the target reports (``GenerationResult.extra["image_tokens"]``, the processor's
expanded count) must add up: tokens(A + B) = tokens(A) + tokens(B), and no image gives none. A
target that drops or duplicates an image, or expands a placeholder for the wrong image, breaks the
sum. Where a backend reports no image-token count, the prompt token counts are used instead
(prompt(A + B) + prompt(none) = prompt(A) + prompt(B)). With transformers, a successful generate
also means the model consumed exactly the expanded tokens: it raises when features and
placeholders differ.

Mismatches: a user who types the image placeholder (more placeholders than images), the
placeholder with no image at all, and an image inside an assistant turn (which some chat templates
drop: more images than placeholders). Each must be a typed refusal before the model
(``TargetCallError`` with a code other than ``generate_failed``) or an answer whose image tokens
are exactly those of the images sent (the placeholder text treated as text); a crash inside the
model or a shifted count is a failure.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import Field

from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.checks.engine.generation_inputs import probe_images
from mmchaos.errors import TargetCallError
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability
from mmchaos.targets.generation import GenerationParams, GenerationResult, Message

__all__ = ["ImageTokenConsistency"]

#: Placeholders of the common families, tried when the target does not name its own.
_KNOWN_PLACEHOLDERS = ("<image>", "<|image_pad|>", "<|image|>", "<start_of_image>")


class ImageTokenConsistencyParams(Params):
    question: str = "Describe this."
    placeholder: str | None = Field(
        default=None, description="the model's image placeholder; default: the target's processor's image_token"
    )
    max_new_tokens: int = Field(default=2, ge=1, le=64)


class ImageTokenConsistencyGate(Gate):
    allow_model_crash: bool = Field(
        default=False, description="accept a mismatch that reaches the model and fails there (generate_failed)"
    )


def _placeholder(target: Any, given: str | None) -> str:
    if given:
        return given
    for holder in (target, getattr(target, "processor", None)):
        token = getattr(holder, "image_token", None)
        if isinstance(token, str) and token:
            return token
    return _KNOWN_PLACEHOLDERS[0]


class ImageTokenConsistency(Check[ImageTokenConsistencyParams, ImageTokenConsistencyGate]):
    """Image tokens add up per image; mismatched images and placeholders get a typed refusal."""

    name = "image_token_consistency"
    step = Step.ENGINE
    requires = (frozenset({Capability.GENERATE}),)

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        a, b = probe_images(ctx, 2)
        params = GenerationParams(max_new_tokens=self.params.max_new_tokens, logprobs=False)
        yield self._expansion(ctx, a, b, params)
        yield self._mismatches(ctx, a, b, params)

    def _expansion(self, ctx: CheckContext, a: Any, b: Any, params: GenerationParams) -> Finding:
        q = self.params.question
        results = {name: ctx.target.generate(q, imgs, params) for name, imgs in (("a", [a]), ("b", [b]))}
        evidence: dict[str, Any] = {"part": "expansion", "seed": ctx.seed}
        try:
            results["ab"] = ctx.target.generate(q, [a, b], params)
        except TargetCallError as exc:  # a model that takes one image per request refuses two, typed
            if exc.code == "generate_failed":
                raise
            evidence["two_images"] = {"refused": exc.code, "message": exc.message[:200]}
        try:
            results["none"] = ctx.target.generate(q, [], params)
        except TargetCallError as exc:  # a model that answers only with an image may refuse it, typed
            if exc.code == "generate_failed":
                raise
            evidence["no_image"] = {"refused": exc.code, "message": exc.message[:200]}
        if "ab" not in results:
            return self._one_image_expansion(ctx, results, evidence)
        counts = {k: r.extra.get("image_tokens") for k, r in results.items()}
        if "none" not in counts:
            counts["none"] = 0  # refused before the model: no image tokens reached it
        if all(isinstance(v, int) for v in counts.values()):
            c: dict[str, int] = {k: int(v) for k, v in counts.items() if isinstance(v, int)}
            basis, expected, got = "image tokens", c["a"] + c["b"], c["ab"]
            ok = got == expected and c["none"] == 0 and c["a"] > 0 and c["b"] > 0
        elif "none" in results and all(r.prompt_tokens is not None for r in results.values()):
            c = {k: int(r.prompt_tokens or 0) for k, r in results.items()}
            basis, expected, got = "prompt tokens", c["a"] + c["b"] - c["none"], c["ab"]
            ok = got == expected and c["a"] > c["none"] and c["b"] > c["none"]
        else:
            return self.finding(
                ctx, Verdict.SKIPPED, "expansion: the target reports neither image nor prompt token counts",
                evidence=evidence,
            )  # fmt: skip
        metrics = {f"{basis.split()[0]}_tokens_{k}": float(v) for k, v in c.items()}
        metrics["expected_two_images"] = float(expected)
        evidence["basis"] = basis
        gate = "tokens(A + B) = tokens(A) + tokens(B), no image no image tokens"
        if ok:
            return self.finding(
                ctx, Verdict.PASS,
                f"expansion: {basis} add up per image ({c['a']} + {c['b']} -> {got}"
                f"{' with ' + str(c['none']) + ' for no image' if basis == 'prompt tokens' else ''})",
                metrics=metrics, gate=gate, evidence=evidence,
            )  # fmt: skip
        return self.finding(
            ctx, Verdict.FAIL,
            f"expansion: two images gave {got} {basis}, one each gave {c['a']} and {c['b']} (expected {expected}): "
            "an image was dropped, duplicated or shifted",
            severity=Severity.HIGH, metrics=metrics, gate=gate, evidence=evidence,
            message="the image tokens the model sees do not match the images sent",
            suggestion="send every image to the processor with one placeholder each, and refuse (do not truncate) "
            "requests over the server's per-request image limit",
        )  # fmt: skip

    def _one_image_expansion(
        self, ctx: CheckContext, results: dict[str, GenerationResult], evidence: dict[str, Any]
    ) -> Finding:
        """Two images refused with a typed error (the model takes one a request): what is left to
        hold is that each image gives the same, non-zero count and no image gives none."""
        counts = {k: r.extra.get("image_tokens") for k, r in results.items()}
        if "none" not in counts:
            counts["none"] = 0
        if not all(isinstance(v, int) for v in counts.values()):
            counts = {k: r.prompt_tokens for k, r in results.items()} if "none" in results else {}
            basis = "prompt tokens"
        else:
            basis = "image tokens"
        refused = evidence["two_images"]["refused"]
        if not counts or not all(isinstance(v, int) for v in counts.values()):
            return self.finding(
                ctx, Verdict.SKIPPED,
                f"expansion: two images refused ({refused}) and the target reports no token counts to compare",
                evidence=evidence,
            )  # fmt: skip
        c = {k: int(v) for k, v in counts.items() if isinstance(v, int)}
        evidence["basis"] = basis
        metrics = {f"{basis.split()[0]}_tokens_{k}": float(v) for k, v in c.items()}
        gate = "one image per request: each image the same count, above no image; two images refused, typed"
        floor = c["none"] if basis == "prompt tokens" else 0
        if c["a"] == c["b"] > floor and (basis == "prompt tokens" or c["none"] == 0):
            return self.finding(
                ctx, Verdict.PASS,
                f"expansion: one image per request ({c['a']} {basis} each; two images refused with {refused})",
                metrics=metrics, gate=gate, evidence=evidence,
            )  # fmt: skip
        return self.finding(
            ctx, Verdict.FAIL,
            f"expansion: two images refused ({refused}), and one image gave {c['a']} or {c['b']} {basis} "
            f"({c['none']} with none): an image was dropped or shifted",
            severity=Severity.HIGH, metrics=metrics, gate=gate, evidence=evidence,
            message="the image tokens the model sees do not match the image sent",
        )  # fmt: skip

    def _mismatches(self, ctx: CheckContext, a: Any, b: Any, params: GenerationParams) -> Finding:
        ph = _placeholder(ctx.target, self.params.placeholder)
        q = self.params.question
        cases: list[tuple[str, str | Sequence[Message], list[Any], int]] = [
            ("extra_placeholder", f"Look at {ph} and {q}", [a], 1),
            ("placeholder_without_image", f"Look at {ph} and {q}", [], 0),
            ("image_in_assistant_turn",
             [Message("user", (a, q)), Message("assistant", (b, "Here it is.")), Message("user", "And now?")], [], 2),
        ]  # fmt: skip
        one = ctx.target.generate(q, [a], params).extra.get("image_tokens")
        other = ctx.target.generate(q, [b], params).extra.get("image_tokens")
        outcomes: dict[str, dict[str, Any]] = {}
        bad: list[str] = []
        for name, prompt, imgs, n_images in cases:
            try:
                result: GenerationResult = ctx.target.generate(prompt, imgs, params)
            except TargetCallError as exc:
                crash = exc.code == "generate_failed"
                outcomes[name] = {"outcome": "model_crash" if crash else "refused", "code": exc.code,
                                  "message": exc.message[:200]}  # fmt: skip
                if crash and not self.gate.allow_model_crash:
                    bad.append(f"{name}: crashed inside the model ({exc.message[:80]})")
                continue
            except Exception as exc:  # an untyped error is the crash this check looks for
                outcomes[name] = {"outcome": "untyped_error", "error": f"{type(exc).__name__}: {exc}"[:200]}
                bad.append(f"{name}: untyped {type(exc).__name__}")
                continue
            got = result.extra.get("image_tokens")
            want = None if not isinstance(one, int) or not isinstance(other, int) else [0, one, one + other][n_images]
            outcomes[name] = {"outcome": "answered", "image_tokens": got, "expected_image_tokens": want}
            if isinstance(got, int) and want is not None and got != want:
                bad.append(f"{name}: answered with {got} image tokens for images worth {want} (silent shift or drop)")
        metrics = {"cases": float(len(cases)), "bad_cases": float(len(bad)),
                   "refused": float(sum(o["outcome"] == "refused" for o in outcomes.values()))}  # fmt: skip
        evidence: dict[str, Any] = {"part": "mismatch", "placeholder": ph, "outcomes": outcomes}
        gate = "typed refusal before the model, or image tokens exactly those of the images sent"
        if not bad:
            return self.finding(
                ctx, Verdict.PASS,
                f"mismatch: {int(metrics['refused'])} of {len(cases)} mismatched requests refused with a typed error, "
                "the rest answered with exactly their images' tokens",
                metrics=metrics, gate=gate, evidence=evidence,
            )  # fmt: skip
        return self.finding(
            ctx, Verdict.FAIL, "mismatch: " + "; ".join(bad),
            severity=Severity.HIGH, metrics=metrics, gate=gate, evidence=evidence,
            message="mismatched images and placeholders are not refused cleanly",
            suggestion="count placeholders against images before the model runs and refuse a mismatch with a 400; "
            "escape placeholder strings typed by users",
        )  # fmt: skip
