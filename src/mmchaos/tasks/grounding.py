"""Scoring a VLM on grounding: boxes it answers (IoU) and questions about boxes it is given.

A sample with ``meta["answer_box"]`` asks where something is: the first four numbers of the answer
are read as ``[x0, y0, x1, y1]`` pixels and scored by IoU with the reference box (right when
IoU >= ``iou_threshold``, 0.5 as in PASCAL VOC / RefCOCO). Any other sample asks about a box it
gives (``meta["boxes"]``): right on a normalised match, as ``vqa``. ``boxes`` passed to
:meth:`Grounding.evaluate_multimodal` replace the given boxes and the question is re-rendered from
``meta["template"]``: that is how robustness's ``bbox_shift`` reaches the model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from mmchaos.data.base import Dataset, Sample
from mmchaos.data.grounding import format_box
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import GenerationParams
from mmchaos.tasks.answers import normalised_match
from mmchaos.tasks.base import ImageArray, Task, TaskResult
from mmchaos.tasks.generative import ask

__all__ = ["Grounding", "has_boxes", "iou", "parse_box"]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def parse_box(text: str) -> tuple[float, float, float, float] | None:
    """The first four numbers of an answer as a box (corners sorted), or None when it has fewer."""
    found = [float(v) for v in _NUMBER.findall(text)[:4]]
    if len(found) < 4:
        return None
    x0, y0, x1, y1 = found
    return (min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two ``(x0, y0, x1, y1)`` boxes; 0 when either is empty."""
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


def has_boxes(dataset: Dataset) -> bool:
    """Every sample is a grounding question: it has a reference box or carries input boxes."""
    return bool(dataset.samples) and all("answer_box" in s.meta or "boxes" in s.meta for s in dataset)


class Grounding(Task):
    """Share of grounding questions right: boxes with IoU >= 0.5, region answers by normalised match."""

    name = "grounding"
    metric_name = "accuracy"
    requires = frozenset({Capability.GENERATE})
    max_new_tokens: ClassVar[int] = 24
    iou_threshold: ClassVar[float] = 0.5

    @classmethod
    def supports(cls, target: Target, dataset: Dataset) -> bool:
        return super().supports(target, dataset) and dataset.has_questions and dataset.has_images and has_boxes(dataset)

    def evaluate(
        self,
        target: Target,
        dataset: Dataset,
        images: Sequence[ImageArray] | None = None,
        texts: Sequence[str] | None = None,
    ) -> TaskResult:
        return self.evaluate_multimodal(target, dataset, images=images, texts=texts)

    def evaluate_multimodal(
        self,
        target: Target,
        dataset: Dataset,
        images: Sequence[ImageArray] | None = None,
        texts: Sequence[str] | None = None,
        frames: Sequence[Sequence[ImageArray] | None] | None = None,
        boxes: Sequence[Sequence[Sequence[float]] | None] | None = None,
    ) -> TaskResult:
        imgs: Sequence[ImageArray | None] = images if images is not None else [s.load_image() for s in dataset]
        questions = list(texts) if texts is not None else [s.question or "" for s in dataset]
        if boxes is not None:
            questions = [_rerender(s, q, b) for s, q, b in zip(dataset, questions, boxes, strict=True)]
        params = GenerationParams(max_new_tokens=self.max_new_tokens, logprobs=False)
        preds = ask(target, questions, imgs, params, self.batch_size)
        right: list[float] = []
        ious: list[float] = []
        parsed = 0
        kinds: dict[str, list[float]] = {}
        for s, pred in zip(dataset, preds, strict=True):
            if "answer_box" in s.meta:
                box = parse_box(pred)
                parsed += box is not None
                overlap = iou(box, [float(v) for v in s.meta["answer_box"]]) if box is not None else 0.0
                ious.append(overlap)
                ok = overlap >= self.iou_threshold
            else:
                ok = normalised_match(pred, [s.answer or "", *[str(a) for a in s.meta.get("answers") or ()]])
            right.append(float(ok))
            kinds.setdefault(str(s.meta.get("kind") or ("locate" if "answer_box" in s.meta else "region")), []).append(
                float(ok)
            )
        per = np.array(right, dtype=np.float64)
        extra: dict[str, float] = {f"accuracy_{k}": float(np.mean(v)) for k, v in sorted(kinds.items())}
        if ious:
            extra["mean_iou"] = float(np.mean(ious))
            extra["box_parse_rate"] = parsed / len(ious)
        extra.update(preds.refusal_extra())
        return TaskResult(float(per.mean()) if len(per) else 0.0, per, extra, preds)


def _rerender(sample: Sample, question: str, given: Sequence[Sequence[float]] | None) -> str:
    """The region question about the (moved) box; questions that give no box stay as they are."""
    template = sample.meta.get("template")
    if not given or not isinstance(template, str) or "{box}" not in template:
        return question
    return template.format(box=format_box(given[0]))
