"""Tasks for contrastive image-text targets: zero-shot classification and retrieval."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from mmchaos.data.base import Dataset
from mmchaos.errors import DataError
from mmchaos.targets.base import Capability, Target
from mmchaos.tasks.base import FloatArray, ImageArray, Task, TaskResult, embed
from mmchaos.tasks.ranking import ranking_metrics

__all__ = ["ImageToTextRetrieval", "TextToImageRetrieval", "ZeroShotClassification"]

_BOTH = frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT})


RANKED_AT_ONCE = 1 << 17
"""Query x gallery similarities ranked in one block: retrieval over the whole gallery ranks every
gallery item for each query, and the sort's temporaries (about 40 bytes a similarity) would grow
with the set (25 MB a 64-query shard at 10,000 samples). Blocks of queries keep them near 5 MB."""


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

    def evaluate(
        self,
        target: Target,
        dataset: Dataset,
        images: Sequence[ImageArray] | None = None,
        texts: Sequence[str] | None = None,
    ) -> TaskResult:
        img, txt = self.embeddings(target, dataset, images, texts)
        queries, gallery = (img, txt) if self.query == "image" else (txt, img)
        return self._result(dataset, queries, gallery, np.arange(len(queries), dtype=np.int64))

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
        return self._result(dataset, queries, gallery, rows)

    def _result(
        self, dataset: Dataset, queries: FloatArray, gallery: FloatArray, rows: npt.NDArray[np.int64]
    ) -> TaskResult:
        """Scores of ``queries`` (query ``i`` paired with gallery item ``rows[i]``) ranked in ``gallery``.

        recall@k and the mean rank follow the paired item alone; mAP and nDCG@10 count every gallery
        item that shares the query's label as relevant (only the paired item where the set has no
        labels), so a ranking that keeps the pair first and buries the rest of the class shows.
        Queries are ranked in blocks of :data:`RANKED_AT_ONCE` similarities (one block where they
        fit: the same numbers as one matrix product), so memory does not grow with the gallery.
        """
        labels = [s.label for s in dataset]
        codes = None
        if dataset.has_labels and all(label is not None for label in labels):
            codes = np.unique(np.asarray(labels, dtype=object).astype(str), return_inverse=True)[1]
        n = len(rows)
        parts: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.float64]]] = []
        for block in np.array_split(np.arange(n), max(1, -(-n * len(gallery) // RANKED_AT_ONCE))):
            at = rows[block]
            sim = queries[block] @ gallery.T
            if codes is not None:
                relevant = codes[None, :] == codes[at][:, None]
            else:
                relevant = np.arange(sim.shape[1])[None, :] == at[:, None]
            paired = (sim > sim[np.arange(len(at)), at][:, None]).sum(axis=1).astype(np.int64)
            parts.append((paired, *ranking_metrics(sim, relevant, 10)))
        ranks, ap, ndcg = (np.concatenate(column) for column in zip(*parts, strict=True))
        extra = {
            "recall@5": float((ranks < 5).mean()) if n else 0.0,
            "mean_rank": float(ranks.mean() + 1) if n else 0.0,
            "mAP": float(ap.mean()) if n else 0.0,
            "ndcg@10": float(ndcg.mean()) if n else 0.0,
        }
        score = 1.0 / (1.0 + ranks.astype(np.float64))
        return TaskResult(float((ranks < 1).mean()) if n else 0.0, score, extra)


class TextToImageRetrieval(_Retrieval):
    """Recall@k of finding each caption's image among all images of the set."""

    name = "retrieval_t2i"
    query = "text"


class ImageToTextRetrieval(_Retrieval):
    """Recall@k of finding each image's caption among all captions of the set."""

    name = "retrieval_i2t"
