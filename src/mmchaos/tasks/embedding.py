"""Tasks for contrastive image-text targets: zero-shot classification and retrieval."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from mmchaos.data.base import Dataset
from mmchaos.errors import DataError
from mmchaos.targets.base import Capability, Target
from mmchaos.tasks.base import FloatArray, ImageArray, Task, TaskResult, embed
from mmchaos.tasks.ranking import average_precision, ndcg_at

__all__ = ["ImageToTextRetrieval", "TextToImageRetrieval", "ZeroShotClassification"]

_BOTH = frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT})


def _images(dataset: Dataset, images: Sequence[ImageArray] | None) -> Sequence[ImageArray]:
    return images if images is not None else dataset.images()


def _captions(dataset: Dataset, texts: Sequence[str] | None) -> Sequence[str]:
    return texts if texts is not None else [s.caption or "" for s in dataset]


class ZeroShotClassification(Task):
    """Accuracy of picking the right class prompt for each image."""

    name = "zero_shot"
    metric_name = "accuracy"
    requires = _BOTH

    def __init__(self, batch_size: int = 64) -> None:
        super().__init__(batch_size)
        self._class_emb: FloatArray | None = None
        self._class_index: dict[str, int] = {}

    @classmethod
    def supports(cls, target: Target, dataset: Dataset) -> bool:
        return super().supports(target, dataset) and dataset.has_labels and dataset.has_images

    def setup(self, target: Target, dataset: Dataset) -> None:
        if not dataset.classes:
            raise DataError("zero-shot classification needs class labels", code="data_no_labels")
        prompts = [dataset.prompt_template.format(c) for c in dataset.classes]
        self._class_emb = embed(target, "embed_texts", prompts, self.batch_size)
        self._class_index = {c: i for i, c in enumerate(dataset.classes)}

    def logits(self, target: Target, images: Sequence[ImageArray]) -> FloatArray:
        assert self._class_emb is not None, "setup() first"
        img = embed(target, "embed_images", images, self.batch_size)
        return img @ self._class_emb.T

    def evaluate(
        self,
        target: Target,
        dataset: Dataset,
        images: Sequence[ImageArray] | None = None,
        texts: Sequence[str] | None = None,
    ) -> TaskResult:
        if self._class_emb is None:
            self.setup(target, dataset)
        logits = self.logits(target, _images(dataset, images))
        truth = np.array([self._class_index[s.label or ""] for s in dataset])
        pred = logits.argmax(axis=1)
        correct = (pred == truth).astype(np.float64)
        # Per-sample score: softmax probability of the true class (temperature 100, CLIP's scale).
        z = 100.0 * (logits - logits.max(axis=1, keepdims=True))
        prob = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        score = prob[np.arange(len(truth)), truth].astype(np.float64)
        outputs = [dataset.classes[int(p)] for p in pred]
        return TaskResult(float(correct.mean()) if len(correct) else 0.0, score, {}, outputs)


class _Retrieval(Task):
    metric_name = "recall@1"
    requires = _BOTH
    query: str = "image"
    """The side whose items are the queries; the other side is the gallery they are ranked in."""

    def __init__(self, batch_size: int = 64) -> None:
        super().__init__(batch_size)
        self._clean: dict[str, FloatArray] = {}

    def embeddings(
        self, target: Target, dataset: Dataset, images: Sequence[ImageArray] | None, texts: Sequence[str] | None
    ) -> tuple[FloatArray, FloatArray]:
        """Image and caption embeddings; the clean side is computed once and cached."""
        if images is None:
            if "image" not in self._clean:
                self._clean["image"] = embed(target, "embed_images", _images(dataset, None), self.batch_size)
            img = self._clean["image"]
        else:
            img = embed(target, "embed_images", images, self.batch_size)
        if texts is None:
            if "text" not in self._clean:
                self._clean["text"] = embed(target, "embed_texts", _captions(dataset, None), self.batch_size)
            txt = self._clean["text"]
        else:
            txt = embed(target, "embed_texts", texts, self.batch_size)
        return img, txt

    @classmethod
    def supports(cls, target: Target, dataset: Dataset) -> bool:
        return super().supports(target, dataset) and dataset.has_captions and dataset.has_images

    def _similarity(
        self, target: Target, dataset: Dataset, images: Sequence[ImageArray] | None, texts: Sequence[str] | None
    ) -> npt.NDArray[np.float32]:
        raise NotImplementedError

    def evaluate(
        self,
        target: Target,
        dataset: Dataset,
        images: Sequence[ImageArray] | None = None,
        texts: Sequence[str] | None = None,
    ) -> TaskResult:
        sim = self._similarity(target, dataset, images, texts)
        return self._result(dataset, sim, np.arange(len(sim), dtype=np.int64))

    def evaluate_shard(
        self,
        target: Target,
        dataset: Dataset,
        indices: Sequence[int],
        images: Sequence[ImageArray] | None = None,
        texts: Sequence[str] | None = None,
    ) -> TaskResult:
        """Rank the shard's queries against the gallery of the whole set (clean embeddings cached).

        Where the gallery side is perturbed too, the shard's own gallery items are the perturbed
        ones and the rest of the set stays clean: each query still meets every sample as a
        distractor, while memory holds one shard of inputs.
        """
        img_all, txt_all = self.embeddings(target, dataset, None, None)
        rows = np.asarray(indices, dtype=np.int64)
        img = img_all[rows] if images is None else embed(target, "embed_images", images, self.batch_size)
        txt = txt_all[rows] if texts is None else embed(target, "embed_texts", texts, self.batch_size)
        queries, gallery, own = (img, txt_all, txt) if self.query == "image" else (txt, img_all, img)
        if (texts if self.query == "image" else images) is not None:
            gallery = gallery.copy()
            gallery[rows] = own
        return self._result(dataset, queries @ gallery.T, rows)

    def _result(self, dataset: Dataset, sim: npt.NDArray[np.float32], rows: npt.NDArray[np.int64]) -> TaskResult:
        """Scores of queries ``rows`` (each paired with gallery item ``rows[i]``) from their similarities.

        recall@k and the mean rank follow the paired item alone; mAP and nDCG@10 count every gallery
        item that shares the query's label as relevant (only the paired item where the set has no
        labels), so a ranking that keeps the pair first and buries the rest of the class shows.
        """
        ranks = (sim > sim[np.arange(len(rows)), rows][:, None]).sum(axis=1).astype(np.int64)
        labels = [s.label for s in dataset]
        if dataset.has_labels and all(label is not None for label in labels):
            codes = np.unique(np.asarray(labels, dtype=object).astype(str), return_inverse=True)[1]
            relevant = codes[None, :] == codes[rows][:, None]
        else:
            relevant = np.arange(sim.shape[1])[None, :] == rows[:, None]
        n = len(ranks)
        extra = {
            "recall@5": float((ranks < 5).mean()) if n else 0.0,
            "mean_rank": float(ranks.mean() + 1) if n else 0.0,
            "mAP": float(average_precision(sim, relevant).mean()) if n else 0.0,
            "ndcg@10": float(ndcg_at(sim, relevant, 10).mean()) if n else 0.0,
        }
        score = 1.0 / (1.0 + ranks.astype(np.float64))
        return TaskResult(float((ranks < 1).mean()) if n else 0.0, score, extra)


class TextToImageRetrieval(_Retrieval):
    """Recall@k of finding each caption's image among all images of the set."""

    name = "retrieval_t2i"
    query = "text"

    def _similarity(
        self, target: Target, dataset: Dataset, images: Sequence[ImageArray] | None, texts: Sequence[str] | None
    ) -> npt.NDArray[np.float32]:
        img, txt = self.embeddings(target, dataset, images, texts)
        return txt @ img.T


class ImageToTextRetrieval(_Retrieval):
    """Recall@k of finding each image's caption among all captions of the set."""

    name = "retrieval_i2t"

    def _similarity(
        self, target: Target, dataset: Dataset, images: Sequence[ImageArray] | None, texts: Sequence[str] | None
    ) -> npt.NDArray[np.float32]:
        img, txt = self.embeddings(target, dataset, images, texts)
        return img @ txt.T
