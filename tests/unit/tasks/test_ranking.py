"""Retrieval's ranking metrics: mAP and nDCG@10 beside recall@k (issue 25, item 8)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from mmchaos.data.base import Dataset, Sample
from mmchaos.targets.base import Capability, Fingerprint, Target
from mmchaos.tasks.embedding import ImageToTextRetrieval, TextToImageRetrieval
from mmchaos.tasks.ranking import average_precision, ndcg_at


def test_average_precision_and_ndcg_match_their_definitions() -> None:
    sim = np.array([[0.9, 0.8, 0.7, 0.1], [0.1, 0.2, 0.3, 0.4]])
    relevant = np.array([[True, False, True, False], [False, False, False, False]])
    ap = average_precision(sim, relevant)
    assert ap[0] == pytest.approx((1 / 1 + 2 / 3) / 2) and ap[1] == 0.0
    ndcg = ndcg_at(sim, relevant, k=10)
    assert ndcg[0] == pytest.approx((1 + 1 / np.log2(4)) / (1 + 1 / np.log2(3))) and ndcg[1] == 0.0
    top1 = ndcg_at(sim, relevant, k=1)
    assert top1[0] == 1.0


def test_ties_are_broken_by_gallery_order() -> None:
    sim = np.zeros((1, 3))
    assert average_precision(sim, np.array([[False, True, False]]))[0] == pytest.approx(0.5)


class _ClassTarget(Target):
    """Embeds images and captions by their class word (pixel 0's red value encodes the sample), plus,
    when ``pair_only``, a per-sample direction that makes each image match only its own caption."""

    capabilities = frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT})

    def __init__(self, pair_only: bool) -> None:
        self.pair_only = pair_only
        self._dirs = np.random.default_rng(0).normal(size=(8, 64))

    def _vec(self, cls: int, item: int) -> np.ndarray:
        base = np.zeros(64)
        base[cls] = 1.0
        return self._dirs[item] * 5 + base * 0.1 if self.pair_only else base

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return np.stack([self._vec(int(i[0, 0, 1]), int(i[0, 0, 0])) for i in images]).astype(np.float32)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self._vec(int(t.split()[1]), int(t.split()[3])) for t in texts]).astype(np.float32)

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(weights="class-target")


def _data() -> Dataset:
    samples = []
    for i in range(8):
        image = np.zeros((4, 4, 3), np.uint8)
        image[0, 0] = (i, i % 2, 0)
        samples.append(Sample(f"s{i}", image=image, caption=f"class {i % 2} item {i}", label=f"c{i % 2}"))
    return Dataset("pairs", samples)


@pytest.mark.parametrize("task", [TextToImageRetrieval, ImageToTextRetrieval])
def test_a_ranking_that_keeps_the_pair_and_buries_its_class_loses_map_not_recall(task: type) -> None:
    data = _data()
    clean = task(batch_size=4).evaluate(_ClassTarget(pair_only=False), data)
    assert clean.metric == 1.0 and clean.extra["mAP"] == 1.0 and clean.extra["ndcg@10"] == 1.0
    broken = task(batch_size=4).evaluate(_ClassTarget(pair_only=True), data)
    assert broken.metric == 1.0, "the pair still comes first"
    assert broken.extra["mAP"] < 0.8 and broken.extra["ndcg@10"] < 0.9


def test_shards_give_the_whole_set_s_ranking_metrics() -> None:
    data, target = _data(), _ClassTarget(pair_only=True)
    task = TextToImageRetrieval(batch_size=4)
    whole = task.evaluate(target, data)
    parts = [task.evaluate_shard(target, data, rows) for rows in ([0, 1, 2], [3, 4, 5, 6, 7])]
    combined = task.combine(data, parts)
    for key in ("mAP", "ndcg@10", "recall@5"):
        assert combined.extra[key] == pytest.approx(whole.extra[key])
