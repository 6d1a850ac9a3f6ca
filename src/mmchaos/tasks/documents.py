"""Scoring a VLM on documents: each question asked with every page of its document, in page order.

The request is one user turn holding all pages (large images: a 4-page report at 200 dpi is
46 MB of pixels) and then the question, as the headline incident's "compare the table on page 2
with page 4" requests were. ``images`` passed to :meth:`DocumentQA.evaluate` replace the page a
question is about (the first page it names), the other pages stay clean: that is how robustness's
image perturbations reach a document; ``texts`` replace the questions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from mmchaos.data.base import Dataset, Sample
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import GenerationParams
from mmchaos.tasks.base import ImageArray, Task, TaskResult
from mmchaos.tasks.frames import ask_with_images
from mmchaos.tasks.generative import Answers, combined_refused_rate, score_answers

__all__ = ["DocumentQA", "has_documents", "request_pages"]


def has_documents(dataset: Dataset) -> bool:
    """Every sample is a page of a document whose pages are in ``meta["pages"]``."""
    return bool(dataset.samples) and all(s.page is not None and s.meta.get("pages") for s in dataset)


def request_pages(sample: Sample, replacement: ImageArray | None = None) -> list[ImageArray]:
    """The page images of one request: every page, the sample's own page replaced when given."""
    own = sample.page
    return [replacement if replacement is not None and p == own else p.render() for p in sample.meta["pages"]]


class DocumentQA(Task):
    """Share of questions about multi-page documents answered right (normalised match), per kind too."""

    name = "document_qa"
    metric_name = "accuracy"
    requires = frozenset({Capability.GENERATE})
    max_new_tokens: ClassVar[int] = 16

    def __init__(self, batch_size: int = 64) -> None:
        super().__init__(min(batch_size, 4))  # a request is many large pages: a few requests a call

    @classmethod
    def supports(cls, target: Target, dataset: Dataset) -> bool:
        return super().supports(target, dataset) and dataset.has_questions and has_documents(dataset)

    def evaluate(
        self,
        target: Target,
        dataset: Dataset,
        images: Sequence[ImageArray] | None = None,
        texts: Sequence[str] | None = None,
    ) -> TaskResult:
        questions = texts if texts is not None else [s.question or "" for s in dataset]
        params = GenerationParams(max_new_tokens=self.max_new_tokens, logprobs=False)
        preds = Answers()
        for i in range(0, len(dataset), self.batch_size):  # one batch of documents rendered at a time
            rows = range(i, min(i + self.batch_size, len(dataset)))
            pages = [request_pages(dataset[j], images[j] if images is not None else None) for j in rows]
            got = ask_with_images(target, [questions[j] for j in rows], pages, params, self.batch_size)
            preds.refused.update({i + k: code for k, code in got.refused.items()})
            preds += got
        result = self._score(dataset, preds)
        result.extra.update(preds.refusal_extra())
        return result

    def combine(self, dataset: Dataset, parts: Sequence[TaskResult]) -> TaskResult:
        """Scored again over every shard's answers (the per-kind accuracies are not shard means);
        the refused share is a mean over samples, weighed by shard size."""
        result = self._score(dataset, [o for p in parts for o in p.outputs])
        result.extra.update(combined_refused_rate(parts))
        return result

    @staticmethod
    def _score(dataset: Dataset, preds: list[str]) -> TaskResult:
        """The VQA scoring (:func:`~mmchaos.tasks.generative.score_answers`), plus pages per request."""
        result = score_answers(dataset, preds)
        result.extra["pages_per_request"] = float(np.mean([len(s.meta["pages"]) for s in dataset])) if preds else 0.0
        return result
