"""Judging attacked images through the target's public API only, booking every query.

The judge of the image attacks: zero-shot accuracy (labels), retrieval recall@1 (captions) or an
unchanged OCR read (transcriptions). What it computes once on the driver (reference embeddings,
truths, clean reads) travels to workers as a :class:`JudgeState`, so a worker judges without
asking the target for them again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from mmchaos.attacks.plan import ImageArray
from mmchaos.attacks.query import QueryBudget
from mmchaos.data.base import Dataset
from mmchaos.errors import TargetCallError
from mmchaos.targets.base import Capability, Target
from mmchaos.tasks.ocr_metrics import cer

__all__ = ["Judge", "JudgeState"]

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class JudgeState:
    """What a :class:`Judge` computed on the driver (reference embeddings, truths, clean reads), so
    a worker judges with it without asking the target for them again (no extra queries)."""

    kind: str
    refs: npt.NDArray[np.float32] | None
    truth: tuple[int, ...]
    clean_reads: tuple[str, ...]


def _unit(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    out: npt.NDArray[np.float32] = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
    return out


_METRICS = {"zero_shot": "accuracy", "retrieval": "recall@1", "ocr": "unchanged read"}


class Judge:
    """Scores images of a dataset through the target's public API only, booking queries.

    ``kind`` is ``zero_shot`` (labels), ``retrieval`` (captions) or ``ocr`` (transcriptions).
    Margins are below 0 exactly where the answer is wrong: the true class loses, the own caption
    is not the nearest, or the text read differs from the clean read.
    """

    def __init__(
        self,
        target: Target,
        data: Dataset,
        *,
        batch_size: int = 32,
        budget: QueryBudget | None = None,
        state: JudgeState | None = None,
    ) -> None:
        self.target = target
        self.data = data
        self.batch_size = batch_size
        self.budget = budget
        self.clean_reads: list[str] = []
        self.refs: npt.NDArray[np.float32] | None = None
        self.truth: npt.NDArray[np.int64] = np.arange(len(data))
        self.kind: str
        if state is not None:  # rebuilt on a worker: nothing to ask the target
            self.kind = state.kind
            self.metric = _METRICS[self.kind]
            self.refs, self.clean_reads = state.refs, list(state.clean_reads)
            self.truth = np.asarray(state.truth, dtype=np.int64)
            return
        kind = self.choose(target, data)
        if kind is None:
            raise TargetCallError("no image task fits this target and dataset", code="attack_no_task")
        self.kind = kind
        self.metric = _METRICS[self.kind]
        if self.kind == "zero_shot":
            prompts = [data.prompt_template.format(c) for c in data.classes]
            self.refs = _unit(self._call(target.embed_texts, prompts))
            index = {c: i for i, c in enumerate(data.classes)}
            self.truth = np.array([index[s.label or ""] for s in data], dtype=np.int64)
        elif self.kind == "retrieval":
            self.refs = _unit(self._call(target.embed_texts, [s.caption or "" for s in data]))
        else:
            self.clean_reads = self._read([s.load_image() for s in data])

    def state(self) -> JudgeState:
        """What a worker needs to judge as this judge does (see :class:`JudgeState`)."""
        return JudgeState(self.kind, self.refs, tuple(int(t) for t in self.truth), tuple(self.clean_reads))

    @staticmethod
    def choose(target: Target, data: Dataset) -> str | None:
        if not data.has_images:
            return None
        if target.has(Capability.EMBED_IMAGE, Capability.EMBED_TEXT):
            if data.has_labels and len(data.classes) > 1:
                return "zero_shot"
            if data.has_captions and len(data) > 1:
                return "retrieval"
        if target.has(Capability.READ_TEXT):
            return "ocr"
        return None

    def _book(self, n: int, book: bool = True) -> None:
        if book and self.budget is not None and not self.budget.take(n):
            raise TargetCallError(
                f"the query budget is spent ({self.budget.used}/{self.budget.max_queries})", code="attack_budget_spent"
            )

    def _call(self, fn: Callable[[Any], Any], items: Sequence[Any], book: bool = True) -> npt.NDArray[np.float32]:
        parts = []
        for i in range(0, len(items), self.batch_size):
            chunk = list(items[i : i + self.batch_size])
            self._book(len(chunk), book)
            parts.append(np.asarray(fn(chunk), dtype=np.float32))
        return np.concatenate(parts, axis=0)

    def _read(self, images: Sequence[ImageArray], book: bool = True) -> list[str]:
        out: list[str] = []
        for i in range(0, len(images), self.batch_size):
            chunk = list(images[i : i + self.batch_size])
            self._book(len(chunk), book)
            out += list(self.target.read_text(chunk))
        return out

    def margins(self, images: Sequence[ImageArray], idx: Sequence[int], book: bool = True) -> FloatArray:
        """Per image (of dataset items ``idx``): how far from a wrong answer; < 0 = wrong.

        ``book=False`` where the caller has booked the queries already (the square attack does).
        """
        if self.kind == "ocr":
            reads = self._read(images, book)
            pairs = zip(reads, idx, strict=True)
            kept = [1.0 if r == self.clean_reads[i] else -max(cer(r, self.clean_reads[i]), 1e-3) for r, i in pairs]
            return np.array(kept, dtype=np.float64)
        assert self.refs is not None
        emb = _unit(self._call(self.target.embed_images, images, book))
        sims = emb @ self.refs.T
        rows = np.arange(len(idx))
        own = self.truth[np.asarray(idx, dtype=np.int64)]
        true = sims[rows, own].copy()
        sims[rows, own] = -np.inf
        out: FloatArray = (true - sims.max(axis=1)).astype(np.float64)
        return out

    def scorer(self, idx: Sequence[int]) -> Callable[[Sequence[ImageArray], Sequence[int]], FloatArray]:
        """A black-box score function for an attack on the images of dataset items ``idx``: the
        attack passes the positions (in ``idx``) of the images it sends, and books them itself."""
        return lambda images, positions: self.margins(images, [idx[p] for p in positions], book=False)

    def correct(self, images: Sequence[ImageArray], idx: Sequence[int]) -> BoolArray:
        return self.margins(images, idx) >= 0

    def outputs(self, images: Sequence[ImageArray], idx: Sequence[int]) -> list[str]:
        """The answers (class, caption index, or text read) for evidence."""
        if self.kind == "ocr":
            return self._read(images)
        assert self.refs is not None
        best = (_unit(self._call(self.target.embed_images, images)) @ self.refs.T).argmax(axis=1)
        if self.kind == "zero_shot":
            return [self.data.classes[int(b)] for b in best]
        return [self.data[int(b)].caption or "" for b in best]
