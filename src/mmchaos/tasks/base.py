"""How a target is scored on a dataset: a task turns outputs into one metric and per-sample scores.

Per-sample scores are in [0, 1], higher is better, so checks can rank worst cases the same way
for every task. ``images``/``texts`` passed to :meth:`Task.evaluate` replace the dataset's clean
ones (that is how perturbed inputs are scored against clean labels); ``frames``/``boxes`` passed to
:meth:`Task.evaluate_multimodal` replace the samples' ``meta["frames"]``/``meta["boxes"]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt

from mmchaos.data.base import Dataset
from mmchaos.targets.base import Capability, Target

__all__ = ["Task", "TaskResult", "batched", "l2_normalise"]

FloatArray = npt.NDArray[np.float32]
ImageArray = npt.NDArray[np.uint8]
In = TypeVar("In")


@dataclass
class TaskResult:
    metric: float
    per_sample: npt.NDArray[np.float64]
    extra: dict[str, float] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)


class Task:
    """Base class of tasks; subclasses name their metric and implement ``evaluate``."""

    name: ClassVar[str] = ""
    metric_name: ClassVar[str] = ""
    higher_is_better: ClassVar[bool] = True
    requires: ClassVar[frozenset[Capability]] = frozenset()

    def __init__(self, batch_size: int = 64) -> None:
        self.batch_size = batch_size

    @classmethod
    def supports(cls, target: Target, dataset: Dataset) -> bool:
        return target.has(*cls.requires)

    def setup(self, target: Target, dataset: Dataset) -> None:
        """Precompute what does not change between clean and perturbed runs."""

    def evaluate(
        self,
        target: Target,
        dataset: Dataset,
        images: Sequence[ImageArray] | None = None,
        texts: Sequence[str] | None = None,
    ) -> TaskResult:
        raise NotImplementedError

    def evaluate_multimodal(
        self,
        target: Target,
        dataset: Dataset,
        images: Sequence[ImageArray] | None = None,
        texts: Sequence[str] | None = None,
        frames: Sequence[Sequence[ImageArray] | None] | None = None,
        boxes: Sequence[Sequence[Sequence[float]] | None] | None = None,
    ) -> TaskResult:
        """Score perturbed multimodal samples; tasks that read frame sequences or input boxes
        override this, the others score the images and texts and ignore ``frames``/``boxes``."""
        return self.evaluate(target, dataset, images=images, texts=texts)

    def evaluate_shard(
        self,
        target: Target,
        dataset: Dataset,
        indices: Sequence[int],
        images: Sequence[ImageArray] | None = None,
        texts: Sequence[str] | None = None,
    ) -> TaskResult:
        """Score the samples ``dataset[indices]`` only; ``images``/``texts`` replace their clean inputs.

        Sweeps call this one shard at a time, so memory holds a shard, not the set. A task whose
        per-sample score depends on the other samples (retrieval ranks against the whole set)
        overrides it; the default scores the shard as a dataset of its own.
        """
        return self.evaluate(target, dataset.select(indices), images, texts)

    def combine(self, dataset: Dataset, parts: Sequence[TaskResult]) -> TaskResult:
        """The result over ``dataset`` from the results of its consecutive shards, in order.

        The default weighs each part's metric and extras by its size, which is exact for means over
        samples; a corpus-level metric (CER) overrides it and recomputes from the outputs.
        """
        per_sample = np.concatenate([p.per_sample for p in parts]) if parts else np.zeros(0, np.float64)
        sizes = [len(p.per_sample) for p in parts]
        total = max(1, sum(sizes))
        metric = float(sum(p.metric * n for p, n in zip(parts, sizes, strict=True)) / total)
        keys = [k for k in parts[0].extra if all(k in p.extra for p in parts)] if parts else []
        extra = {k: float(sum(p.extra[k] * n for p, n in zip(parts, sizes, strict=True)) / total) for k in keys}
        return TaskResult(metric, per_sample, extra, [o for p in parts for o in p.outputs])

    def quality(self, metric: float) -> float:
        """The metric mapped to 'higher is better' in [0, 1], for relative robustness."""
        return metric if self.higher_is_better else max(0.0, 1.0 - metric)


def batched(fn: Callable[[Sequence[In]], Any], items: Sequence[In], batch_size: int) -> list[Any]:
    """Call ``fn`` on consecutive slices of ``items`` and collect the results in order."""
    return [fn(items[i : i + batch_size]) for i in range(0, len(items), batch_size)]


def l2_normalise(x: FloatArray) -> FloatArray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    out: FloatArray = (x / np.maximum(norms, np.float32(1e-12))).astype(np.float32)
    return out


def embed(target: Target, method: str, items: Sequence[Any], batch_size: int) -> FloatArray:
    parts = batched(getattr(target, method), items, batch_size)
    out = np.concatenate([np.asarray(p, dtype=np.float32) for p in parts], axis=0)
    return l2_normalise(out)
