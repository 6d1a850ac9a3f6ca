"""Step 4: greedy generation in fp16/bf16 against fp32: token agreement and the first NaN/Inf module.

The target's torch module is cast in place to each low precision (``cast_module`` from the
embedding precision check: the fp32 tensors are put back bit for bit) and the same greedy
requests are generated again. Reported per dtype: exact-match rate, token agreement (the agreed
prefix over the fp32 length, averaged over requests), the first divergent token, the largest
logprob deviation over the agreed prefix, and -- when a logprob is NaN/Inf -- the first module,
by qualified name, whose output stopped being finite (forward hooks during ``generate``).
A non-finite output fails whatever the agreement; a model that merely drifts in bf16 after a
few tokens is held to a looser agreement gate than fp16.

A near-tie flips on rounding noise in any precision (a tiny or untrained model is full of them),
so where the target exposes its inputs (``build_inputs``, the ``hf:`` VLM target), each divergence
is scored by the fp32 model itself: the log-probability gap, at the divergent step, between the
fp32 token and the low-precision one. A divergence inside ``min_confident_margin`` counts as
agreement (and is reported as explained by the margin); without ``build_inputs`` every divergence
counts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
from pydantic import Field

from mmchaos._lazy import require
from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.checks.engine.generation_inputs import first_divergence, probe_images
from mmchaos.checks.engine.precision import cast_module, first_nonfinite_module
from mmchaos.checks.logprobs import LogprobsTally
from mmchaos.errors import TargetCallError
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability
from mmchaos.targets.generation import Completion, GenerationParams, Message

__all__ = ["GenerationPrecision"]

log = logging.getLogger(__name__)

DType = Literal["float16", "bfloat16"]
_QUESTIONS = ("What is in this image?", "Describe the picture.", "What colour is the shape?")


class GenerationPrecisionParams(Params):
    dtypes: list[DType] = Field(default=["float16", "bfloat16"], min_length=1)
    requests: int = Field(default=3, ge=1, le=32)
    max_new_tokens: int = Field(default=8, ge=1, le=256)


class GenerationPrecisionGate(Gate):
    min_token_agreement: dict[str, float] = Field(
        default_factory=lambda: {"float16": 0.9, "bfloat16": 0.75},
        description="per dtype: mean agreed-prefix fraction of the fp32 greedy tokens",
    )
    min_confident_margin: float = Field(
        default=0.05,
        ge=0.0,
        description="fp32 log-probability gap (nats) between the two tokens at a divergence from which it counts",
    )


def _finite(c: Completion) -> bool:
    return c.logprobs is None or bool(np.isfinite(np.asarray(c.logprobs, dtype=np.float64)).all())


class GenerationPrecision(Check[GenerationPrecisionParams, GenerationPrecisionGate]):
    """fp32 vs fp16/bf16 greedy generation: token agreement, first divergence, first NaN/Inf module."""

    name = "generation_precision"
    step = Step.ENGINE
    requires = (frozenset({Capability.GENERATE, Capability.TORCH_MODULE}),)

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        torch = require("torch")
        module = ctx.target.torch_module()
        images = probe_images(ctx, p.requests)
        requests = [[Message("user", (img, _QUESTIONS[i % len(_QUESTIONS)]))] for i, img in enumerate(images)]
        params = GenerationParams(max_new_tokens=p.max_new_tokens, logprobs=True)
        reference = [ctx.target.generate(r, params=params).completions[0] for r in requests]
        for name in p.dtypes:
            with cast_module(module, getattr(torch, name)):
                try:
                    low = [ctx.target.generate(r, params=params).completions[0] for r in requests]
                except (TargetCallError, RuntimeError, NotImplementedError, TypeError) as exc:
                    yield self.finding(
                        ctx, Verdict.SKIPPED, f"{name}: generation not supported in this precision here",
                        message=f"{type(exc).__name__}: {exc}"[:500], evidence={"dtype": name},
                    )  # fmt: skip
                    continue
                origin = None
                bad = [i for i, c in enumerate(low) if not _finite(c)]
                if bad:

                    def call(request: list[Message] = requests[bad[0]]) -> Any:
                        return ctx.target.generate(request, params=params)

                    origin = first_nonfinite_module(module, call)
            margins = [self._margin(ctx, r, a, b) for r, a, b in zip(requests, reference, low, strict=True)]
            yield self._compare(ctx, name, reference, low, bad, origin, margins)

    @staticmethod
    def _margin(ctx: CheckContext, request: list[Message], a: Completion, b: Completion) -> float | None:
        """fp32 log-probability of ``a``'s token minus ``b``'s at their first divergence (None: unknown)."""
        build = getattr(ctx.target, "build_inputs", None)
        if build is None or a.token_ids is None or b.token_ids is None:
            return None
        where = first_divergence(a.token_ids, b.token_ids)
        if where is None or where >= len(a.token_ids) or where >= len(b.token_ids):
            return None
        torch = require("torch")
        inputs = dict(build(request))
        ids = inputs["input_ids"]
        prefix = torch.tensor([a.token_ids[:where]], dtype=ids.dtype, device=ids.device)
        for key, value in list(inputs.items()):
            if hasattr(value, "shape") and tuple(value.shape) == tuple(ids.shape):  # per-token tensors grow too
                fill = prefix if key == "input_ids" else torch.full_like(prefix, 1 if key == "attention_mask" else 0)
                inputs[key] = torch.cat([value, fill.to(value.dtype)], dim=1)
        try:
            with torch.inference_mode():
                logits = ctx.target.torch_module()(**inputs).logits[0, -1].float().log_softmax(-1)
        except Exception:  # a family whose forward wants more than the processor gave: no margin
            log.debug("no fp32 margin for this request", exc_info=True)
            return None
        return float(logits[a.token_ids[where]] - logits[b.token_ids[where]])

    def _compare(
        self,
        ctx: CheckContext,
        name: str,
        ref: list[Completion],
        low: list[Completion],
        bad: list[int],
        origin: Any,
        margins: list[float | None],
    ) -> Finding:
        agreements, raw, divergences, deviations, explained = [], [], [], [], 0
        for a, b, margin in zip(ref, low, margins, strict=True):
            ta = a.token_ids if a.token_ids is not None else tuple(a.text)
            tb = b.token_ids if b.token_ids is not None else tuple(b.text)
            where = first_divergence(ta, tb)
            agreed = len(ta) if where is None else where
            raw.append(agreed / max(len(ta), 1))
            near_tie = margin is not None and abs(margin) < self.gate.min_confident_margin and _finite(b)
            explained += near_tie
            agreements.append(1.0 if near_tie else raw[-1])
            divergences.append(where)
            if a.logprobs is not None and b.logprobs is not None and agreed:
                dev = np.abs(np.asarray(a.logprobs[:agreed]) - np.asarray(b.logprobs[:agreed]))
                deviations.append(float(np.nanmax(np.where(np.isfinite(dev), dev, np.inf))))
        agreement = float(np.mean(agreements))
        logprobs = LogprobsTally()
        logprobs.add(*ref, *low)
        first = min((d for d in divergences if d is not None), default=None)
        metrics = {"token_agreement": agreement, "token_agreement_raw": float(np.mean(raw)),
                   "divergences_within_margin": float(explained),
                   "exact_match_rate": float(np.mean([d is None for d in divergences])),
                   "first_divergent_token": float(first) if first is not None else -1.0,
                   "nonfinite_requests": float(len(bad))}  # fmt: skip
        if logprobs.measured:
            metrics["max_logprob_deviation"] = max(deviations, default=0.0)
        evidence: dict[str, Any] = {"dtype": name, "seed": ctx.seed, "first_divergence_per_request": divergences,
                                    "fp32_margin_at_divergence": margins, "logprobs": logprobs.evidence(ctx.target),
                                    "fp32": [c.text[:60] for c in ref], "low": [c.text[:60] for c in low]}  # fmt: skip
        lp = (
            f"max logprob deviation {metrics['max_logprob_deviation']:.2g}"
            if logprobs.measured
            else f"{logprobs.clause()}: neither finiteness nor deviation of logprobs was measured"
        )
        need = self.gate.min_token_agreement.get(name, 0.75)
        gate = (
            f"finite logprobs, token agreement >= {need:g} (divergences within an fp32 margin of "
            f"{self.gate.min_confident_margin:g} nats count as agreement)"
        )
        failures = []
        if bad:
            source = "no single module localised"
            if origin is not None:
                source = f"first produced by module '{origin.module}' ({origin.module_type}, input max |x| " \
                        f"{origin.input_max_abs:.4g})"  # fmt: skip
                evidence["nonfinite_origin"] = {"module": origin.module, "module_type": origin.module_type,
                                                "input_max_abs": origin.input_max_abs, "request": bad[0]}  # fmt: skip
            failures.append(f"NaN/Inf logprobs in {len(bad)} of {len(low)} requests, {source}")
        if agreement < need:
            failures.append(f"token agreement {agreement:.3f} < {need:g} (first divergence at token {first})")
        if not failures:
            return self.finding(
                ctx, Verdict.PASS,
                f"{name}: greedy tokens agree {agreement:.3f} with fp32 ({metrics['exact_match_rate']:.0%} exact; "
                f"{lp}"
                + (f"; {explained} divergence(s) at fp32 near-ties" if explained else "")
                + ")",
                metrics=metrics, gate=gate, evidence=evidence,
            )  # fmt: skip
        return self.finding(
            ctx, Verdict.FAIL, f"{name}: " + "; ".join(failures),
            severity=Severity.HIGH if bad else Severity.MEDIUM, metrics=metrics, gate=gate, evidence=evidence,
            message="; ".join(failures),
            suggestion="keep the named module (or the model) in fp32, rescale or clamp its activations, or serve "
            "in bf16 (fp32 range) instead of fp16",
        )  # fmt: skip
