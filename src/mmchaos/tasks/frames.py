"""Scoring a VLM on frame sequences: each question asked with all of its sample's frames, in order.

The request is one user turn holding every frame (as images, in time order) and then the question,
so a backend that drops or reorders images beyond the first is scored as it serves. ``frames``
passed to :meth:`FramesVQA.evaluate_multimodal` replace the clean frames: that is how robustness's
``frame_offset`` and ``frame_drop`` reach the model; ``texts`` replace the questions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from mmchaos.data.base import Dataset
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import GenerationParams, Message
from mmchaos.tasks.answers import exact_match, normalised_match
from mmchaos.tasks.base import ImageArray, Task, TaskResult
from mmchaos.tasks.generative import Answers, answer_batches

__all__ = ["FramesVQA", "ask_with_images", "has_frames"]


def has_frames(dataset: Dataset) -> bool:
    """Every sample carries a non-empty frame sequence in ``meta["frames"]``."""
    return bool(dataset.samples) and all(len(s.meta.get("frames") or ()) > 0 for s in dataset)


def ask_with_images(
    target: Target,
    questions: Sequence[str],
    images: Sequence[Sequence[ImageArray]],
    params: GenerationParams,
    batch: int,
) -> Answers:
    """Greedy answers to requests of several images then a question, ``batch`` requests a call.

    As :func:`~mmchaos.tasks.generative.ask`: a batch refused for one of its requests is asked again
    a request at a time, and a request the target cannot take (``PER_REQUEST_REFUSALS``: four pages
    and a question past a small model's positions) is answered with nothing and counted.
    """
    requests: list[list[Message]] = [[Message("user", (*imgs, q))] for imgs, q in zip(images, questions, strict=True)]
    return answer_batches(target, (requests[i : i + batch] for i in range(0, len(requests), batch)), params)


class FramesVQA(Task):
    """Share of questions about frame sequences answered right (normalised match), per kind too."""

    name = "frames_vqa"
    metric_name = "accuracy"
    requires = frozenset({Capability.GENERATE})
    max_new_tokens: ClassVar[int] = 16

    @classmethod
    def supports(cls, target: Target, dataset: Dataset) -> bool:
        return super().supports(target, dataset) and dataset.has_questions and has_frames(dataset)

    def evaluate(
        self,
        target: Target,
        dataset: Dataset,
        images: Sequence[ImageArray] | None = None,
        texts: Sequence[str] | None = None,
    ) -> TaskResult:
        return self.evaluate_multimodal(target, dataset, texts=texts)

    def evaluate_multimodal(
        self,
        target: Target,
        dataset: Dataset,
        images: Sequence[ImageArray] | None = None,
        texts: Sequence[str] | None = None,
        frames: Sequence[Sequence[ImageArray] | None] | None = None,
        boxes: Sequence[Sequence[Sequence[float]] | None] | None = None,
    ) -> TaskResult:
        clips = [
            list(f) if frames is not None and (f := frames[i]) is not None else list(s.meta["frames"])
            for i, s in enumerate(dataset)
        ]
        questions = texts if texts is not None else [s.question or "" for s in dataset]
        params = GenerationParams(max_new_tokens=self.max_new_tokens, logprobs=False)
        preds = ask_with_images(target, questions, clips, params, self.batch_size)
        refs = [_answers(s.answer, s.meta.get("answers")) for s in dataset]
        right = np.array([normalised_match(p, r) for p, r in zip(preds, refs, strict=True)], dtype=np.float64)
        extra: dict[str, float] = {
            "exact_match": float(np.mean([exact_match(p, r) for p, r in zip(preds, refs, strict=True)]))
            if refs
            else 0.0
        }
        kinds: dict[str, list[float]] = {}
        for s, ok in zip(dataset, right, strict=True):
            kinds.setdefault(str(s.meta.get("kind", "")), []).append(float(ok))
        extra.update({f"accuracy_{k}": float(np.mean(v)) for k, v in sorted(kinds.items()) if k})
        return TaskResult(float(right.mean()) if len(right) else 0.0, right, extra, preds)


def _answers(answer: str | None, alternatives: Any) -> list[str]:
    extra = [str(a) for a in alternatives] if isinstance(alternatives, list | tuple) else []
    return [answer or "", *extra]
