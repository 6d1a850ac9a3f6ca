"""Step 5: the deployment must answer like the checkpoint it claims to serve (``validate --reference``).

The same inputs (the same images, the same texts, the same prompts) go to the deployment and to
the reference, and what both can do is compared: image and text embeddings (cosine), the task
metric on labelled data, greedy answers token for token (judged as vLLM's own tests judge their
engine against transformers, ``check_logprobs_close``: equal tokens, or at the first divergence
each side's token inside the other's top-k logprobs), prompt token counts and how answers end.

A step-5 check, not step 4: step 4 holds one engine to its own invariances; this one holds a
deployment to another artefact (as ``fingerprint_match`` holds it to its files): the versions
question, "is what runs the model that was validated".

Where they part and the inputs are images, the reference is fed what the usual pipeline bugs feed
a model (channel-swapped images; images re-normalised with another common mean/std): a deployment
that agrees with one of those far better than with the reference fed the originals names its bug.
For generation, how answers end points at stop/EOS tokens; prompt token counts at the chat template
(a text-only prompt counted differently) or the image token count (only prompts with images
differ); the same prompts sent as one batch (``generate_batch``: an ``hf:`` deployment pads them as
its tokenizer was saved, a server batches them itself) at padding, when they agree alone and part
batched. Precision drift (fp16 vs fp32) is small: within the tolerances it passes, with the
chosen-token logprob deviation reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from pydantic import Field

from mmchaos import tasks
from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.checks.logprobs import LogprobsTally
from mmchaos.data.base import Dataset
from mmchaos.errors import MMChaosError
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import GenerationParams, GenerationResult, Message
from mmchaos.targets.wrappers import unwrap
from mmchaos.tasks.parity import (
    ImageVariant,
    TokenComparison,
    compare_tokens,
    cosines,
    image_variants,
    logprob_deviations,
)

__all__ = ["ReferenceParity"]

ImageArray = Any
Triple = tuple[float, float, float]


class ReferenceParityParams(Params):
    samples: int = Field(16, ge=1, description="inputs sent to both (images, texts, prompts)")
    generate_samples: int = Field(8, ge=1, description="prompts answered greedily by both")
    max_new_tokens: int = Field(16, ge=1, description="greedy tokens compared per prompt")
    top_logprobs: int = Field(5, ge=0, le=20, description="top-k logprobs asked for (vLLM's check_logprobs_close)")


class ReferenceParityGate(Gate):
    min_cosine: float = Field(
        0.99, ge=-1.0, le=1.0, description="mean embedding cosine, deployment vs reference (fp16 vs fp32: ~0.9999)"
    )
    max_score_drop: float = Field(0.05, ge=0.0, description="reference task quality minus the deployment's")
    min_greedy_match: float = Field(
        0.9, ge=0.0, le=1.0, description="share of prompts whose greedy answers agree (check_logprobs_close)"
    )
    max_prompt_token_diff: int = Field(0, ge=0, description="prompt tokens (image tokens included) may differ by")
    max_logprob_deviation: float = Field(
        0.5, ge=0.0, description="mean |chosen-token logprob difference| over the tokens both chose (fp16: 1e-5)"
    )


def _normalisation(target: Target) -> tuple[Triple, Triple] | None:
    """The reference's own image mean/std, where its image processor says."""
    inner = unwrap(target)
    proc = getattr(inner, "image_processor", None)
    proc = proc or getattr(getattr(inner, "processor", None), "image_processor", None)
    mean, std = getattr(proc, "image_mean", None), getattr(proc, "image_std", None)
    if mean is None or std is None or len(mean) != 3 or len(std) != 3:
        return None
    return (tuple(float(v) for v in mean), tuple(float(v) for v in std))  # type: ignore[return-value]


def _mean(values: Sequence[float] | np.ndarray) -> float:
    arr = np.asarray(values, dtype=np.float64)
    return float(np.nanmean(arr)) if arr.size and not np.all(np.isnan(arr)) else float("nan")


def _first_divergence(
    data: Dataset, rows: Sequence[TokenComparison], mine: Sequence[GenerationResult], theirs: Sequence[GenerationResult]
) -> tuple[int, dict[str, Any]] | None:
    """The first prompt whose greedy answers part (neither equal nor close), as evidence, with its index.

    One place for the generation and the batched-generation comparisons, so both name a
    divergence the same way (the caller adds what only it knows, e.g. the finish reasons).
    """
    first = next((i for i, r in enumerate(rows) if not (r.equal or r.close)), None)
    if first is None:
        return None
    return first, {
        "sample": data[first].id,
        "token_index": rows[first].first_divergence,
        "deployment": mine[first].text,
        "reference": theirs[first].text,
    }


class ReferenceParity(Check[ReferenceParityParams, ReferenceParityGate]):
    """Deployment vs the checkpoint it serves (--reference): embeddings, task score, greedy tokens, why they part."""

    name = "reference_parity"
    step = Step.INTEGRATION
    requires = (
        frozenset({Capability.EMBED_IMAGE}),
        frozenset({Capability.EMBED_TEXT}),
        frozenset({Capability.GENERATE}),
    )

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        ref = ctx.reference
        if ref is None:
            yield self.finding(
                ctx, Verdict.SKIPPED, "no --reference given: nothing to judge the deployment against",
                suggestion="mmchaos validate --target DEPLOYMENT --reference hf:/path/to/checkpoint",
            )  # fmt: skip
            return
        shared = {c for c in (Capability.EMBED_IMAGE, Capability.EMBED_TEXT, Capability.GENERATE) if ref.has(c)}
        shared &= set(ctx.target.capabilities)
        if not shared:
            yield self.finding(
                ctx, Verdict.FAIL, f"the reference {ref.uri} shares no capability with the deployment",
                severity=Severity.HIGH,
                message=f"deployment: {sorted(ctx.target.capabilities)}; reference: {sorted(ref.capabilities)}",
            )  # fmt: skip
            return
        data = ctx.dataset.sample(self.params.samples, ctx.seed)
        variants = image_variants(_normalisation(ref))
        if Capability.EMBED_IMAGE in shared and data.has_images:
            images = list(data.images())
            yield self._embeddings(ctx, ref, "image", images, ctx.target.embed_images, ref.embed_images, variants)
        if Capability.EMBED_TEXT in shared:
            texts = [s.caption or s.label or s.question or s.id for s in data]
            yield self._embeddings(ctx, ref, "text", texts, ctx.target.embed_texts, ref.embed_texts, [])
        named: tuple[str, str] | None = None  # a cause the generation findings named, for the task score
        if Capability.GENERATE in shared and data.has_questions:
            asked = ctx.dataset.sample(self.params.generate_samples, ctx.seed)
            theirs = self._answers(ref, asked)
            alone = self._generation(ctx, ref, asked, variants, theirs)
            batched = self._batched(ctx, ref, asked, alone, theirs)
            yield alone
            yield batched
            for f in (alone, batched):
                causes = f.evidence.get("causes") or ([f.evidence["cause"]] if "cause" in f.evidence else [])
                if named is None and causes:
                    named = (str(causes[0]), f.suggestion or "")
        score = self._task_score(ctx, ref, data, variants, named)
        if score is not None:
            yield score

    # -- embeddings -----------------------------------------------------------------------------------

    def _embeddings(
        self,
        ctx: CheckContext,
        ref: Target,
        what: str,
        inputs: Sequence[Any],
        deployed: Callable[[Any], Any],
        reference: Callable[[Any], Any],
        variants: Sequence[ImageVariant],
    ) -> Finding:
        mine = np.asarray(deployed(inputs))
        cos = cosines(mine, reference(inputs))
        mean = _mean(cos)
        metrics: dict[str, float] = {"mean_cosine": mean, "min_cosine": float(np.nanmin(cos)) if len(cos) else mean}
        evidence: dict[str, Any] = {"reference": ref.uri, "per_sample_cosine": [round(float(c), 6) for c in cos]}
        ok = mean >= self.gate.min_cosine
        cause = None if ok else self._cause(mine, inputs, reference, variants, mean, metrics)
        if ok:
            return self.finding(
                ctx, Verdict.PASS, f"{what} embeddings match the reference (mean cosine {mean:.6f})",
                metrics=metrics, evidence=evidence,
                message=f"{len(cos)} {what}s; lowest cosine {metrics['min_cosine']:.6f} (gate {self.gate.min_cosine})",
            )  # fmt: skip
        title = f"{what} embeddings part from the reference (mean cosine {mean:.4f} < {self.gate.min_cosine})"
        if cause is not None:
            title += f": {cause.name}"
            evidence["cause"] = cause.name
        return self.finding(
            ctx, Verdict.FAIL, title, severity=Severity.HIGH, metrics=metrics, evidence=evidence,
            message=f"{len(cos)} {what}s sent to both {ctx.target.uri} and {ref.uri}"
            + (f"; the deployment agrees with the reference fed {cause.name}" if cause else
               "; no channel-order or normalisation variant explains it (weights, resize, precision?)"),
            suggestion=cause.fix if cause else "diff the preprocessing and weights with the checkpoint's",
        )  # fmt: skip

    def _cause(
        self,
        mine: np.ndarray,
        images: Sequence[Any],
        reference: Callable[[Any], Any],
        variants: Sequence[ImageVariant],
        base: float,
        metrics: dict[str, float],
    ) -> ImageVariant | None:
        """The candidate bug whose images make the reference agree with the deployment (far better
        than the originals do, and within the gate)."""
        best: tuple[float, ImageVariant] | None = None
        for v in variants:
            agree = _mean(cosines(mine, reference(v.transform(images))))
            metrics[f"cosine_if:{v.name}"] = agree
            if best is None or agree > best[0]:
                best = (agree, v)
        if best is not None and best[0] >= self.gate.min_cosine and best[0] > base:
            return best[1]
        return None

    # -- the task metric ---------------------------------------------------------------------------------

    def _task_score(
        self,
        ctx: CheckContext,
        ref: Target,
        data: Dataset,
        variants: Sequence[ImageVariant],
        named: tuple[str, str] | None = None,
    ) -> Finding | None:
        """The task metric on both; a drop past the gate names the cause the generation findings
        named (``named``: name, fix), else the image variant the reference scores like this with."""
        name = tasks.default_task("image", ref, data)
        if name is None or not tasks.REGISTRY.get(name).supports(ctx.target, data):
            return None
        task = tasks.REGISTRY.get(name)()
        task.setup(ref, data)
        theirs = task.evaluate(ref, data)
        task.setup(ctx.target, data)
        mine = task.evaluate(ctx.target, data)
        drop = task.quality(theirs.metric) - task.quality(mine.metric)
        metrics = {"deployment": mine.metric, "reference": theirs.metric, "quality_drop": drop}
        label = f"{task.metric_name or name} {mine.metric:.3f} vs the reference's {theirs.metric:.3f}"
        if drop <= self.gate.max_score_drop:
            return self.finding(ctx, Verdict.PASS, f"{name}: {label}", metrics=metrics, evidence={"task": name})
        cause = named
        if data.has_images and cause is None:
            for v in variants:  # the reference scored on a broken pipeline's images: which one scores like this?
                fed = task.evaluate(ref, data, images=v.transform(list(data.images())))
                metrics[f"reference_if:{v.name}"] = fed.metric
                if abs(task.quality(fed.metric) - task.quality(mine.metric)) <= self.gate.max_score_drop:
                    cause = (v.name, v.fix)
                    break
        return self.finding(
            ctx, Verdict.FAIL, f"{name}: {label}" + (f" ({cause[0]})" if cause else ""), severity=Severity.HIGH,
            metrics=metrics, evidence={"task": name, **({"cause": cause[0]} if cause else {})},
            message=f"{len(data)} labelled samples; the deployment loses {drop:.3f} of the reference's quality "
            f"(gate {self.gate.max_score_drop})",
            suggestion=cause[1] if cause else "find where the deployment's pipeline departs from the checkpoint's",
        )  # fmt: skip

    # -- generation --------------------------------------------------------------------------------------

    def _params(self) -> GenerationParams:
        return GenerationParams(max_new_tokens=self.params.max_new_tokens, top_logprobs=self.params.top_logprobs)

    def _answers(self, target: Target, data: Dataset, images: Sequence[Any] | None = None) -> list[GenerationResult]:
        imgs = images if images is not None else (list(data.images()) if data.has_images else [None] * len(data))
        out = []
        for sample, img in zip(data, imgs, strict=True):
            out.append(target.generate(sample.question or "", () if img is None else (img,), self._params()))
        return out

    def _generation(
        self,
        ctx: CheckContext,
        ref: Target,
        data: Dataset,
        variants: Sequence[ImageVariant],
        theirs: list[GenerationResult],
    ) -> Finding:
        mine = self._answers(ctx.target, data)
        rows = [compare_tokens(a.completions[0], b.completions[0]) for a, b in zip(mine, theirs, strict=True)]
        matched = [r.equal or r.close is True for r in rows]
        share = float(np.mean(matched)) if rows else 1.0
        deviations = [d for a, b in zip(mine, theirs, strict=True) for d in logprob_deviations(a, b)]
        prompt_diffs = [
            abs(a.prompt_tokens - b.prompt_tokens)
            for a, b in zip(mine, theirs, strict=True)
            if a.prompt_tokens is not None and b.prompt_tokens is not None
        ]
        ends = [(a.finish_reason, b.finish_reason) for a, b in zip(mine, theirs, strict=True)]
        metrics: dict[str, float] = {
            "greedy_match": share,
            "exact_match": float(np.mean([r.equal for r in rows])) if rows else 1.0,
            "token_agreement": float(np.mean([r.agreement for r in rows])) if rows else 1.0,
            "max_prompt_token_diff": float(max(prompt_diffs, default=0)),
            "deployment_length_share": float(np.mean([a == "length" for a, _ in ends])) if ends else 0.0,
            "reference_length_share": float(np.mean([b == "length" for _, b in ends])) if ends else 0.0,
        }
        if deviations:
            metrics.update(mean_logprob_deviation=float(np.mean(deviations)),
                           max_logprob_deviation=float(np.max(deviations)))  # fmt: skip
        logprobs = LogprobsTally()
        logprobs.add(*(a.completions[0] for a in mine))
        evidence: dict[str, Any] = {"reference": ref.uri, "logprobs": logprobs.evidence(ctx.target)}
        if (div := _first_divergence(data, rows, mine, theirs)) is not None:
            first, evidence["first_divergence"] = div
            evidence["first_divergence"]["finish"] = {"deployment": ends[first][0], "reference": ends[first][1]}
        causes = self._generation_causes(metrics, ends)
        prompt_bad = metrics["max_prompt_token_diff"] > self.gate.max_prompt_token_diff
        if prompt_bad:
            causes.append(self._prompt_cause(ctx.target, ref, data, evidence))
        drift = metrics.get("mean_logprob_deviation", 0.0)
        drift_bad = drift > self.gate.max_logprob_deviation
        deviation = (
            f"; chosen-token logprobs differ by {drift:.2g} on average (max {metrics['max_logprob_deviation']:.2g})"
            if deviations
            else "; no logprobs on both sides to compare"
        )
        if share >= self.gate.min_greedy_match and not prompt_bad and not drift_bad:
            return self.finding(
                ctx, Verdict.PASS,
                f"greedy answers agree with the reference on {share:.0%} of {len(rows)} prompts{deviation}",
                metrics=metrics, evidence=evidence,
                message=f"exact token match {metrics['exact_match']:.0%}; "
                + (
                    "the rest near-ties (check_logprobs_close)"
                    if logprobs.measured
                    else f"{logprobs.clause()}, so near-ties were not judged (check_logprobs_close needs them)"
                ),
            )  # fmt: skip
        if share < self.gate.min_greedy_match and data.has_images and not causes:
            cause = self._image_cause(ref, data, mine, variants, share, metrics)
            if cause is not None:
                causes.append((cause.name, cause.fix))
        if drift_bad and not causes:
            causes.append(("chosen-token logprobs drift past the tolerance (precision, quantisation or weights)",
                           "compare the served dtype and quantisation with the checkpoint's"))  # fmt: skip
        title = f"greedy answers agree with the reference on {share:.0%} of {len(rows)} prompts"
        if drift_bad:
            title += f"; chosen-token logprobs differ by {drift:.2g} on average"
        if prompt_bad:
            title += f"; prompt token counts differ by up to {int(metrics['max_prompt_token_diff'])}"
        if causes:
            title += f": {causes[0][0]}"
            evidence["causes"] = [c for c, _ in causes]
        return self.finding(
            ctx, Verdict.FAIL, title, severity=Severity.HIGH, metrics=metrics, evidence=evidence,
            message=f"gate: {self.gate.min_greedy_match:.0%} agreeing, prompt tokens within "
            f"{self.gate.max_prompt_token_diff}",
            suggestion="; ".join(f for _, f in causes) or "diff the served chat template, tokenizer and generation "
            "config against the checkpoint's",
        )  # fmt: skip

    def _generation_causes(self, metrics: dict[str, float], ends: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        causes = []
        run_on = sum(1 for a, b in ends if a == "length" and b == "stop")
        if ends and run_on >= max(1, len(ends) // 2):
            causes.append(
                (
                    "stop/EOS tokens differ (the deployment runs on where the reference stops)",
                    "serve the checkpoint's generation_config.json eos_token_id (and the tokenizer's EOS)",
                )
            )
        return causes

    def _prompt_cause(self, target: Target, ref: Target, data: Dataset, evidence: dict[str, Any]) -> tuple[str, str]:
        """Which side of the prompt is counted differently: one text-only request to both tells the
        chat template (its tokens differ) from the image token count (only image prompts differ)."""
        question = next((s.question for s in data if s.question), "What is shown?")
        params = GenerationParams(max_new_tokens=1, logprobs=False)
        try:
            counts = (
                target.generate(question, (), params).prompt_tokens,
                ref.generate(question, (), params).prompt_tokens,
            )
        except MMChaosError:  # a model that answers only with an image: the text side cannot be told apart
            counts = (None, None)
        evidence["text_only_prompt_tokens"] = {"deployment": counts[0], "reference": counts[1]}
        if counts[0] is not None and counts[1] is not None and counts[0] != counts[1]:
            return (
                f"the chat template differs (a text-only prompt is {counts[0]} tokens served, {counts[1]} in the "
                "reference)",
                "serve the checkpoint's chat template (no --chat-template override, or the checkpoint's own file)",
            )
        if counts[0] is not None and counts[0] == counts[1]:
            return (
                "the image token count differs (text-only prompts agree; prompts with images do not)",
                "serve the checkpoint's processor config (image size, patch size, image tokens per image) unchanged",
            )
        return (
            "the prompt is tokenised differently (chat template or image token count)",
            "serve the checkpoint's chat template and processor (image tokens per image) unchanged",
        )

    def _batched(
        self, ctx: CheckContext, ref: Target, data: Dataset, alone: Finding, theirs: list[GenerationResult]
    ) -> Finding:
        """The same prompts as one batch to the deployment, against the reference's answers alone:
        a deployment that agrees alone and parts batched pads (or masks) its batches wrongly."""
        imgs = list(data.images()) if data.has_images else [None] * len(data)
        requests: list[str | list[Message]] = [
            (s.question or "") if img is None else [Message("user", (img, s.question or ""))]
            for s, img in zip(data, imgs, strict=True)
        ]
        mine = ctx.target.generate_batch(requests, self._params())
        rows = [compare_tokens(a.completions[0], b.completions[0]) for a, b in zip(mine, theirs, strict=True)]
        share = float(np.mean([r.equal or r.close is True for r in rows])) if rows else 1.0
        alone_share = alone.metrics.get("greedy_match", 1.0)
        side = getattr(unwrap(ctx.target), "padding_side", None)
        metrics = {"batched_greedy_match": share, "alone_greedy_match": alone_share, "batch_size": float(len(rows))}
        evidence: dict[str, Any] = {"reference": ref.uri, "padding_side": side}
        if (div := _first_divergence(data, rows, mine, theirs)) is not None:
            evidence["first_divergence"] = div[1]
        title = f"batched greedy answers agree with the reference on {share:.0%} of {len(rows)} prompts"
        if share >= self.gate.min_greedy_match or alone_share < self.gate.min_greedy_match:
            note = "" if share >= self.gate.min_greedy_match else " (they part alone too: see the finding above)"
            verdict = Verdict.PASS if share >= self.gate.min_greedy_match else Verdict.FAIL
            return self.finding(ctx, verdict, title + note, metrics=metrics, evidence=evidence,
                                severity=Severity.HIGH if verdict is Verdict.FAIL else Severity.INFO)  # fmt: skip
        if side == "right":
            cause = "right padding (the deployment pads batches on the right; decoder-only generation needs left)"
            fix = "save the tokenizer with padding_side 'left' (or pad left where the batch is built)"
        else:
            cause = "batching changes the answers (padding side or the padded rows' attention mask and positions)"
            fix = "pad decoder-only batches on the left and pass the attention mask and position ids of padded rows"
        evidence["cause"] = cause
        return self.finding(
            ctx, Verdict.FAIL, f"{title}: {cause}", severity=Severity.HIGH, metrics=metrics, evidence=evidence,
            message=f"alone the deployment agrees on {alone_share:.0%}; batched, on {share:.0%} "
            f"(gate {self.gate.min_greedy_match:.0%})",
            suggestion=fix,
        )  # fmt: skip

    def _image_cause(
        self,
        ref: Target,
        data: Dataset,
        mine: list[GenerationResult],
        variants: Sequence[ImageVariant],
        share: float,
        metrics: dict[str, float],
    ) -> ImageVariant | None:
        for v in variants:
            fed = self._answers(ref, data, v.transform(list(data.images())))
            same = [compare_tokens(a.completions[0], b.completions[0]).equal for a, b in zip(mine, fed, strict=True)]
            agree = float(np.mean(same))
            metrics[f"greedy_match_if:{v.name}"] = agree
            if agree >= self.gate.min_greedy_match and agree > share:
                return v
        return None
