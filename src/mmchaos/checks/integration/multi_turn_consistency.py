"""Step 5: in a multi-turn chat, turn N answers about the image sent at turn N.

Each chat opens with an image and a question, carries the target's own greedy answer as the
assistant turn, then asks a second question about a new image. Chats that share the first turn
and differ only in the last image must get different last answers: a server that reuses the
first image's features for the whole conversation (or caches them per conversation) answers
every follow-up about the first picture. "Different" compares tokens and, where given, logprobs,
so a tiny model that happens to say the same words still passes if it read the pixels.

For information it also reports whether the earlier image still shapes the last answer (chats that
differ only in the first image), since a server that drops history images changes answers too.

Without logprobs two equal texts cannot tell a stale image from an image-blind answer, so the check
scores the last turn against the truth instead (:mod:`._known_answers`): the chats open with a
built-in known-answer image and ask the colour of another one at the last turn, and each last
image is also asked about alone (with its own ``user``, ``seed`` and whitespace, so no cache keyed
on part of the request can answer it). A last answer that is wrong though the same image and
question alone are answered right fails; when it names another image of the probe (the chat's first
one, or another chat's last one) the evidence says so. Every finding names its method in
``evidence["method"]``: ``logprobs`` or ``black-box probe``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import Field

from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.checks.engine.generation_inputs import answer_key, probe_images, same_answer
from mmchaos.checks.integration._known_answers import METHOD, busting_params, is_right
from mmchaos.data.vqa import ANSWERS, QUESTIONS, known_answer_samples
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability
from mmchaos.targets.generation import Completion, GenerationParams, Message

__all__ = ["MultiTurnConsistency"]


class MultiTurnConsistencyParams(Params):
    first_question: str = "What is in this image?"
    follow_up: str = "And what is in this one?"
    last_images: int = Field(
        default=3, ge=2, le=8, description="different images tried at the last turn (black-box probe: at most 5)"
    )
    max_new_tokens: int = Field(default=8, ge=1, le=256)


class MultiTurnConsistencyGate(Gate):
    max_shared_last_answers: int = Field(
        default=0, ge=0, description="pairs of chats differing only in the last image that got the same last answer"
    )
    max_wrong_last_answers: int = Field(
        default=0,
        ge=0,
        description="black-box probe: chats whose last answer is wrong though that image and question alone are "
        "answered right",
    )


class MultiTurnConsistency(Check[MultiTurnConsistencyParams, MultiTurnConsistencyGate]):
    """Turn N of a chat answers about turn N's image, not the first one."""

    name = "multi_turn_consistency"
    step = Step.INTEGRATION
    requires = (frozenset({Capability.GENERATE}),)

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p, g = self.params, self.gate
        limit = getattr(ctx.target, "images_per_request", None)
        if isinstance(limit, int) and limit < 2:
            yield self.finding(
                ctx, Verdict.SKIPPED,
                f"skipped: a chat with an image in two turns needs two images in one request; the target takes "
                f"{limit} (images_per_request)",
                evidence={"images_per_request": limit},
            )  # fmt: skip
            return
        images = probe_images(ctx, p.last_images + 2)
        first, other_first, lasts = images[0], images[1], images[2:]
        params = GenerationParams(max_new_tokens=p.max_new_tokens, logprobs=True)
        target = ctx.target
        opened = target.generate(p.first_question, [first], params)
        if opened.logprobs is None:
            # Texts alone cannot tell a stale image from an image-blind answer: score against the truth.
            yield self._black_box(ctx)
            return
        opening = opened.text

        def chat(first_image: Any, last_image: Any) -> Completion:
            messages = [
                Message("user", (first_image, p.first_question)),
                Message("assistant", opening),
                Message("user", (last_image, p.follow_up)),
            ]
            return target.generate(messages, params=params).completions[0]

        last_answers = [chat(first, img) for img in lasts]
        if any(c.logprobs is None for c in last_answers):  # the server dropped them midway
            yield self._black_box(ctx)
            return
        shared = [
            (a, b)
            for a in range(len(lasts))
            for b in range(a + 1, len(lasts))
            if same_answer(last_answers[a], last_answers[b])
        ]
        history = chat(other_first, lasts[0])
        history_matters = not same_answer(history, last_answers[0])
        metrics = {"chats": float(len(lasts) + 1), "shared_last_answers": float(len(shared)),
                   "distinct_last_answers": float(len({answer_key(c) for c in last_answers})),
                   "first_image_changes_last_answer": float(history_matters),
                   "with_logprobs": 1.0}  # fmt: skip
        evidence: dict[str, Any] = {"method": "logprobs", "seed": ctx.seed,
                                    "first_question": p.first_question, "follow_up": p.follow_up,
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
        yield self.finding(
            ctx, Verdict.FAIL,
            f"the last turn ignores its own image: {len(shared)} of {len(lasts) * (len(lasts) - 1) // 2} chat pairs "
            "differing only in the last image got bit-identical answers",
            severity=Severity.HIGH, metrics=metrics, gate=gate, evidence=evidence,
            message="turn N is answered about another image (the first one, or a cached one) than the one it sent",
            suggestion="attach every turn's images in order; key per-conversation image caches on the image content "
            "and its position, not the conversation id",
        )  # fmt: skip

    # -- black-box probe ---------------------------------------------------------------------------

    def _black_box(self, ctx: CheckContext) -> Finding:
        p, g = self.params, self.gate
        n = min(p.last_images, len(ANSWERS["colour"]) - 1)
        first, *lasts = known_answer_samples(n + 1, "colour", seed=ctx.seed + 1, split="val")
        opening_q, follow_up = QUESTIONS["colour"][0], QUESTIONS["colour"][1]
        base = GenerationParams(max_new_tokens=p.max_new_tokens, logprobs=False)
        chat_params = busting_params(base, 0, f"{ctx.check_id}-chat")
        ask = ctx.target.generate
        opening = ask(opening_q, [first.load_image()], chat_params).text
        # Each last image alone, under a key no other request shares: what the target knows about it.
        alone = [ask(follow_up + " " * (i + 1), [s.load_image()], busting_params(base, i + 1, f"{ctx.check_id}-alone"))
                 .text for i, s in enumerate(lasts)]  # fmt: skip
        chats = [
            ask([Message("user", (first.load_image(), opening_q)), Message("assistant", opening),
                 Message("user", (s.load_image(), follow_up))], params=chat_params).text
            for s in lasts
        ]  # fmt: skip
        labels = {"the first image": first, **{f"last image {i + 1}": s for i, s in enumerate(lasts)}}
        rows: list[dict[str, Any]] = []
        for i, s in enumerate(lasts):
            known = is_right(alone[i], "colour", s.meta["answers"])
            right = is_right(chats[i], "colour", s.meta["answers"])
            named = next((name for name, o in labels.items() if o is not s
                          and is_right(chats[i], "colour", o.meta["answers"])), None)  # fmt: skip
            rows.append({"chat": i + 1, "right_answer": s.answer, "alone": alone[i][:60], "in_chat": chats[i][:60],
                         "known_alone": known, "right_in_chat": right, "names": named})  # fmt: skip
        known_rows = [r for r in rows if r["known_alone"]]
        wrong = [r for r in known_rows if not r["right_in_chat"]]
        stale = [r for r in wrong if r["names"] is not None]
        metrics = {"chats": float(len(lasts)), "known_alone": float(len(known_rows)),
                   "wrong_last_answers": float(len(wrong)), "stale_last_answers": float(len(stale)),
                   "with_logprobs": 0.0}  # fmt: skip
        evidence: dict[str, Any] = {"method": METHOD, "seed": ctx.seed, "opening_question": opening_q,
                                    "follow_up": follow_up, "first_image_answer": first.answer,
                                    "opening_answer": opening[:80], "chats": rows,
                                    "probe": "built-in known-answer shapes of different colours; each last image "
                                    "also asked about alone, with its own user, seed and whitespace"}  # fmt: skip
        gate = (f"at most {g.max_wrong_last_answers} chats answer their last image wrong where that image alone is "
                "answered right")  # fmt: skip
        if len(wrong) > g.max_wrong_last_answers:
            about = f"; {len(stale)} named another image of the probe ({stale[0]['names']}, ...)" if stale else ""
            return self.finding(
                ctx, Verdict.FAIL,
                f"the last turn is not answered about its own image: {len(wrong)} of {len(known_rows)} chats got a "
                f"wrong last answer though the image alone is answered right{about} (black-box probe)",
                severity=Severity.HIGH, metrics=metrics, gate=gate, evidence=evidence,
                message="turn N is answered about another image (the first one, or a cached one) than the one it sent",
                suggestion="attach every turn's images in order; key per-conversation image caches and response "
                "caches on the image content and its position, not the conversation or its text",
            )  # fmt: skip
        if len(known_rows) < 2:
            return self.finding(
                ctx, Verdict.WARN,
                f"not judged: without logprobs the black-box probe needs a target that names the colour of a shape, "
                f"and this one did for {len(known_rows)} of {len(lasts)} images asked alone",
                severity=Severity.LOW, metrics=metrics, gate=gate, evidence=evidence,
                suggestion="let the endpoint return logprobs, or run the check against a model that reads images",
            )  # fmt: skip
        return self.finding(
            ctx, Verdict.PASS,
            f"the last turn follows its own image: {len(known_rows)} chats, each last answer right about its own "
            "image (black-box probe)",
            metrics=metrics, gate=gate, evidence=evidence,
        )  # fmt: skip
