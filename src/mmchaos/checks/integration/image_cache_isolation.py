"""Step 5: a prompt or prefix cache must not hand one request's answer to another.

Every prompt is asked about every image, greedily, in an order that lets a cache keyed on part
of the request hit: all images under one prompt in a row (a cache keyed on the prompt text), then
all prompts about one image (a cache keyed on the image). Two requests that differ in their image
or in their text must not get the same answer. "The same answer" means the same tokens and,
where the target gives them, the same per-token logprobs: even a model that says the same words
about two pictures does not assign them bit-identical probabilities, while a cache does.

Without logprobs identical texts are ambiguous (an image-blind answer looks like a cache hit), so
the check judges on black-box evidence instead (:mod:`._known_answers`): known-answer images from
the built-in data, asked in passes reordered and changed in ways that cannot matter to a greedy
model (``user``, ``seed``, the question reworded or followed by whitespace). Once under one
question about images whose colours differ (a cache keyed on the prompt text), once as three
questions about one fresh image per pass (a cache keyed on the image). Answers that follow the
request history rather than the content, in two passes led by different items, are a cache; a
model that says the same words to two open questions about one image is not one. Every finding
names its method in ``evidence["method"]``: ``logprobs`` or ``black-box probe``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from pydantic import Field

from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.checks.engine.generation_inputs import probe_images, same_answer
from mmchaos.checks.integration._known_answers import (
    METHOD,
    EchoJudgement,
    Item,
    Pass,
    busting_params,
    judge_echoes,
    reworded,
    rotations,
)
from mmchaos.data.vqa import ANSWERS, QUESTIONS, known_answer_samples
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability
from mmchaos.targets.generation import Completion, GenerationParams

__all__ = ["ImageCacheIsolation"]


class ImageCacheIsolationParams(Params):
    prompts: list[str] = Field(
        default=["What is in this image?", "Describe the picture in a few words.", "What colour is the shape?"],
        min_length=2,
    )
    images: int = Field(default=3, ge=2, le=16, description="black-box probe: at most 6 (one per colour)")
    max_new_tokens: int = Field(default=8, ge=1, le=256)


class ImageCacheIsolationGate(Gate):
    max_shared_answers: int = Field(
        default=0,
        ge=0,
        description="request pairs (different image or different text) that got the same answer; black-box probe: "
        "requests that got an earlier request's answer",
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
            if answers[(j, k)].logprobs is None:
                # Texts alone cannot tell a cache from an image-blind answer: judge on known answers.
                yield self._black_box(ctx)
                return
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
                   "with_logprobs": 1.0}  # fmt: skip
        evidence: dict[str, Any] = {"method": "logprobs", "seed": ctx.seed, "prompts": p.prompts,
                                    "images": len(images),
                                    "same_text_different_image": same_text[:10],
                                    "same_image_different_text": same_image[:10]}  # fmt: skip
        gate = f"at most {g.max_shared_answers} request pairs differing in image or text share an answer"
        if shared <= g.max_shared_answers:
            yield self.finding(
                ctx, Verdict.PASS,
                f"no shared answers over {n_pairs} request pairs ({len(answers)} requests, compared with logprobs)",
                metrics=metrics, gate=gate, evidence=evidence,
            )  # fmt: skip
            return
        which = []
        if same_text:
            which.append(f"{len(same_text)} pairs with the same text and different images")
        if same_image:
            which.append(f"{len(same_image)} pairs with the same image and different prompts")
        keyed = "the prompt text alone" if same_text and not same_image else "part of the request"
        yield self.finding(
            ctx, Verdict.FAIL,
            f"answers shared across different requests: {'; '.join(which)} (bit-identical tokens and logprobs)",
            severity=Severity.CRITICAL if same_text else Severity.HIGH,
            metrics=metrics, gate=gate, evidence=evidence,
            message=f"a cache seems keyed on {keyed}: one user's answer is served for another image or question",
            suggestion="key response and prefix caches on the full request: the rendered prompt, a hash of every "
            "image's pixels and the sampling parameters",
        )  # fmt: skip

    # -- black-box probe ---------------------------------------------------------------------------

    def _black_box(self, ctx: CheckContext) -> Finding:
        p, g = self.params, self.gate
        base = GenerationParams(max_new_tokens=p.max_new_tokens, logprobs=False)
        ask = ctx.target.generate
        # One question about images whose right colours differ: a cache keyed on the text echoes.
        n = min(p.images, len(ANSWERS["colour"]))
        pictures = [Item(f"image {i + 1}", s.load_image(), "", "colour", tuple(s.meta["answers"]))
                    for i, s in enumerate(known_answer_samples(n, "colour", seed=ctx.seed))]  # fmt: skip
        same_text: list[Pass] = []
        for m, order in enumerate(rotations(n)):
            question, params = reworded("colour", m), busting_params(base, m, f"{ctx.check_id}-text")
            run = Pass([replace(pictures[i], question=question) for i in order],
                       {"user": params.user, "seed": params.seed, "question": question})  # fmt: skip
            run.answers = [ask(it.question, [it.image], params).text for it in run.items]
            same_text.append(run)
        # Three questions about one fresh image a pass: a cache keyed on the image echoes.
        kinds = ("colour", "position", "count")
        fresh = known_answer_samples(len(kinds), "colour", seed=ctx.seed, split="val")
        same_image: list[Pass] = []
        for m, order in enumerate(rotations(len(kinds))):
            sample, params = fresh[m], busting_params(base, m, f"{ctx.check_id}-image")
            by_kind = sample.meta["answers_by_kind"]
            items = [Item(f"{kinds[i]} question", sample.load_image(), QUESTIONS[kinds[i]][0], kinds[i],
                          tuple(by_kind[kinds[i]])) for i in order]  # fmt: skip
            run = Pass(items, {"user": params.user, "seed": params.seed, "image": sample.id})
            run.answers = [ask(it.question, [it.image], params).text for it in run.items]
            same_image.append(run)
        return self._judged(ctx, judge_echoes(same_text), judge_echoes(same_image), [*same_text, *same_image], g)

    def _judged(
        self, ctx: CheckContext, text: EchoJudgement, image: EchoJudgement, passes: list[Pass],
        g: ImageCacheIsolationGate,
    ) -> Finding:  # fmt: skip
        echoes = len(text.echoes) + len(image.echoes)
        requests = sum(len(r.items) for r in passes)
        metrics = {"requests": float(requests), "with_logprobs": 0.0}
        for name, j in (("same_text", text), ("same_image", image)):
            metrics.update({f"echoes_{name}": float(len(j.echoes)), f"echo_passes_{name}": float(j.echo_passes),
                            f"testable_{name}": float(j.testable)})  # fmt: skip
        evidence: dict[str, Any] = {
            "method": METHOD, "seed": ctx.seed, "echoes": [*text.echoes, *image.echoes][:10],
            "passes": [{"variant": r.variant, "order": [it.label for it in r.items],
                        "answers": [a[:40] for a in r.answers]} for r in passes],
            "probe": "built-in known-answer shapes: one question (reworded per pass) about images of different "
            "colours, and three questions about one fresh image per pass; every pass in a rotated order with "
            "its own user and seed",
        }  # fmt: skip
        gate = (f"at most {g.max_shared_answers} requests answered with an earlier request's answer, in passes "
                "reordered and changed in ways that cannot matter to the model")  # fmt: skip
        shown = [j for j in (text, image) if j.cache_shown]
        if shown and echoes > g.max_shared_answers:
            which = []
            if text.cache_shown:
                which.append(f"{len(text.echoes)} requests with the same question about different images, "
                             f"in {text.echo_passes} of {text.passes} reordered passes")  # fmt: skip
            if image.cache_shown:
                which.append(f"{len(image.echoes)} requests with another question about the same image, "
                             f"in {image.echo_passes} of {image.passes} reordered passes")  # fmt: skip
            keyed = ("the prompt text alone" if text.cache_shown and not image.cache_shown
                     else "the image alone" if image.cache_shown and not text.cache_shown
                     else "part of the request")  # fmt: skip
            return self.finding(
                ctx, Verdict.FAIL,
                f"answers follow the request history, not the content: {'; '.join(which)} got an earlier "
                "request's answer (black-box probe)",
                severity=Severity.CRITICAL if text.cache_shown else Severity.HIGH,
                metrics=metrics, gate=gate, evidence=evidence,
                message=f"a cache seems keyed on {keyed}: asked first, each image or question was answered right; "
                "asked after another, it got that one's answer",
                suggestion="key response and prefix caches on the full request: the rendered prompt, a hash of "
                "every image's pixels and the sampling parameters",
            )  # fmt: skip
        if not (text.conclusive or image.conclusive):
            return self.finding(
                ctx, Verdict.WARN,
                "not judged: without logprobs the black-box probe needs a target that answers simple questions "
                "about shapes, and this one answered too few of them right",
                severity=Severity.LOW, metrics=metrics, gate=gate, evidence=evidence,
                message=f"{text.testable + image.testable} requests could have shown a cache; two passes of one "
                "kind are needed",
                suggestion="let the endpoint return logprobs, or run the check against a model that reads images",
            )  # fmt: skip
        return self.finding(
            ctx, Verdict.PASS,
            f"no shared answers: {text.testable + image.testable} known-answer requests in {len(passes)} reordered, "
            "cache-busted passes were each answered about their own image and question (black-box probe)",
            metrics=metrics, gate=gate, evidence=evidence,
        )  # fmt: skip
