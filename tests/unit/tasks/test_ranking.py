"""Retrieval's ranking metrics: mAP and nDCG@10 beside recall@k (issue 25, item 8), ranked in
blocks of queries so a large gallery does not grow memory (issue 23)."""

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


class _RandomTarget(Target):
    """Sample ``i`` (pixel 0's first two values) embeds as row ``i`` of one random table, its image
    and its caption alike plus noise: a large gallery with real, varied rankings."""

    capabilities = frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT})

    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(1)
        self._image = rng.normal(size=(n, 16)).astype(np.float32)
        self._text = self._image + rng.normal(scale=2.0, size=(n, 16)).astype(np.float32)

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return self._image[[int(i[0, 0, 0]) * 256 + int(i[0, 0, 1]) for i in images]]

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        return self._text[[int(t.split()[-1]) for t in texts]]

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(weights="random-table")


def _gallery(n: int) -> Dataset:
    samples = []
    for i in range(n):
        image = np.zeros((2, 2, 3), np.uint8)
        image[0, 0, :2] = divmod(i, 256)
        samples.append(Sample(f"s{i}", image=image, caption=f"item {i}", label=f"c{i % 7}"))
    return Dataset("gallery", samples)


@pytest.mark.parametrize("task", [TextToImageRetrieval, ImageToTextRetrieval])
def test_a_gallery_ranked_in_blocks_gives_the_one_matrix_numbers(
    task: type[TextToImageRetrieval] | type[ImageToTextRetrieval],
) -> None:
    n = 600  # 600 x 600 similarities: three blocks of 200 queries
    data, target = _gallery(n), _RandomTarget(n)
    got = task(batch_size=64).evaluate(target, data)
    img, txt = (v / np.linalg.norm(v, axis=1, keepdims=True) for v in (target._image, target._text))
    queries, gallery = (txt, img) if task.query == "text" else (img, txt)
    sim = queries @ gallery.T
    codes = np.arange(n) % 7
    relevant = codes[None, :] == codes[:, None]
    ranks = (sim > sim[np.arange(n), np.arange(n)][:, None]).sum(axis=1)
    assert got.metric == pytest.approx(float((ranks < 1).mean()))
    assert got.extra["mean_rank"] == pytest.approx(float(ranks.mean() + 1))
    assert got.extra["mAP"] == pytest.approx(float(average_precision(sim, relevant).mean()))
    assert got.extra["ndcg@10"] == pytest.approx(float(ndcg_at(sim, relevant, 10).mean()))
    assert got.per_sample == pytest.approx(1.0 / (1.0 + ranks))


def test_ranking_a_shard_in_a_large_gallery_holds_bounded_memory() -> None:
    """A sweep's shard of 64 queries ranks each in the whole gallery: 20,000 items is 1.28 M
    similarities, whose sort would take about 50 MB at once; in blocks it stays near 5 MB (the
    robustness sweep's memory stays flat from 100 to 10,000 samples: benchmarks/sweep_scale.py)."""
    import tracemalloc

    n = 20_000
    data, target = _gallery(n), _RandomTarget(n)
    task = TextToImageRetrieval(batch_size=256)
    task.evaluate_shard(target, data, list(range(64)))  # the clean gallery's embeddings, cached
    tracemalloc.start()
    try:
        result = task.evaluate_shard(target, data, list(range(64, 128)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(result.per_sample) == 64
    assert peak < 16 * 2**20, f"ranking 64 queries in {n:,} items peaked at {peak / 2**20:.1f} MiB"
