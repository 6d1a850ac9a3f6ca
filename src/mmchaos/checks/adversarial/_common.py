"""What the adversarial checks share: the samples they attack, judging images through the target's
public API (on the driver or, from its :class:`JudgeState`, on a worker), grouping images by shape,
eps labels, images as JSON values, model time for torch work, and the worst-case evidence."""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from mmchaos.attacks.gradient import EPS_MAX, EPS_MIN
from mmchaos.attacks.query import QueryBudget
from mmchaos.checks.evidence import image_artifact, safe_name
from mmchaos.data.base import Dataset
from mmchaos.errors import TargetCallError
from mmchaos.findings import Artifact
from mmchaos.targets.base import Capability, Target
from mmchaos.tasks.ocr_metrics import cer

if TYPE_CHECKING:
    from mmchaos.checks.base import CheckContext
    from mmchaos.executors import Worker

__all__ = [
    "AttackSet",
    "Judge",
    "JudgeState",
    "SampledPlan",
    "attack_set",
    "batches",
    "by_shape",
    "decode_image",
    "encode_image",
    "eps_label",
    "eps_values",
    "sampled",
    "worst_records",
]


ImageArray = npt.NDArray[np.uint8]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


def eps_values(v: list[float]) -> list[float]:
    """Eps given in grey levels (1..16, i.e. k/255), sorted and unique."""
    if not v or any(not EPS_MIN * 255 - 1e-6 <= e <= EPS_MAX * 255 + 1e-6 for e in v):
        raise ValueError("eps values are grey levels in [1, 16] (eps = level / 255)")
    return sorted(set(float(e) for e in v))


def eps_label(level: float) -> str:
    return f"{level:g}/255"


def by_shape(images: Sequence[ImageArray]) -> list[list[int]]:
    """Indices of same-shape images, in first-seen order (attacks batch one shape at a time)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, image in enumerate(images):
        groups.setdefault(tuple(np.asarray(image).shape), []).append(i)
    return list(groups.values())


def batches(groups: list[list[int]], size: int) -> list[list[int]]:
    """Same-shape groups cut into batches of at most ``size`` (the attack batches, in a fixed order)."""
    return [group[s : s + size] for group in groups for s in range(0, len(group), size)]


@dataclass(frozen=True)
class AttackSet:
    """The samples an adversarial check attacks: drawn once on the driver, named by position.

    ``indices`` are positions in the run's dataset (a worker rebuilds ``data`` from them);
    ``clean`` the decoded images (empty when the set has none); ``kind`` the image task a
    :class:`Judge` would score (None: none fits the target and data).
    """

    indices: tuple[int, ...]
    data: Dataset
    clean: list[ImageArray]
    kind: str | None


def sampled(ctx: CheckContext, samples: int, *, cap: bool = True) -> tuple[tuple[int, ...], Dataset]:
    """The seeded, label-stratified sample of ``samples`` items (capped by the run's max_samples when
    ``cap``): its positions in the run's dataset (what a worker rebuilds it from) and the sample itself."""
    n = min(ctx.max_samples or samples, samples) if cap else samples
    full = ctx.dataset
    indices = tuple(range(len(full))) if n >= len(full) else tuple(full.sample_indices(n, ctx.seed))
    return indices, full.sample(n, ctx.seed)


def attack_set(ctx: CheckContext, samples: int, *, cap: bool = True) -> AttackSet:
    """:func:`sampled`, its clean images and the judge task that fits it: the image attacks' preamble."""
    indices, data = sampled(ctx, samples, cap=cap)
    clean = [s.load_image() for s in data] if data.has_images else []
    return AttackSet(indices, data, clean, Judge.choose(ctx.target, data))


@dataclass(frozen=True)
class SampledPlan:
    """Base of the attack checks' unit plans (sent once per map): the run seed, the check, and the
    attacked samples as positions in the run's dataset, from which a worker rebuilds the set."""

    check_id: str
    seed: int
    indices: tuple[int, ...]

    @property
    def key(self) -> str:
        """Names what a worker memoises for this plan (the set, a text cache, the image path)."""
        words = f"{type(self).__name__}|{self.check_id}|{self.seed}|{self.indices}"
        return hashlib.sha256(words.encode()).hexdigest()[:16]

    def data(self, worker: Worker) -> Dataset:
        """The attacked samples, selected once per worker."""
        return worker.memo(f"{self.key}/data", lambda: worker.dataset.select(self.indices))


def encode_image(image: ImageArray) -> dict[str, Any]:
    """A uint8 image as JSON values (a unit result in the run store), exact bytes."""
    a = np.ascontiguousarray(image, dtype=np.uint8)
    return {"shape": list(a.shape), "z": base64.b64encode(zlib.compress(a.tobytes(), 6)).decode("ascii")}


def decode_image(body: dict[str, Any]) -> ImageArray:
    raw = zlib.decompress(base64.b64decode(body["z"]))
    out: ImageArray = np.frombuffer(raw, dtype=np.uint8).reshape(tuple(body["shape"])).copy()
    return out


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


def flip_cases(data: Dataset, flip_at: dict[int, float], n: int) -> list[dict[str, Any]]:
    """The ``n`` samples flipped at the smallest eps, as worst-case records."""
    cases = []
    for i in sorted(flip_at, key=lambda i: (flip_at[i], i))[:n]:
        lv = flip_at[i]
        truth = data[i].label or data[i].caption or data[i].text
        cases.append({"sample": data[i].id, "index": i, "eps_255": lv, "label": f"eps {eps_label(lv)}",
                      "severity": eps_label(lv), "truth": truth})  # fmt: skip
    return cases


def worst_records(
    check_id: str,
    data: Dataset,
    cases: list[dict[str, Any]],
    clean: Sequence[ImageArray],
    adv_at: dict[float, dict[int, ImageArray]],
) -> list[Artifact]:
    """Clean and adversarial PNGs (and their 8x amplified difference) for each case; the case dicts
    get the artifact names the HTML report shows."""
    artifacts: list[Artifact] = []
    for rank, case in enumerate(cases, 1):
        i = int(case["index"])
        adv = adv_at[case["eps_255"]][i]
        stem = safe_name(f"{check_id}-worst{rank:02d}-eps{case['eps_255']:g}-{data[i].id}")
        diff = np.clip(127 + 8 * (adv.astype(np.int16) - clean[i].astype(np.int16)), 0, 255).astype(np.uint8)
        case["rank"] = rank
        case["clean_artifact"] = f"{stem}-clean.png"
        case["perturbed_artifact"] = f"{stem}-adversarial.png"
        case["difference_artifact"] = f"{stem}-difference-x8.png"
        artifacts += [
            image_artifact(case["clean_artifact"], np.ascontiguousarray(clean[i])),
            image_artifact(case["perturbed_artifact"], adv),
            image_artifact(case["difference_artifact"], diff),
        ]
    return artifacts
