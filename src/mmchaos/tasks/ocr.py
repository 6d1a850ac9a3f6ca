"""OCR task: character error rate of the target's transcriptions against the ground truth."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mmchaos.data.base import Dataset
from mmchaos.targets.base import Capability, Target
from mmchaos.tasks.base import ImageArray, Task, TaskResult, batched
from mmchaos.tasks.ocr_metrics import cer, corpus_cer

__all__ = ["OCRTask", "score_transcriptions"]


class OCRTask(Task):
    """Corpus character error rate (whitespace runs collapsed, case kept; see ocr_metrics)."""

    name = "ocr"
    metric_name = "cer"
    higher_is_better = False
    requires = frozenset({Capability.READ_TEXT})

    @classmethod
    def supports(cls, target: Target, dataset: Dataset) -> bool:
        return super().supports(target, dataset) and dataset.has_transcriptions and dataset.has_images

    def evaluate(
        self,
        target: Target,
        dataset: Dataset,
        images: Sequence[ImageArray] | None = None,
        texts: Sequence[str] | None = None,
    ) -> TaskResult:
        imgs = images if images is not None else dataset.images()
        preds: list[str] = [t for part in batched(target.read_text, imgs, self.batch_size) for t in part]
        return score_transcriptions(preds, [s.text or "" for s in dataset])

    def combine(self, dataset: Dataset, parts: Sequence[TaskResult]) -> TaskResult:
        """Corpus CER over every shard's transcriptions (not a mean of shard CERs)."""
        return score_transcriptions([o for p in parts for o in p.outputs], [s.text or "" for s in dataset])


def score_transcriptions(preds: Sequence[str], refs: Sequence[str]) -> TaskResult:
    """Corpus CER, per-sample ``1 - CER`` and exact match of predicted against reference texts."""
    per = np.array([max(0.0, 1.0 - cer(p, r)) for p, r in zip(preds, refs, strict=True)], dtype=np.float64)
    exact = float(np.mean([p.strip() == r.strip() for p, r in zip(preds, refs, strict=True)])) if refs else 0.0
    return TaskResult(corpus_cer(preds, refs), per, {"exact_match": exact}, list(preds))
