"""Step 4: greedy generation gives a request the same tokens alone and inside any batch.

Each probe request (an image and a question) is answered alone, then ``runs`` times inside a batch
with neighbours of other prompt lengths and image counts (no image, one, two), at a different
position and with different neighbours each run. The neighbours' images come in mixed sizes and
aspect ratios (:data:`NEIGHBOUR_SIZES`): a dynamic-resolution model (the Qwen2-VL family) gives
each a different number of visual tokens, so the batch's rows differ in length and a padding mask
or broadcast bug shows, which a batch of equal images hides. Greedy decoding has one right answer, so every
run must give the alone tokens exactly. Reported per probe: whether the tokens match, the first
divergent position, and the number of distinct completions over the runs (the measure public work
on nondeterministic LLM inference uses); the largest logprob deviation is reported for information.
Typical causes of a failure: right padding, pad tokens that leak into attention or positions (or
into a pooled visual feature), and kernels whose reduction order depends on the batch shape.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import Field

from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.checks.engine.generation_inputs import first_divergence, probe_images
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability
from mmchaos.targets.generation import Completion, GenerationParams, Message

__all__ = ["NEIGHBOUR_SIZES", "GenerationBatchInvariance"]

NEIGHBOUR_SIZES: tuple[tuple[int, int], ...] = ((30, 30), (60, 120), (120, 60), (90, 150), (170, 85), (100, 100))
"""(height, width) of the neighbours' images, in turn: square, wide, tall, small and large; not all
multiples of a patch, so a processor's own rounding is exercised too."""

_QUESTIONS = ("What is in this image?", "Describe the colours and shapes you can see in the picture, briefly.")
_NEIGHBOURS = (
    "Hi.",
    "Write one short sentence about the sea, please, and keep it under ten words.",
    "Compare the two pictures.",
    "What is shown here?",
)


class GenerationBatchInvarianceParams(Params):
    probes: int = Field(default=2, ge=1, le=16, description="probe requests (image + question)")
    runs: int = Field(default=3, ge=1, le=32, description="batches each probe is answered in")
    batch_size: int = Field(default=4, ge=2, le=64)
    max_new_tokens: int = Field(default=8, ge=1, le=256)


class GenerationBatchInvarianceGate(Gate):
    max_mismatched_probes: int = Field(default=0, ge=0, description="probes whose batched tokens differ from alone")
    max_distinct_completions: int = Field(
        default=1, ge=1, description="distinct greedy completions of one probe over alone + every run"
    )


def _lp_deviation(a: Completion, b: Completion) -> float:
    if a.logprobs is None or b.logprobs is None:
        return float("nan")
    n = min(len(a.logprobs), len(b.logprobs))
    if n == 0:
        return 0.0
    return float(np.max(np.abs(np.asarray(a.logprobs[:n]) - np.asarray(b.logprobs[:n]))))


def _resized(image: npt.NDArray[np.uint8], size: tuple[int, int]) -> npt.NDArray[np.uint8]:
    from PIL import Image

    height, width = size
    return np.asarray(
        Image.fromarray(np.ascontiguousarray(image[..., :3])).resize((width, height), Image.Resampling.BILINEAR)
    )


def _tokens(c: Completion) -> Sequence[Any]:
    return c.token_ids if c.token_ids is not None else c.text


class GenerationBatchInvariance(Check[GenerationBatchInvarianceParams, GenerationBatchInvarianceGate]):
    """Greedy tokens of a request alone equal its tokens inside heterogeneous batches."""

    name = "generation_batch_invariance"
    step = Step.ENGINE
    requires = (frozenset({Capability.GENERATE}),)

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p, g = self.params, self.gate
        images = probe_images(ctx, p.probes + 3)
        rng = ctx.rng("batches")
        params = GenerationParams(max_new_tokens=p.max_new_tokens, logprobs=True)
        probes = [[Message("user", (images[i], _QUESTIONS[i % len(_QUESTIONS)]))] for i in range(p.probes)]
        spare = images[p.probes :]

        def sizes_of(k: int) -> list[tuple[int, int]]:
            return [NEIGHBOUR_SIZES[(k + j) % len(NEIGHBOUR_SIZES)] for j in range(k % 3)]  # 0, 1 or 2 images

        def neighbour(k: int) -> str | list[Message]:
            text = _NEIGHBOURS[k % len(_NEIGHBOURS)]
            if k % 3 == 0:
                return text
            pictures = [_resized(spare[(k + j) % len(spare)], size) for j, size in enumerate(sizes_of(k))]
            return [Message("user", (*pictures, text))]

        per_probe: list[dict[str, Any]] = []
        for i, probe in enumerate(probes):
            alone = ctx.target.generate(probe, params=params).completions[0]
            seen = {tuple(_tokens(alone))}
            mismatches: list[dict[str, Any]] = []
            lp_dev: float | None = None  # None: the target gave no logprobs to compare
            for run in range(p.runs):
                picks = rng.permutation(64)[: p.batch_size - 1]
                batch: list[str | list[Message]] = [neighbour(int(k)) for k in picks]
                position = (i + run) % p.batch_size
                batch.insert(position, probe)
                got = ctx.target.generate_batch(batch, params)[position].completions[0]
                seen.add(tuple(_tokens(got)))
                dev = _lp_deviation(alone, got)
                lp_dev = max(lp_dev or 0.0, dev) if np.isfinite(dev) else lp_dev
                where = first_divergence(_tokens(alone), _tokens(got))
                if where is not None:
                    mismatches.append({"run": run, "position_in_batch": position, "first_divergence": where,
                                       "alone": alone.text[:60], "batched": got.text[:60],
                                       "neighbour_images": [k % 3 for k in picks.tolist()],
                                       "neighbour_sizes": [list(z) for k in picks.tolist()
                                                           for z in sizes_of(k)]})  # fmt: skip
            per_probe.append({"probe": i, "distinct_completions": len(seen), "mismatched_runs": len(mismatches),
                              "max_logprob_deviation": lp_dev, "mismatches": mismatches[:3]})  # fmt: skip
        bad = [r for r in per_probe if r["mismatched_runs"]]
        distinct = max(r["distinct_completions"] for r in per_probe)
        divergences = [m["first_divergence"] for r in bad for m in r["mismatches"]]
        metrics = {"probes": float(len(probes)), "runs": float(p.runs), "mismatched_probes": float(len(bad)),
                   "max_distinct_completions": float(distinct),
                   "earliest_divergence": float(min(divergences)) if divergences else -1.0}  # fmt: skip
        deviations = [r["max_logprob_deviation"] for r in per_probe if r["max_logprob_deviation"] is not None]
        if deviations:  # a deviation only where one was measured, never a 0 for logprobs nobody sent
            metrics["max_logprob_deviation"] = max(deviations)
        logprob_text = (f"max logprob deviation {metrics['max_logprob_deviation']:.2g}" if deviations
                        else "no logprobs from the target: tokens compared as text")  # fmt: skip
        evidence: dict[str, Any] = {"seed": ctx.seed, "batch_size": p.batch_size, "probes": per_probe,
                                    "neighbour_sizes": [list(z) for z in NEIGHBOUR_SIZES]}  # fmt: skip
        gate = (
            f"mismatched probes <= {g.max_mismatched_probes}, distinct completions per probe <= "
            f"{g.max_distinct_completions}"
        )
        if len(bad) <= g.max_mismatched_probes and distinct <= g.max_distinct_completions:
            yield self.finding(
                ctx, Verdict.PASS,
                f"greedy tokens identical alone and in {p.runs} heterogeneous batches of {p.batch_size} "
                f"({len(probes)} probes; {logprob_text})",
                metrics=metrics, gate=gate, evidence=evidence,
            )  # fmt: skip
            return
        yield self.finding(
            ctx, Verdict.FAIL,
            f"batching changes greedy output: {len(bad)} of {len(probes)} probes differ from alone (first divergence "
            f"at token {int(metrics['earliest_divergence'])}; up to {distinct} distinct completions over "
            f"{p.runs + 1} runs)",
            severity=Severity.HIGH, metrics=metrics, gate=gate, evidence=evidence,
            message="a request's answer depends on what it is batched with",
            suggestion="pad on the left for decoder-only generation, pass the attention mask and position ids of "
            "padded rows (visual tokens of images of other sizes included), and use batch-invariant kernels (or "
            "fixed batch shapes) where exact answers matter",
        )  # fmt: skip
