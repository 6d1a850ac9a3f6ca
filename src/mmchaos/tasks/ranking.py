"""Ranking metrics of retrieval: average precision and nDCG@k over a query x gallery similarity matrix.

Recall@k asks only where one paired item lands. A deployment that ranks every *other* right answer
low (a gallery of five captions per image, or of every image of the query's class) keeps recall@1
and loses mean average precision; nDCG@k weighs the top of the list the way a search page is read.
Ties in similarity are broken by gallery order, so the numbers are deterministic.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["average_precision", "ndcg_at", "ranking_metrics"]

Floats = npt.NDArray[np.float64]


def _order(sim: npt.NDArray[np.floating], relevant: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """Each row's relevance flags in ranked order (descending similarity, stable on ties)."""
    order = np.argsort(-sim, axis=1, kind="stable")
    return np.take_along_axis(relevant, order, axis=1)


def average_precision(sim: npt.NDArray[np.floating], relevant: npt.NDArray[np.bool_]) -> Floats:
    """Per query (row): the mean of precision@k over the ranks k of its relevant gallery items.

    A query with no relevant item scores 0 (it cannot be answered, and counting it as perfect would
    hide a gallery that lost its items).
    """
    return _average_precision(_order(sim, relevant))


def ndcg_at(sim: npt.NDArray[np.floating], relevant: npt.NDArray[np.bool_], k: int = 10) -> Floats:
    """Per query: DCG of its top ``k`` (binary gains, log2 discount) over the best achievable DCG."""
    return _ndcg(_order(sim, relevant), relevant.sum(axis=1), k)


def ranking_metrics(
    sim: npt.NDArray[np.floating], relevant: npt.NDArray[np.bool_], k: int = 10
) -> tuple[Floats, Floats]:
    """(average precision, nDCG@k) per query, from one ranking of each row: the sort is most of
    their cost, and a retrieval sweep asks for both on every shard."""
    ranked = _order(sim, relevant)
    return _average_precision(ranked), _ndcg(ranked, relevant.sum(axis=1), k)


def _average_precision(ranked: npt.NDArray[np.bool_]) -> Floats:
    hits = np.cumsum(ranked, axis=1)
    positions = np.arange(1, ranked.shape[1] + 1)
    precision_at_hits = np.where(ranked, hits / positions, 0.0)
    n_relevant = ranked.sum(axis=1)
    out: Floats = np.divide(
        precision_at_hits.sum(axis=1), n_relevant, out=np.zeros(len(ranked)), where=n_relevant > 0
    ).astype(np.float64)
    return out


def _ndcg(ranked: npt.NDArray[np.bool_], n_relevant: npt.NDArray[np.integer], k: int) -> Floats:
    top = ranked[:, :k].astype(np.float64)
    discount = 1.0 / np.log2(np.arange(2, top.shape[1] + 2))
    dcg = top @ discount
    n_ideal = np.minimum(n_relevant, top.shape[1])
    ideal = np.concatenate([[0.0], np.cumsum(discount)])[n_ideal]
    out: Floats = np.divide(dcg, ideal, out=np.zeros(len(top)), where=ideal > 0).astype(np.float64)
    return out
