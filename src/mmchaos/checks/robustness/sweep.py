"""The work units of the robustness sweep, and the function that runs one on a worker.

A sweep is cut into units of one data shard each: *clean* (a task on clean inputs), *perturbed*
(one perturbation at one severity, then its task) and *probe* (a sensitivity probe at every
severity, sharing the shard's clean embeddings). A unit names its samples by position in the
sampled set, so it is a few small values that any worker can run: the worker loads only its
shard's images, and returns scores, outputs and the sampled parameters, never images. The
driver aggregates the results in unit order (see :mod:`mmchaos.checks.robustness.robustness`).

An endpoint's transient failure (one 5xx, reset or timeout in a sweep of thousands of requests, as a
proxy hop gives) does not end the sweep: the unit is run again, ``plan.transient_retries`` times at
most, the retries are recorded in its result, and a unit that still fails becomes a
:class:`UnitFailure` that the driver reports for its perturbation alone.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from mmchaos import perturb, tasks
from mmchaos.checks.base import seeded_rng
from mmchaos.data.base import Dataset
from mmchaos.executors import Worker
from mmchaos.perturb.base import (
    BindContext,
    Modality,
    MultimodalPerturbation,
    MultimodalSample,
    Perturbation,
    TextPerturbation,
)
from mmchaos.targets.openai_wire import EndpointError
from mmchaos.tasks.base import Task, TaskResult

__all__ = [
    "ProbeShard",
    "ShardResult",
    "SweepPlan",
    "Unit",
    "UnitFailure",
    "decode",
    "encode",
    "multimodal_item",
    "run_unit",
]


@dataclass(frozen=True)
class SweepPlan:
    """What every unit of one sweep shares; sent once to each worker."""

    check_id: str
    seed: int
    indices: tuple[int, ...]
    """The sampled samples, as positions in the run's dataset."""
    batch_size: int
    text_field: str | None
    """Where text perturbations find their text: ``caption``, ``question`` or nowhere."""
    meaning_kept: float | None = None
    transient_retries: int = 2
    """Runs again of a unit whose endpoint failed (5xx, reset, timeout) before it counts as failed."""

    @property
    def key(self) -> str:
        words = f"{self.check_id}|{self.seed}|{self.batch_size}|{self.text_field}|{self.meaning_kept}|{self.indices}"
        return hashlib.sha256(words.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Unit:
    """One shard ``[start, stop)`` of the sampled set under one piece of the sweep."""

    kind: str  # "clean" | "perturbed" | "probe"
    start: int
    stop: int
    task: str | None = None
    perturbation: str | None = None
    severity: int = 0
    severities: tuple[int, ...] = ()

    @property
    def key(self) -> str:
        """The unit's name in the run store's journal."""
        what = self.task if self.kind == "clean" else f"{self.perturbation}/{self.task}/s{self.severity}"
        if self.kind == "probe":
            what = f"{self.perturbation}/s{'-'.join(map(str, self.severities))}"
        return f"{self.kind}/{what}/{self.start}-{self.stop}"


def largest_drops(drop: npt.NDArray[np.float64], keep_n: int) -> npt.NDArray[np.intp]:
    """Positions of the ``keep_n`` largest positive drops: larger drop first, then lower position.
    One order for the sweep's worst cases and for what each shard keeps of them."""
    hurt = np.flatnonzero(drop > 1e-9)
    return hurt[np.lexsort((hurt, -drop[hurt]))][:keep_n]


@dataclass
class ShardResult:
    """A task's result on one shard, and what the perturbation drew for each of its samples."""

    result: TaskResult
    params: list[dict[str, Any] | None] = field(default_factory=list)
    """Per sample, what the perturbation drew; ``None`` once the driver knows it is not a worst case."""
    hit: list[bool] = field(default_factory=list)
    constraint: dict[str, Any] | None = None
    """The meaning-kept constraint as the worker applied it (or why it was skipped)."""
    retried: list[str] = field(default_factory=list)
    """The endpoint's transient failures this unit was run again after (empty: none)."""

    def keep_params_of_largest_drops(self, clean: npt.NDArray[np.float64], keep_n: int) -> None:
        """Forget what the perturbation drew for every sample that cannot be among its severity's
        ``keep_n`` largest drops (``None`` in its place).

        The driver holds a whole perturbation's shard results before it combines them, and the
        drawn parameters are most of their size (200-480 bytes a sample: noise seeds, typo edits):
        at 10,000 samples and two severities, ~9 MB for one text perturbation. Only the worst
        cases need them, and a sample among the ``keep_n`` largest drops of the whole sweep is
        among the ``keep_n`` largest of its own shard (the order is the same: larger drop first,
        then lower position), so what is kept here is a superset of what is asked for later.
        ``clean`` is the clean per-sample score of this shard's rows.
        """
        keep = set(largest_drops(clean - self.result.per_sample, keep_n).tolist())
        self.params = [prm if i in keep else None for i, prm in enumerate(self.params)]


@dataclass
class ProbeShard:
    """A sensitivity probe on one shard: per severity, the samples whose text changed."""

    by_severity: dict[int, dict[str, list[Any]]]
    """severity -> positions, true_sim, changed_sim, texts, params (lists over the changed samples)."""
    retried: list[str] = field(default_factory=list)


@dataclass
class UnitFailure:
    """A unit whose endpoint failed on every try: what it answered each time."""

    errors: list[str]


# --- the unit function (runs on a worker) -------------------------------------------------------


def run_unit(worker: Worker, plan: SweepPlan, unit: Unit) -> ShardResult | ProbeShard | UnitFailure:
    """Run one unit against the worker's target, again after an endpoint's transient failure."""
    errors: list[str] = []
    while True:
        try:
            result = _run_unit(worker, plan, unit)
        except EndpointError as exc:  # 5xx, reset, timeout, unreadable answer: the endpoint, not the input
            errors.append(f"{exc.code}: {str(exc)[:200]}")
            if len(errors) > plan.transient_retries:
                return UnitFailure(errors)
            time.sleep(min(2.0, 0.1 * 2 ** len(errors)))
            continue
        result.retried = errors
        return result


def _run_unit(worker: Worker, plan: SweepPlan, unit: Unit) -> ShardResult | ProbeShard:
    """Run one unit against the worker's target; only this shard's inputs are loaded."""
    data = _sampled(worker, plan)
    rows = list(range(unit.start, unit.stop))
    if unit.kind == "clean":
        assert unit.task is not None
        return ShardResult(_task(worker, plan, unit.task).evaluate_shard(worker.target, data, rows))
    assert unit.perturbation is not None
    pert = _perturbation(worker, plan, unit.perturbation)
    inputs = _shard_inputs(worker, plan, pert, data, unit)
    if unit.kind == "probe":
        return _probe(worker, plan, pert, data, rows, inputs, unit.severities)
    assert unit.task is not None
    task = _task(worker, plan, unit.task)
    rng = seeded_rng(plan.seed, plan.check_id, pert.name, unit.severity, unit.start)
    perturbed, applied = pert(inputs, unit.severity, rng=rng)
    result = _evaluate(task, worker, data, rows, pert, perturbed)
    hit = [pert.hit(prm) for prm in applied.items] if pert.removes_content else []
    constraint = None
    if plan.meaning_kept is not None and isinstance(pert, TextPerturbation):
        constraint = _constraint(worker, plan.meaning_kept).describe()
    return ShardResult(result, list(applied.items), hit, constraint)


def _sampled(worker: Worker, plan: SweepPlan) -> Dataset:
    return worker.memo(f"{plan.key}/data", lambda: worker.dataset.select(plan.indices))


def _task(worker: Worker, plan: SweepPlan, name: str) -> Task:
    def make() -> Task:
        task = tasks.REGISTRY.get(name)(batch_size=plan.batch_size)
        task.setup(worker.target, _sampled(worker, plan))
        return task

    return worker.memo(f"{plan.key}/task/{name}", make)


def _perturbation(worker: Worker, plan: SweepPlan, name: str) -> Perturbation[Any]:
    def make() -> Perturbation[Any]:
        data = _sampled(worker, plan)
        bind = BindContext(target=worker.target, labels=tuple(data.classes), prompt_template=data.prompt_template)
        pert: Perturbation[Any] = perturb.get(name).bind(bind)
        if plan.meaning_kept is not None and isinstance(pert, TextPerturbation):
            pert = pert.constrained(_constraint(worker, plan.meaning_kept))
        return pert

    return worker.memo(f"{plan.key}/perturbation/{name}", make)


def _constraint(worker: Worker, threshold: float) -> Any:
    from mmchaos.perturb.meaning import MeaningKept

    return worker.memo(f"meaning/{threshold}", lambda: MeaningKept(threshold))


def texts_of(data: Dataset, rows: list[int], text_field: str | None) -> list[str]:
    """The texts text perturbations work on, for ``rows`` of ``data``."""
    if text_field is None:
        return []
    return [getattr(data[i], text_field) or "" for i in rows]


def multimodal_item(data: Dataset, i: int, text_field: str | None) -> MultimodalSample:
    """Sample ``i`` as a multimodal item: its image (decoded now), text, frames and boxes."""
    s = data[i]
    return MultimodalSample(
        image=s.load_image() if data.has_images else None,
        text=getattr(s, text_field) or "" if text_field is not None else None,
        frames=tuple(s.meta["frames"]) if "frames" in s.meta else None,
        boxes=tuple(tuple(b) for b in s.meta["boxes"]) if "boxes" in s.meta else None,
    )


def _shard_inputs(worker: Worker, plan: SweepPlan, pert: Perturbation[Any], data: Dataset, unit: Unit) -> list[Any]:
    """The shard's clean inputs, decoded once for the consecutive units of one shard (one shard kept).

    Perturbations are pure (they return new items), so the severities of a shard share its inputs.
    """
    last: dict[tuple[str, int, int], list[Any]] = worker.memo(f"{plan.key}/inputs", dict)
    key = (pert.modality.value, unit.start, unit.stop)
    if key not in last:
        last.clear()  # memory holds one shard of inputs, not more
        last[key] = clean_inputs(pert, data, list(range(unit.start, unit.stop)), plan.text_field)
    return last[key]


def clean_inputs(pert: Perturbation[Any], data: Dataset, rows: list[int], text_field: str | None) -> list[Any]:
    """The clean items of ``rows`` in the form the perturbation takes (images, texts or multimodal items)."""
    if pert.modality == Modality.IMAGE:
        return [data[i].load_image() for i in rows]
    if pert.modality == Modality.TEXT:
        return texts_of(data, rows, text_field)
    return [multimodal_item(data, i, text_field) for i in rows]


def _evaluate(
    task: Task, worker: Worker, data: Dataset, rows: list[int], pert: Perturbation[Any], batch: list[Any]
) -> TaskResult:
    if pert.modality == Modality.IMAGE:
        return task.evaluate_shard(worker.target, data, rows, images=batch)
    if pert.modality == Modality.TEXT:
        return task.evaluate_shard(worker.target, data, rows, texts=batch)
    images = [s.image for s in batch] if batch[0].image is not None else None
    texts = [s.text if s.text is not None else "" for s in batch] if batch[0].text is not None else None
    needs = pert.needs if isinstance(pert, MultimodalPerturbation) else frozenset()
    if needs & {"frames", "boxes"}:  # frames and boxes are per-sample: the shard is a dataset of its own
        frames = [s.frames for s in batch] if "frames" in needs else None
        boxes = [s.boxes for s in batch] if "boxes" in needs else None
        shard = data.select(rows)
        return task.evaluate_multimodal(worker.target, shard, images=images, texts=texts, frames=frames, boxes=boxes)
    return task.evaluate_shard(worker.target, data, rows, images=images, texts=texts)


def _probe(
    worker: Worker,
    plan: SweepPlan,
    pert: Perturbation[Any],
    data: Dataset,
    rows: list[int],
    inputs: list[Any],
    severities: tuple[int, ...],
) -> ProbeShard:
    """Is each image closer to its true caption than to the changed one? (every severity)"""
    target = worker.target
    captions = texts_of(data, rows, plan.text_field)
    images = [data[i].load_image() for i in rows]
    image_emb = _unit(_embed(target.embed_images, images, plan.batch_size))
    caption_emb = _unit(_embed(target.embed_texts, captions, plan.batch_size))
    true_sim = (image_emb * caption_emb).sum(axis=1)
    out: dict[int, dict[str, list[Any]]] = {}
    for sev in severities:
        rng = seeded_rng(plan.seed, plan.check_id, pert.name, sev, rows[0] if rows else 0)
        perturbed, applied = pert(inputs, sev, rng=rng)
        texts = [(s.text or "") if isinstance(s, MultimodalSample) else str(s) for s in perturbed]
        changed = [j for j, t in enumerate(texts) if t != captions[j]]
        entry: dict[str, list[Any]] = {"positions": [], "true_sim": [], "changed_sim": [], "texts": [], "params": []}
        if changed:
            emb = _unit(_embed(target.embed_texts, [texts[j] for j in changed], plan.batch_size))
            changed_sim = (image_emb[changed] * emb).sum(axis=1)
            entry = {
                "positions": [rows[j] for j in changed],
                "true_sim": [float(true_sim[j]) for j in changed],
                "changed_sim": [float(v) for v in changed_sim],
                "texts": [texts[j] for j in changed],
                "params": [applied.items[j] for j in changed],
            }
        out[sev] = entry
    return ProbeShard(out)


def _embed(fn: Any, items: list[Any], batch: int) -> npt.NDArray[np.float32]:
    parts = [np.asarray(fn(items[i : i + batch]), dtype=np.float32) for i in range(0, len(items), batch)]
    return np.concatenate(parts, axis=0)


def _unit(x: Any) -> Any:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


# --- JSON codec (the run store's journal) -------------------------------------------------------


def encode(result: ShardResult | ProbeShard | UnitFailure) -> dict[str, Any]:
    """A unit result as JSON-able values (floats round-trip exactly)."""
    if isinstance(result, UnitFailure):
        return {"failed": list(result.errors)}
    if isinstance(result, ProbeShard):
        return {"probe": {str(k): v for k, v in result.by_severity.items()}, "retried": result.retried}
    r = result.result
    return {
        "retried": result.retried,
        "metric": float(r.metric),
        "per_sample": [float(v) for v in r.per_sample],
        "extra": {k: float(v) for k, v in r.extra.items()},
        "outputs": list(r.outputs),
        "params": result.params,
        "hit": [bool(h) for h in result.hit],
        "constraint": result.constraint,
    }


def decode(body: dict[str, Any]) -> ShardResult | ProbeShard | UnitFailure:
    if "failed" in body:
        return UnitFailure(list(body["failed"]))
    if "probe" in body:
        return ProbeShard({int(k): v for k, v in body["probe"].items()}, list(body.get("retried", [])))
    result = TaskResult(
        float(body["metric"]), np.asarray(body["per_sample"], dtype=np.float64), dict(body["extra"]),
        list(body["outputs"]),
    )  # fmt: skip
    return ShardResult(
        result, list(body["params"]), list(body["hit"]), body.get("constraint"), list(body.get("retried", []))
    )
