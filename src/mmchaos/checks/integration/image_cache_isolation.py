"""Step 5: a prompt or prefix cache must not hand one request's answer to another.

Every prompt is asked about every image, greedily, in an order that lets a cache keyed on part
of the request hit: all images under one prompt in a row (a cache keyed on the prompt text), then
all prompts about one image (a cache keyed on the image). Two requests that differ in their image
or in their text must not get the same answer. "The same answer" means the same tokens and,
where the target gives them, the same per-token logprobs: even a model that says the same words
about two pictures does not assign them bit-identical probabilities, while a cache does. Without
logprobs identical texts are ambiguous (an image-blind answer looks like a cache hit), so they
are a warning, not a failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import Field

from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.checks.engine.generation_inputs import probe_images, same_answer
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability
from mmchaos.targets.generation import Completion, GenerationParams

__all__ = ["ImageCacheIsolation"]


class ImageCacheIsolationParams(Params):
    prompts: list[str] = Field(
        default=["What is in this image?", "Describe the picture in a few words.", "What colour is the shape?"],
        min_length=2,
    )
    images: int = Field(default=3, ge=2, le=16)
    max_new_tokens: int = Field(default=8, ge=1, le=256)


class ImageCacheIsolationGate(Gate):
    max_shared_answers: int = Field(
        default=0, ge=0, description="request pairs (different image or different text) that got the same answer"
    )


class ImageCacheIsolation(Check[ImageCacheIsolationParams, ImageCacheIsolationGate]):
    """Same text with different images, and one image under different prompts, never share an answer."""

    name = "image_cache_isolation"
    step = Step.INTEGRATION
    requires = (frozenset({Capability.GENERATE}),)

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p, g = self.params, self.gate
        images = probe_images(ctx, p.images)
        params = GenerationParams(max_new_tokens=p.max_new_tokens, logprobs=True)
        answers: dict[tuple[int, int], Completion] = {}
        # Prompt-major first (a text-keyed cache hits on the 2nd image), then image-major (an
        # image-keyed cache hits on the 2nd prompt): each pair is asked once, in that order.
        order = [(j, k) for j in range(len(p.prompts)) for k in range(len(images)) if k % 2 == 0]
        order += [(j, k) for k in range(len(images)) for j in range(len(p.prompts)) if k % 2 == 1]
        for j, k in order:
            answers[(j, k)] = ctx.target.generate(p.prompts[j], [images[k]], params).completions[0]
        with_logprobs = all(c.logprobs is not None for c in answers.values())
        same_text: list[dict[str, Any]] = []
        same_image: list[dict[str, Any]] = []
        keys = sorted(answers)
        for x, a in enumerate(keys):
            for b in keys[x + 1 :]:
                if (a[0] == b[0]) == (a[1] == b[1]):  # differ in exactly one of prompt, image
                    continue
                if same_answer(answers[a], answers[b]):
                    pair = {"prompt": p.prompts[a[0]], "images": [a[1], b[1]], "answer": answers[a].text[:80]}
                    if a[0] == b[0]:
                        same_text.append(pair)
                    else:
                        same_image.append({"prompts": [p.prompts[a[0]], p.prompts[b[0]]], "image": a[1],
                                           "answer": answers[a].text[:80]})  # fmt: skip
        shared = len(same_text) + len(same_image)
        n_pairs = len(p.prompts) * len(images) * (len(images) - 1) // 2
        n_pairs += len(images) * len(p.prompts) * (len(p.prompts) - 1) // 2
        metrics = {"requests": float(len(answers)), "pairs_compared": float(n_pairs),
                   "shared_answers_same_text": float(len(same_text)),
                   "shared_answers_same_image": float(len(same_image)),
                   "with_logprobs": float(with_logprobs)}  # fmt: skip
        evidence: dict[str, Any] = {"seed": ctx.seed, "prompts": p.prompts, "images": len(images),
                                    "same_text_different_image": same_text[:10],
                                    "same_image_different_text": same_image[:10]}  # fmt: skip
        gate = f"at most {g.max_shared_answers} request pairs differing in image or text share an answer"
        if shared <= g.max_shared_answers:
            yield self.finding(
                ctx, Verdict.PASS,
                f"no shared answers over {n_pairs} request pairs ({len(answers)} requests"
                f"{', compared with logprobs' if with_logprobs else ', texts only'})",
                metrics=metrics, gate=gate, evidence=evidence,
            )  # fmt: skip
            return
        which = []
        if same_text:
            which.append(f"{len(same_text)} pairs with the same text and different images")
        if same_image:
            which.append(f"{len(same_image)} pairs with the same image and different prompts")
        keyed = "the prompt text alone" if same_text and not same_image else "part of the request"
        if not with_logprobs:
            yield self.finding(
                ctx, Verdict.WARN,
                f"identical answers ({'; '.join(which)}); without logprobs a cache hit and an image-blind "
                "answer look alike",
                severity=Severity.MEDIUM, metrics=metrics, gate=gate, evidence=evidence,
                suggestion="let the endpoint return logprobs so the check can tell a cache hit from a real answer",
            )  # fmt: skip
            return
        yield self.finding(
            ctx, Verdict.FAIL,
            f"answers shared across different requests: {'; '.join(which)} (bit-identical tokens and logprobs)",
            severity=Severity.CRITICAL if same_text else Severity.HIGH,
            metrics=metrics, gate=gate, evidence=evidence,
            message=f"a cache seems keyed on {keyed}: one user's answer is served for another image or question",
            suggestion="key response and prefix caches on the full request: the rendered prompt, a hash of every "
            "image's pixels and the sampling parameters",
        )  # fmt: skip
