"""Tasks for generative targets (VLMs): visual question answering and reading text by generation.

Both ask the target through :meth:`~mmchaos.targets.base.Target.generate_batch` with greedy
decoding, so a backend that batches is scored as it serves. ``texts`` passed to ``evaluate``
replace the questions (VQA) and are how text perturbations reach a VLM.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from mmchaos.data.base import Dataset, Sample
from mmchaos.errors import TargetCallError
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import GenerationParams, Message
from mmchaos.tasks.answers import exact_match, normalised_match
from mmchaos.tasks.base import ImageArray, Task, TaskResult
from mmchaos.tasks.ocr import score_transcriptions

__all__ = ["PER_REQUEST_REFUSALS", "Answers", "CaptionCER", "GenerativeOCR", "VQAAccuracy", "ask"]

_GEN = frozenset({Capability.GENERATE})

PER_REQUEST_REFUSALS = frozenset(
    {"context_exceeded", "processor_refused", "bad_content_part", "image_too_large", "image_required"}
)
"""Codes by which a target refuses one request it cannot take (too long once its images are
expanded, an image its processor refuses): that request is answered with nothing and counted,
never a reason to stop scoring the others."""


class Answers(list[str]):
    """Answers in request order; ``refused`` maps the index of each request the target refused
    (:data:`PER_REQUEST_REFUSALS`) to its code (its answer is the empty string)."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: dict[int, str] = {}

    def refusal_extra(self) -> dict[str, float]:
        """The share of requests refused, as a task metric extra (a mean over samples, so shards combine)."""
        return {"refused_rate": len(self.refused) / len(self) if self else 0.0}


def ask(
    target: Target, questions: Sequence[str], images: Sequence[ImageArray | None], params: GenerationParams, batch: int
) -> Answers:
    """Greedy answers to (image, question) requests, ``batch`` requests a call; no image: text only.

    A batch the target refuses for one of its requests is asked again one request at a time, so
    a request it cannot take (:data:`PER_REQUEST_REFUSALS`) is refused alone and counted in
    :attr:`Answers.refused`; any other error propagates.
    """
    if len(images) != len(questions):
        raise ValueError(f"{len(images)} images for {len(questions)} questions")
    chunks = (  # one batch of images decoded at a time
        [
            [Message("user", (img, q) if img is not None else q)]
            for img, q in zip(images[i : i + batch], questions[i : i + batch], strict=True)
        ]
        for i in range(0, len(questions), batch)
    )
    return answer_batches(target, chunks, params)


def answer_batches(target: Target, chunks: Iterable[list[list[Message]]], params: GenerationParams) -> Answers:
    """Greedy answers to consecutive batches of chat requests, one ``generate_batch`` call a batch.

    A batch the target refuses is asked again one request at a time: a request it cannot take
    (:data:`PER_REQUEST_REFUSALS`) is answered with nothing and counted in :attr:`Answers.refused`
    (by its index over all batches); any other error propagates.
    """
    out = Answers()
    for requests in chunks:
        start = len(out)
        try:
            out += [r.text for r in target.generate_batch(requests, params)]
            continue
        except TargetCallError as exc:
            if exc.code not in PER_REQUEST_REFUSALS:
                raise
        for j, request in enumerate(requests):
            try:
                out.append(target.generate_batch([request], params)[0].text)
            except TargetCallError as exc:
                if exc.code not in PER_REQUEST_REFUSALS:
                    raise
                out.refused[start + j] = exc.code
                out.append("")
    return out


def combined_refused_rate(parts: Sequence[TaskResult]) -> dict[str, float]:
    """The refused share over consecutive shards' results, weighed by shard size (empty if one lacks it)."""
    if not parts or not all("refused_rate" in p.extra for p in parts):
        return {}
    sizes = [len(p.per_sample) for p in parts]
    rate = sum(p.extra["refused_rate"] * n for p, n in zip(parts, sizes, strict=True)) / max(1, sum(sizes))
    return {"refused_rate": float(rate)}


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
        answers = ask(target, questions, imgs, params, self.batch_size)
        result = self._score(dataset, answers)
        result.extra.update(answers.refusal_extra())
        return result

    def combine(self, dataset: Dataset, parts: Sequence[TaskResult]) -> TaskResult:
        """Scored again over every shard's answers (the per-kind accuracies are not shard means);
        the refused share is a mean over samples, weighed by shard size."""
        result = self._score(dataset, [o for p in parts for o in p.outputs])
        result.extra.update(combined_refused_rate(parts))
        return result

    @staticmethod
    def _score(dataset: Dataset, preds: list[str]) -> TaskResult:
        return score_answers(dataset, preds)


def score_answers(dataset: Dataset, preds: list[str]) -> TaskResult:
    """Short answers against each sample's reference answers: normalised-match accuracy (the metric),
    exact match, and accuracy per question kind (``meta["kind"]``)."""
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
