"""Tasks for generative targets (VLMs): visual question answering and reading text by generation.

Both ask the target through :meth:`~mmchaos.targets.base.Target.generate_batch` with greedy
decoding, so a backend that batches is scored as it serves. ``texts`` passed to ``evaluate``
replace the questions (VQA) and are how text perturbations reach a VLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from mmchaos.data.base import Dataset, Sample
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import GenerationParams, Message
from mmchaos.tasks.answers import exact_match, normalised_match
from mmchaos.tasks.base import ImageArray, Task, TaskResult
from mmchaos.tasks.ocr import score_transcriptions
from mmchaos.tasks.refusals import answer_each

__all__ = ["CaptionCER", "GenerativeOCR", "VQAAccuracy", "ask"]

_GEN = frozenset({Capability.GENERATE})


def ask(
    target: Target, questions: Sequence[str], images: Sequence[ImageArray | None], params: GenerationParams, batch: int
) -> list[str]:
    """Greedy answers to (image, question) requests, ``batch`` requests a call; no image: text only.
    A request the target refuses (a typed content refusal, see :mod:`mmchaos.tasks.refusals`) gets
    an empty answer, which scores as wrong."""
    if len(images) != len(questions):
        raise ValueError(f"{len(images)} images for {len(questions)} questions")
    out: list[str] = []
    for i in range(0, len(questions), batch):  # one batch of images decoded at a time
        requests: list[list[Message]] = [
            [Message("user", (img, q) if img is not None else q)]
            for img, q in zip(images[i : i + batch], questions[i : i + batch], strict=True)
        ]
        out += answer_each(lambda rs: [r.text for r in target.generate_batch(rs, params)], requests)[0]
    return out


def _answers(sample: Sample) -> list[str]:
    extra = sample.meta.get("answers")
    alternatives = [str(a) for a in extra] if isinstance(extra, list | tuple) else []
    return [sample.answer or "", *alternatives]


class VQAAccuracy(Task):
    """Share of questions answered right (normalised match with the reference or its alternatives)."""

    name = "vqa"
    metric_name = "accuracy"
    requires = _GEN
    max_new_tokens: ClassVar[int] = 16

    @classmethod
    def supports(cls, target: Target, dataset: Dataset) -> bool:
        return super().supports(target, dataset) and dataset.has_questions and dataset.has_images

    def evaluate(
        self,
        target: Target,
        dataset: Dataset,
        images: Sequence[ImageArray] | None = None,
        texts: Sequence[str] | None = None,
    ) -> TaskResult:
        imgs: Sequence[ImageArray | None] = images if images is not None else dataset.images()
        questions = texts if texts is not None else [s.question or "" for s in dataset]
        params = GenerationParams(max_new_tokens=self.max_new_tokens, logprobs=False)
        return self._score(dataset, ask(target, questions, imgs, params, self.batch_size))

    def combine(self, dataset: Dataset, parts: Sequence[TaskResult]) -> TaskResult:
        """Scored again over every shard's answers (the per-kind accuracies are not shard means)."""
        return self._score(dataset, [o for p in parts for o in p.outputs])

    @staticmethod
    def _score(dataset: Dataset, preds: list[str]) -> TaskResult:
        refs = [_answers(s) for s in dataset]
        right = np.array([normalised_match(p, r) for p, r in zip(preds, refs, strict=True)], dtype=np.float64)
        exact = [exact_match(p, r) for p, r in zip(preds, refs, strict=True)]
        extra: dict[str, float] = {"exact_match": float(np.mean(exact)) if exact else 0.0}
        kinds: dict[str, list[float]] = {}
        for s, ok in zip(dataset, right, strict=True):
            kinds.setdefault(str(s.meta.get("kind", "")), []).append(float(ok))
        extra.update({f"accuracy_{k}": float(np.mean(v)) for k, v in sorted(kinds.items()) if k})
        return TaskResult(float(right.mean()) if len(right) else 0.0, right, extra, preds)


class _GeneratedText(Task):
    """Corpus CER of text the target generates about each image against a reference field."""

    metric_name = "cer"
    higher_is_better = False
    requires = _GEN
    prompt: ClassVar[str] = ""
    field: ClassVar[str] = ""
    max_new_tokens: ClassVar[int] = 48

    def _reference(self, sample: Sample) -> str:
        value: Any = getattr(sample, self.field)
        return str(value or "")

    def evaluate(
        self,
        target: Target,
        dataset: Dataset,
        images: Sequence[ImageArray] | None = None,
        texts: Sequence[str] | None = None,
    ) -> TaskResult:
        imgs: Sequence[ImageArray | None] = images if images is not None else dataset.images()
        params = GenerationParams(max_new_tokens=self.max_new_tokens, logprobs=False)
        preds = ask(target, [self.prompt] * len(imgs), imgs, params, self.batch_size)
        return score_transcriptions(preds, [self._reference(s) for s in dataset])

    def combine(self, dataset: Dataset, parts: Sequence[TaskResult]) -> TaskResult:
        """Corpus CER over every shard's generated texts."""
        return score_transcriptions([o for p in parts for o in p.outputs], [self._reference(s) for s in dataset])


class GenerativeOCR(_GeneratedText):
    """Corpus CER of a VLM's transcription of each text-line image (asked to read it)."""

    name = "vlm_ocr"
    prompt = "What does the text in the image say? Answer with the text only."
    field = "text"

    @classmethod
    def supports(cls, target: Target, dataset: Dataset) -> bool:
        return super().supports(target, dataset) and dataset.has_transcriptions and dataset.has_images


class CaptionCER(_GeneratedText):
    """Corpus CER of a VLM's one-sentence caption against the reference caption."""

    name = "caption_cer"
    prompt = "Describe the image in one sentence."
    field = "caption"

    @classmethod
    def supports(cls, target: Target, dataset: Dataset) -> bool:
        return super().supports(target, dataset) and dataset.has_captions and dataset.has_images
