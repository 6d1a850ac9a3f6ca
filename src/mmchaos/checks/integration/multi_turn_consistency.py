"""Step 5: in a multi-turn chat, turn N answers about the image sent at turn N.

Each chat opens with an image and a question, carries the target's own greedy answer as the
assistant turn, then asks a second question about a new image. Chats that share the first turn
and differ only in the last image must get different last answers: a server that reuses the
first image's features for the whole conversation (or caches them per conversation) answers
every follow-up about the first picture. "Different" compares tokens and, where given, logprobs,
so a tiny model that happens to say the same words still passes if it read the pixels.

For information it also reports whether the earlier image still shapes the last answer (chats that
differ only in the first image), since a server that drops history images changes answers too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import Field

from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.checks.engine.generation_inputs import answer_key, probe_images, same_answer
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability
from mmchaos.targets.generation import Completion, GenerationParams, Message

__all__ = ["MultiTurnConsistency"]


class MultiTurnConsistencyParams(Params):
    first_question: str = "What is in this image?"
    follow_up: str = "And what is in this one?"
    last_images: int = Field(default=3, ge=2, le=8, description="different images tried at the last turn")
    max_new_tokens: int = Field(default=8, ge=1, le=256)


class MultiTurnConsistencyGate(Gate):
    max_shared_last_answers: int = Field(
        default=0, ge=0, description="pairs of chats differing only in the last image that got the same last answer"
    )


class MultiTurnConsistency(Check[MultiTurnConsistencyParams, MultiTurnConsistencyGate]):
    """Turn N of a chat answers about turn N's image, not the first one."""

    name = "multi_turn_consistency"
    step = Step.INTEGRATION
    requires = (frozenset({Capability.GENERATE}),)

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p, g = self.params, self.gate
        images = probe_images(ctx, p.last_images + 2)
        first, other_first, lasts = images[0], images[1], images[2:]
        params = GenerationParams(max_new_tokens=p.max_new_tokens, logprobs=True)
        target = ctx.target
        opening = target.generate(p.first_question, [first], params).text

        def chat(first_image: Any, last_image: Any) -> Completion:
            messages = [
                Message("user", (first_image, p.first_question)),
                Message("assistant", opening),
                Message("user", (last_image, p.follow_up)),
            ]
            return target.generate(messages, params=params).completions[0]

        last_answers = [chat(first, img) for img in lasts]
        shared = [
            (a, b)
            for a in range(len(lasts))
            for b in range(a + 1, len(lasts))
            if same_answer(last_answers[a], last_answers[b])
        ]
        history = chat(other_first, lasts[0])
        history_matters = not same_answer(history, last_answers[0])
        with_logprobs = all(c.logprobs is not None for c in last_answers)
        metrics = {"chats": float(len(lasts) + 1), "shared_last_answers": float(len(shared)),
                   "distinct_last_answers": float(len({answer_key(c) for c in last_answers})),
                   "first_image_changes_last_answer": float(history_matters),
                   "with_logprobs": float(with_logprobs)}  # fmt: skip
        evidence: dict[str, Any] = {"seed": ctx.seed, "first_question": p.first_question, "follow_up": p.follow_up,
                                    "opening_answer": opening[:80],
                                    "last_answers": [c.text[:80] for c in last_answers],
                                    "shared_pairs": [list(s) for s in shared]}  # fmt: skip
        gate = f"at most {g.max_shared_last_answers} chats differing only in the last image share the last answer"
        if len(shared) <= g.max_shared_last_answers:
            yield self.finding(
                ctx, Verdict.PASS,
                f"the last turn follows its own image ({len(lasts)} different last images, "
                f"{int(metrics['distinct_last_answers'])} distinct answers"
                f"{'' if history_matters else '; the first image does not change it'})",
                metrics=metrics, gate=gate, evidence=evidence,
            )  # fmt: skip
            return
        if not with_logprobs:
            yield self.finding(
                ctx, Verdict.WARN,
                f"{len(shared)} chats differing only in the last image got identical last answers (texts only: "
                "an image-blind answer and a stale image look alike)",
                severity=Severity.MEDIUM, metrics=metrics, gate=gate, evidence=evidence,
            )  # fmt: skip
            return
        yield self.finding(
            ctx, Verdict.FAIL,
            f"the last turn ignores its own image: {len(shared)} of {len(lasts) * (len(lasts) - 1) // 2} chat pairs "
            "differing only in the last image got bit-identical answers",
            severity=Severity.HIGH, metrics=metrics, gate=gate, evidence=evidence,
            message="turn N is answered about another image (the first one, or a cached one) than the one it sent",
            suggestion="attach every turn's images in order; key per-conversation image caches on the image content "
            "and its position, not the conversation id",
        )  # fmt: skip
