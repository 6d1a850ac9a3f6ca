"""Step 2: the task metric under the perturbation catalog, against the clean metric.

For every selected perturbation (by name and/or group) and severity: the task metric, its drop
and the relative robustness ``quality(perturbed) / quality(clean)``. One finding per perturbation,
gated on the relative robustness at the lower severities; then one summary finding with the
relative robustness per group, a single robustness score (its definition is
:data:`SCORE_DEFINITION`, written into the finding), and the worst cases of the whole sweep saved
with clean and perturbed inputs side by side.

Sensitivity probes (negation, attribute swap, caption mismatch) change the meaning on purpose:
for them the check measures whether the model *notices* (prefers the true caption over the
changed one) and gates that instead; they stay out of the score.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import Field, field_validator, model_validator

from mmchaos import perturb, tasks
from mmchaos.checks.base import Check, CheckContext, Gate, Params, seeded_rng
from mmchaos.checks.evidence import image_artifact, safe_name
from mmchaos.checks.robustness.sweep import (
    ShardResult,
    SweepPlan,
    Unit,
    UnitFailure,
    clean_inputs,
    decode,
    encode,
    largest_drops,
    run_unit,
    texts_of,
)
from mmchaos.data.base import Dataset
from mmchaos.findings import Artifact, Finding, Severity, Step, Verdict
from mmchaos.perturb.base import (
    Applied,
    BindContext,
    Modality,
    MultimodalPerturbation,
    MultimodalSample,
    Perturbation,
    TextPerturbation,
)
from mmchaos.targets.base import Capability, Target
from mmchaos.tasks.base import Task, TaskResult

__all__ = ["SCORE_DEFINITION", "Robustness", "RobustnessGate", "RobustnessParams"]

SCORE_DEFINITION = (
    "MMI-style relative robustness (MMRobustness, Qiu et al. 2022), not mCE (no baseline model): "
    "r(p, s) = Q(perturbed by p at severity s) / Q(clean), where Q is the task metric made "
    "higher-is-better in [0, 1] (accuracy, recall@1, 1 - CER) and r is capped at 1 so that an "
    "improvement does not offset a drop; group robustness = mean of r over the group's "
    "perturbations and severities; score = mean over groups (each group weighs the same); "
    "MMI = 1 - score, the mean relative drop. Sensitivity probes and the missing-modality sweep (which "
    "judges the samples left intact) are not in the score."
)

SAMPLING = "seeded by the run seed, stratified by label (each label its share), in dataset order"

_BOTH = frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT})


class RobustnessParams(Params):
    perturbations: list[str] | None = Field(
        None, description="perturbations by name; with `groups` the union; neither: the whole catalog"
    )
    groups: list[str] | None = Field(None, description="perturbation groups (noise, blur, weather, ...)")
    exclude: list[str] = Field(default_factory=list, description="names removed from the selection")
    severities: list[int] = Field(default_factory=lambda: [1, 2, 3, 4, 5])
    samples: int = Field(256, ge=1, description="samples of the dataset used: a seeded sample stratified by label")
    batch_size: int = Field(64, ge=1)
    shard_size: int = Field(
        64, ge=1, description="samples per work unit: a worker holds one shard's inputs, never the whole set"
    )
    worst_cases: int = Field(10, ge=0, description="worst cases of the sweep saved with clean/perturbed images")
    worst_per_perturbation: int = Field(3, ge=0, description="worst samples recorded (params only) per perturbation")
    meaning_kept: float | None = Field(
        None, ge=0.0, le=1.0, description="text draws must keep this sentence similarity (MMRobustness: 0.9)"
    )
    image_task: str | None = Field(None, description="task for image perturbations; default by target")
    text_task: str | None = Field(None, description="task for text perturbations; default by target")
    multimodal_task: str | None = Field(None, description="task for multimodal perturbations; default by target")
    transient_retries: int = Field(
        2, ge=0, le=10, description="runs again of a work unit whose endpoint failed (5xx, reset, timeout)"
    )
    max_failed_units: int = Field(
        3, ge=0, description="units failing on every try before the sweep stops (the endpoint keeps failing)"
    )

    @field_validator("severities")
    @classmethod
    def _severities(cls, v: list[int]) -> list[int]:
        if not v or any(s not in (1, 2, 3, 4, 5) for s in v):
            raise ValueError("severities must be a non-empty list of values in 1-5")
        return sorted(set(v))

    @field_validator("image_task", "text_task", "multimodal_task")
    @classmethod
    def _task(cls, v: str | None) -> str | None:
        if v is not None:
            tasks.REGISTRY.get(v)  # raises UnknownNameError with close matches
        return v

    @model_validator(mode="after")
    def _selection(self) -> RobustnessParams:
        if not self.selected():
            raise ValueError("the selection of perturbations is empty")
        return self

    def selected(self) -> list[str]:
        """The perturbations to sweep, in catalog order (raises on unknown names or groups)."""
        return perturb.select(self.perturbations, self.groups, self.exclude)


class RobustnessGate(Gate):
    min_relative: float = Field(
        0.5, ge=0.0, le=1.0, description="perturbed/clean task quality must stay at or above this"
    )
    up_to_severity: int = Field(3, ge=1, le=5, description="severities above this are reported, not gated")
    min_discrimination: float = Field(
        0.6, ge=0.0, le=1.0, description="sensitivity probes: share of samples where the model prefers the truth"
    )
    min_score: float | None = Field(None, ge=0.0, le=1.0, description="the robustness score must reach this")
    min_clean_score: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="the clean task metric must reach this (default: chance on labelled data, or what the built-in "
        "model's score says on built-in data; 0 turns it off)",
    )


@dataclass
class _Case:
    """A candidate worst case: one sample under one perturbation at one severity (replayed for evidence)."""

    drop: float
    perturbation: str
    group: str
    severity: int
    index: int
    clean_score: float
    perturbed_score: float
    params: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Outcome:
    name: str
    group: str
    relative: dict[int, float]
    in_score: bool = True


@dataclass
class _Job:
    """One perturbation of the sweep: its task (None for a sensitivity probe) and its units."""

    pert: Perturbation[Any]
    task: str | None
    units: list[Unit]


@dataclass
class _Sweep:
    """What the driver knows of a run: the sampled set, its shards, and the plan units share."""

    data: Dataset
    plan: SweepPlan
    shards: list[tuple[int, int]]
    bind: BindContext


class Robustness(Check[RobustnessParams, RobustnessGate]):
    """Degradation of the task metric under the perturbation catalog, per perturbation and severity."""

    name = "robustness"
    step = Step.ROBUSTNESS
    requires = (
        frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT}),
        frozenset({Capability.READ_TEXT}),
        frozenset({Capability.GENERATE}),
    )
    parallel_units = True  # its perturbation x severity x shard units are independent and model-bound

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        sweep = self._prepare(ctx)
        constraint: dict[str, Any] | None = None  # as the workers applied it
        jobs, skipped = self._plan_jobs(ctx, sweep)
        clean_tasks = list(dict.fromkeys(j.task for j in jobs if j.task is not None and not j.pert.expects_change))
        clean_units = [Unit("clean", a, b, task=t) for t in clean_tasks for a, b in sweep.shards]
        units = clean_units + [u for j in jobs for u in j.units]
        bar = ctx.progress.task(f"{ctx.check_id}: perturbations", total=len(units))
        outcomes: list[_Outcome] = []
        cases: list[_Case] = []
        retried: list[str] = []  # the endpoint's transient failures, each run again and recovered
        failed: dict[str, list[str]] = {}  # what could not be measured: its errors
        stopped = False
        try:
            results = ctx.map_units(run_unit, sweep.plan, units, keys=[u.key for u in units], encode=encode,
                                    decode=decode)  # fmt: skip

            def take(n: int, clean_of: TaskResult | None = None, units: list[Unit] | None = None) -> list[Any]:
                out = []
                for k in range(n):
                    r = next(results)
                    if clean_of is not None and units is not None and isinstance(r, ShardResult):
                        u = units[k]  # only the worst cases' parameters stay on the driver
                        r.keep_params_of_largest_drops(clean_of.per_sample[u.start : u.stop], keep_n)
                    out.append(r)
                bar.advance(n)
                return out

            def arrive(
                n: int, clean_of: TaskResult | None = None, units: list[Unit] | None = None
            ) -> tuple[list[Any], list[str]]:
                """n results, and the errors of those that failed on every try (counted)."""
                parts = take(n, clean_of, units)
                errors = [e for r in parts if isinstance(r, UnitFailure) for e in r.errors[-1:]]
                units_failed[0] += len(errors)
                retried.extend(e for r in parts if not isinstance(r, UnitFailure) for e in r.retried)
                return parts, errors

            units_failed = [0]
            keep_n = max(p.worst_cases, p.worst_per_perturbation)
            clean: dict[str, tuple[Task, TaskResult]] = {}
            clean_failed: dict[str, list[str]] = {}
            for name in clean_tasks:
                task = tasks.REGISTRY.get(name)(batch_size=p.batch_size)
                parts, errors = arrive(len(sweep.shards))
                if errors:
                    clean_failed[name] = errors
                else:
                    clean[name] = (task, task.combine(sweep.data, [r.result for r in parts]))
                    floor = self._floor(ctx, sweep.data, name, task, clean[name][1])
                    if floor is not None:
                        yield floor
            for job in jobs:
                if units_failed[0] > p.max_failed_units:
                    stopped = True
                    failed.setdefault(job.pert.name, [])
                    continue
                baseline = clean.get(job.task) if job.task is not None else None
                parts, errors = arrive(len(job.units), baseline[1] if baseline else None, job.units)
                if job.task in clean_failed:
                    errors = [f"the clean baseline ({job.task}): {e}" for e in clean_failed[job.task]] + errors
                if errors:
                    failed[job.pert.name] = errors
                    yield self._unmeasured(ctx, job.pert, errors, len(job.units))
                    continue
                if job.task is None:
                    yield self._with_retries(self._sensitivity(ctx, sweep, job.pert, parts), parts)
                    continue
                task, clean_result = clean[job.task]
                finding, outcome, found = self._sweep(ctx, sweep, job.pert, task, clean_result, parts)
                constraint = finding.evidence.get("meaning_constraint", constraint)
                outcomes.append(outcome)
                cases += found
                yield self._with_retries(finding, parts)
            results.close()  # every unit is in (or the sweep stopped): the workers' caches can go
        finally:
            bar.close()
        if stopped:
            names = [n for n, e in failed.items() if not e]
            yield self.finding(
                ctx, Verdict.ERROR,
                f"the endpoint kept failing: the sweep stopped after {units_failed[0]} work units failed on "
                f"every try; {len(names)} perturbation(s) not measured",
                severity=Severity.HIGH, gate=f"at most {p.max_failed_units} work units fail on every try",
                message=f"not measured: {', '.join(names)}",
                evidence={"not_measured": names, "units_failed": units_failed[0]},
                suggestion="the endpoint fails again and again, not now and then: check its health and logs",
            )  # fmt: skip
        for why, names in skipped.items():
            yield self.finding(
                ctx,
                Verdict.SKIPPED,
                f"{len(names)} perturbation(s) skipped: {why}",
                message=f"{why}: {', '.join(names)}",
                evidence={"perturbations": names, "reason": why},
            )
        if any(o.in_score for o in outcomes):
            summary = self._summary(ctx, sweep, outcomes, cases, skipped, constraint)
            summary.metrics["endpoint_retries"] = float(len(retried))
            if failed:
                summary.evidence["not_measured"] = sorted(failed)
            yield summary

    def _unmeasured(self, ctx: CheckContext, pert: Perturbation[Any], errors: list[str], units: int) -> Finding:
        """A perturbation whose work units failed on every try: an error for it alone, the sweep goes on."""
        p = self.params
        return self.finding(
            ctx, Verdict.ERROR,
            f"{pert.name}: not measured: the endpoint failed on {len(errors)} of {units} work units, "
            f"{p.transient_retries + 1} tries each",
            severity=Severity.MEDIUM, gate="every work unit answered within its retries",
            message="; ".join(dict.fromkeys(errors))[:600],
            evidence={"perturbation": pert.name, "group": pert.group, "errors": errors[:10],
                      "tries_per_unit": p.transient_retries + 1},
            suggestion="the endpoint failed on these inputs every time: look for them in its logs",
        )  # fmt: skip

    @staticmethod
    def _with_retries(finding: Finding, parts: list[Any]) -> Finding:
        """Count in the finding the transient endpoint failures its units recovered from."""
        errors = [e for r in parts for e in r.retried]
        if errors:
            finding.metrics["endpoint_retries"] = float(len(errors))
            finding.evidence["endpoint_retries"] = errors[:10]
            finding.message = (finding.message + "; " if finding.message else "") + (
                f"{len(errors)} transient endpoint failure(s) retried: {errors[0][:160]}"
            )
        return finding

    def _floor(self, ctx: CheckContext, data: Dataset, name: str, task: Task, clean: TaskResult) -> Finding | None:
        """A clean score under its absolute floor fails: relative gates measured from it prove nothing."""
        from mmchaos.tasks.floors import default_floor

        given = self.gate.min_clean_score
        floor, why = (
            (given, "the suite's min_clean_score") if given is not None else (default_floor(name, data) or (None, ""))
        )
        if floor is None or not task.higher_is_better or given == 0:
            return None
        chance = why.startswith("chance")
        below = clean.metric <= floor if chance else clean.metric < floor
        verdict = Verdict.FAIL if below else Verdict.PASS
        return self.finding(
            ctx, verdict,
            f"clean {name} {clean.metric:.3f} {'is under' if below else 'reaches'} its floor {floor:.3f} ({why})",
            severity=Severity.HIGH if below else Severity.INFO,
            metrics={"clean": clean.metric, "floor": floor},
            evidence={"task": name, "floor_from": why},
            message="every relative gate below is measured from this clean score" if below else "",
            suggestion="the pipeline is broken before any perturbation: check channel order, normalisation, "
            "the weights loaded (reference_parity with --reference names which)" if below else "",
        )  # fmt: skip

    # --- planning (on the driver: no image is loaded here) ---------------------------------------

    def _prepare(self, ctx: CheckContext) -> _Sweep:
        """The seeded, label-stratified sample of the dataset, cut into shards."""
        p = self.params
        indices = ctx.dataset.sample_indices(p.samples, ctx.seed)
        data = ctx.dataset.select(indices)
        plan = SweepPlan(
            ctx.check_id,
            ctx.seed,
            tuple(indices),
            p.batch_size,
            _text_field(data, ctx.target),
            p.meaning_kept,
            p.transient_retries,
        )
        shards = [(a, min(a + p.shard_size, len(data))) for a in range(0, len(data), p.shard_size)]
        bind = BindContext(target=ctx.target, labels=tuple(data.classes), prompt_template=data.prompt_template)
        return _Sweep(data, plan, shards, bind)

    def _plan_jobs(self, ctx: CheckContext, sweep: _Sweep) -> tuple[list[_Job], dict[str, list[str]]]:
        """The perturbations that run (with their units) and those skipped, by reason."""
        p = self.params
        jobs: list[_Job] = []
        skipped: dict[str, list[str]] = {}
        for name in p.selected():
            pert: Perturbation[Any] = perturb.get(name).bind(sweep.bind)
            why = self._why_not(pert, sweep.data, sweep.plan.text_field)
            task_name = None
            if why is None and pert.expects_change:
                if not (ctx.target.has(*_BOTH) and sweep.data.has_images and sweep.plan.text_field):
                    why = "sensitivity probes need a target that embeds images and texts, and captioned images"
            elif why is None:
                task_name = self._task_for(pert, ctx.target, sweep.data, sweep.plan.text_field)
                if task_name is None:
                    why = f"no task scores {pert.modality.value} perturbations on this target and dataset"
            if why is not None:
                skipped.setdefault(why, []).append(name)
                continue
            if pert.expects_change:
                sevs = tuple(p.severities)
                units = [Unit("probe", a, b, perturbation=name, severities=sevs) for a, b in sweep.shards]
            else:
                # Shard-major within the perturbation: a worker decodes a shard once for all severities.
                units = [
                    Unit("perturbed", a, b, task=task_name, perturbation=name, severity=sev)
                    for a, b in sweep.shards
                    for sev in p.severities
                ]
            jobs.append(_Job(pert, task_name, units))
        return jobs, skipped

    @staticmethod
    def _why_not(pert: Perturbation[Any], data: Dataset, text_field: str | None) -> str | None:
        """Why the perturbation cannot run on this dataset, or None when it can."""
        if pert.modality == Modality.IMAGE:
            return None if data.has_images else "the dataset has no images"
        if pert.modality == Modality.TEXT:
            return None if text_field else "the dataset has no captions or questions"
        assert isinstance(pert, MultimodalPerturbation)
        fields = {
            "image": data.has_images,
            "text": text_field is not None,
            "frames": all("frames" in s.meta for s in data),
            "boxes": all("boxes" in s.meta for s in data),
        }
        if not len(data) or not all(fields.get(f, False) for f in pert.needs):
            return f"the dataset carries no {'/'.join(sorted(pert.needs))} for multimodal perturbations"
        return None

    def _task_for(self, pert: Perturbation[Any], target: Target, data: Dataset, text_field: str | None) -> str | None:
        p = self.params
        explicit = {Modality.IMAGE: p.image_task, Modality.TEXT: p.text_task, Modality.MULTIMODAL: p.multimodal_task}
        chosen = explicit[pert.modality]
        if chosen is not None:
            return chosen if tasks.REGISTRY.get(chosen).supports(target, data) else None
        if pert.modality != Modality.MULTIMODAL:
            return tasks.default_task(pert.modality.value, target, data)
        sequence = sorted(pert.needs & {"frames", "boxes"}) if isinstance(pert, MultimodalPerturbation) else []
        if sequence:  # scored by a task that reads frame sequences or boxes
            return tasks.default_task(sequence[0], target, data)
        if text_field is not None and tasks.REGISTRY.get("retrieval_i2t").supports(target, data):
            return "retrieval_i2t"  # scores the pair: images against captions, both perturbed
        return tasks.default_task("image", target, data)

    # --- invariance sweep (aggregated as the units arrive, one severity at a time) ----------------

    def _sweep(
        self,
        ctx: CheckContext,
        sweep: _Sweep,
        pert: Perturbation[Any],
        task: Task,
        clean: TaskResult,
        arrived: list[ShardResult],
    ) -> tuple[Finding, _Outcome, list[_Case]]:
        p = self.params
        g = self.gate
        data = sweep.data
        clean_quality = task.quality(clean.metric)
        metrics: dict[str, float] = {"clean": clean.metric}
        best: dict[int, _Case] = {}  # per sample: its largest drop, at the lowest severity (bounded)
        keep_n = max(p.worst_cases, p.worst_per_perturbation)
        constraint = None
        for k, sev in enumerate(p.severities):
            parts = arrived[k :: len(p.severities)]
            constraint = next((r.constraint for r in reversed(parts) if r.constraint is not None), constraint)
            result = task.combine(data, [r.result for r in parts])
            params = [prm for r in parts for prm in r.params]
            quality = task.quality(result.metric)
            rel = quality / clean_quality if clean_quality > 0 else (1.0 if quality >= clean_quality else 0.0)
            metrics[f"s{sev}"] = result.metric
            metrics[f"drop_s{sev}"] = (clean.metric - result.metric) * (1 if task.higher_is_better else -1)
            metrics[f"relative_s{sev}"] = rel
            for key, value in result.extra.items():
                metrics[f"{key}_s{sev}"] = value
            if pert.removes_content:
                # Hit items have lost a modality: no model keeps their scores. What must hold is
                # that the items left intact keep theirs (one blank input must not poison its batch).
                hit = [h for r in parts for h in r.hit]
                intact = [i for i, h in enumerate(hit) if not h]
                metrics[f"intact_s{sev}"] = float(len(intact))
                if intact:
                    base = float(np.mean(clean.per_sample[intact]))
                    now = float(np.mean(result.per_sample[intact]))
                    metrics[f"intact_relative_s{sev}"] = now / base if base > 0 else 1.0
            _collect(best, keep_n, pert, sev, clean, result, params)
        key = "intact_relative_s{}" if pert.removes_content else "relative_s{}"
        rels = {s: metrics[key.format(s)] for s in p.severities if key.format(s) in metrics}
        gated = [s for s in rels if s <= g.up_to_severity]
        metrics["mean_relative"] = float(np.mean(list(rels.values()))) if rels else 1.0
        if gated:
            metrics["min_relative_gated"] = min(rels[s] for s in gated)
        broken = [s for s in gated if rels[s] < g.min_relative]
        ranked = sorted(best.values(), key=lambda c: (-c.drop, c.severity, c.index))
        evidence = {
            "perturbation": pert.name,
            "group": pert.group,
            "source": pert.source,
            "task": task.name,
            "metric": task.metric_name,
            "higher_is_better": task.higher_is_better,
            "samples": len(data),
            "dataset": data.source or data.name,
            "seed": ctx.seed,
            "severities": list(p.severities),
            "shard_size": p.shard_size,
            "worst_samples": [self._case_record(c, sweep) for c in ranked[: p.worst_per_perturbation]],
        }
        gate_text = f"relative {task.metric_name} >= {g.min_relative} at severities <= {g.up_to_severity}"
        if pert.removes_content:
            gate_text = f"intact samples keep >= {g.min_relative} of their clean {task.metric_name}"
            evidence["scored"] = "intact samples only (the hit ones lost a modality); not in the score"
        if constraint is not None:
            evidence["meaning_constraint"] = constraint
        outcome = _Outcome(pert.name, pert.group, rels, in_score=not pert.removes_content)
        keep = ranked[:keep_n]
        if broken:
            first = min(broken)
            severity = Severity.HIGH if first == 1 else Severity.MEDIUM if first == 2 else Severity.LOW
            finding = self.finding(
                ctx,
                Verdict.FAIL,
                f"{pert.name}: {task.metric_name} falls to {rels[first]:.0%} of clean at severity {first}",
                severity=severity,
                metrics=metrics,
                gate=gate_text,
                message=f"{task.metric_name} {clean.metric:.3f} clean -> {metrics[f's{first}']:.3f} "
                f"at severity {first}",
                suggestion=_SUGGEST.get(pert.group, "augment training or preprocessing for this perturbation"),
                evidence=evidence,
            )
            return finding, outcome, keep
        finding = self.finding(
            ctx,
            Verdict.PASS,
            f"{pert.name}: {task.metric_name} keeps >= {g.min_relative:.0%} of clean up to severity {g.up_to_severity}",
            metrics=metrics,
            gate=gate_text,
            message=f"{task.metric_name} {clean.metric:.3f} clean, mean relative {metrics['mean_relative']:.2f}",
            evidence=evidence,
        )
        return finding, outcome, keep

    @staticmethod
    def _case_record(case: _Case, sweep: _Sweep) -> dict[str, Any]:
        sample = sweep.data[case.index]
        return {
            "perturbation": case.perturbation,
            "group": case.group,
            "sample": sample.id,
            "index": sweep.plan.indices[case.index],  # in the run's dataset, for replay
            "severity": case.severity,
            "clean_score": case.clean_score,
            "perturbed_score": case.perturbed_score,
            "drop": round(case.drop, 6),
            "params": case.params,
            "truth": sample.label or sample.text or sample.answer or sample.caption,
            **case.extra,
        }

    # --- sensitivity probes ----------------------------------------------------------------------

    def _sensitivity(self, ctx: CheckContext, sweep: _Sweep, pert: Perturbation[Any], parts: list[Any]) -> Finding:
        """Does the model prefer the true caption over the changed one? (higher is better)"""
        p = self.params
        g = self.gate
        data = sweep.data
        metrics: dict[str, float] = {}
        first_sev = min(p.severities)
        candidates: list[tuple[float, int, dict[str, Any]]] = []
        for sev in p.severities:
            entries = [r.by_severity[sev] for r in parts]
            true_sim = np.asarray([v for e in entries for v in e["true_sim"]], dtype=np.float64)
            changed_sim = np.asarray([v for e in entries for v in e["changed_sim"]], dtype=np.float64)
            if len(true_sim):
                noticed = changed_sim < true_sim
                metrics[f"s{sev}"] = float(noticed.mean())
                metrics[f"margin_s{sev}"] = float((true_sim - changed_sim).mean())
                if sev == first_sev:
                    for e in entries:
                        for i, t, c, text, prm in zip(
                            e["positions"], e["true_sim"], e["changed_sim"], e["texts"], e["params"], strict=True
                        ):
                            if c >= t:  # not noticed
                                candidates.append((c - t, i, {"text": text, "params": prm, "true": t, "changed": c}))
            metrics[f"changed_s{sev}"] = float(len(true_sim))
        worst: list[dict[str, Any]] = []
        for _, i, c in sorted(candidates, key=lambda x: (-x[0], x[1]))[: p.worst_per_perturbation]:
            worst.append({
                "sample": data[i].id, "index": sweep.plan.indices[i], "severity": first_sev, "params": c["params"],
                "clean_text": texts_of(data, [i], sweep.plan.text_field)[0], "perturbed_text": c["text"],
                "true_similarity": c["true"], "changed_similarity": c["changed"],
            })  # fmt: skip
        measured = [s for s in p.severities if f"s{s}" in metrics]
        gated = [s for s in measured if s <= g.up_to_severity]
        evidence = {
            "perturbation": pert.name,
            "group": pert.group,
            "source": pert.source,
            "probe": "sensitivity",
            "metric": "discrimination",
            "definition": "share of changed samples whose image is more similar to the true caption than to "
            "the changed one",
            "samples": len(data),
            "seed": ctx.seed,
            "probe_severities": list(p.severities),
            "shard_size": p.shard_size,
            "worst_samples": worst,
        }
        gate_text = f"discrimination >= {g.min_discrimination} at severities <= {g.up_to_severity}"
        if not measured:
            return self.finding(
                ctx, Verdict.SKIPPED, f"{pert.name}: no caption could be changed", message="no eligible words",
                evidence=evidence, metrics=metrics,
            )  # fmt: skip
        metrics["mean_discrimination"] = float(np.mean([metrics[f"s{s}"] for s in measured]))
        broken = [s for s in gated if metrics[f"s{s}"] < g.min_discrimination]
        if broken:
            first = min(broken)
            return self.finding(
                ctx,
                Verdict.FAIL,
                f"{pert.name}: the model notices the change in only {metrics[f's{first}']:.0%} of samples "
                f"at severity {first}",
                severity=Severity.MEDIUM,
                metrics=metrics,
                gate=gate_text,
                message=f"{pert.name} changes what the caption means, yet the image matches the changed caption "
                f"as well as the true one in {1 - metrics[f's{first}']:.0%} of samples",
                suggestion=_SUGGEST_SENSITIVITY.get(pert.name, "train with hard negatives of this kind"),
                evidence=evidence,
            )
        return self.finding(
            ctx,
            Verdict.PASS,
            f"{pert.name}: the model notices the change in >= {g.min_discrimination:.0%} of samples",
            metrics=metrics,
            gate=gate_text,
            message=f"mean discrimination {metrics['mean_discrimination']:.2f}",
            evidence=evidence,
        )

    # --- summary ---------------------------------------------------------------------------------

    def _summary(
        self,
        ctx: CheckContext,
        sweep: _Sweep,
        outcomes: list[_Outcome],
        cases: list[_Case],
        skipped: dict[str, list[str]],
        constraint: dict[str, Any] | None,
    ) -> Finding:
        p = self.params
        g = self.gate
        by_group: dict[str, list[float]] = {}
        per_perturbation: dict[str, float] = {}
        for o in outcomes:
            if not o.in_score:
                continue
            capped = [min(1.0, r) for r in o.relative.values()]
            by_group.setdefault(o.group, []).extend(capped)
            per_perturbation[o.name] = round(float(np.mean(capped)), 6)
        groups = {name: float(np.mean(values)) for name, values in by_group.items()}
        score = float(np.mean(list(groups.values())))
        metrics = {"score": score, "mmi": 1.0 - score, "perturbations": float(len(per_perturbation))}
        metrics.update({f"group_{name}": value for name, value in groups.items()})
        worst, artifacts = self._worst(ctx, sweep, cases)
        evidence: dict[str, Any] = {
            "perturbation": "whole sweep",
            "metric": "per-sample score drop",
            "score": "mmi",
            "score_definition": SCORE_DEFINITION,
            "groups": {name: round(v, 6) for name, v in groups.items()},
            "per_perturbation": per_perturbation,
            "severities": list(p.severities),
            "samples": len(sweep.data),
            "sampling": SAMPLING,
            "shard_size": p.shard_size,
            "seed": ctx.seed,
            "skipped": {why: names for why, names in skipped.items()},
            "worst_cases": worst,
        }
        if constraint is not None:
            evidence["meaning_constraint"] = constraint
        weakest = min(groups, key=lambda k: groups[k])
        title = (
            f"robustness score {score:.2f} (MMI {1 - score:.1%} mean relative drop) over {len(per_perturbation)} "
            f"perturbations in {len(groups)} groups; weakest: {weakest} {groups[weakest]:.2f}"
        )
        message = SCORE_DEFINITION
        if g.min_score is not None and score < g.min_score:
            return self.finding(
                ctx, Verdict.FAIL, title, severity=Severity.MEDIUM, metrics=metrics,
                gate=f"robustness score >= {g.min_score}", message=message, evidence=evidence, artifacts=artifacts,
                suggestion=_SUGGEST.get(weakest, "augment training for the weakest group"),
            )  # fmt: skip
        gate = f"robustness score >= {g.min_score}" if g.min_score is not None else "reported, not gated"
        return self.finding(
            ctx, Verdict.PASS, title, metrics=metrics, gate=gate, message=message, evidence=evidence,
            artifacts=artifacts,
        )  # fmt: skip

    def _worst(
        self, ctx: CheckContext, sweep: _Sweep, cases: list[_Case]
    ) -> tuple[list[dict[str, Any]], list[Artifact]]:
        """The largest per-sample drops of the sweep (at most two per perturbation), with evidence.

        The perturbed inputs were not kept: each chosen case is replayed from its recorded
        parameters, which gives the same bytes the model saw.
        """
        p = self.params
        data = sweep.data
        chosen: list[_Case] = []
        per_pert: dict[str, int] = {}
        for case in sorted(cases, key=lambda c: (-c.drop, c.severity, c.perturbation, c.index)):
            if len(chosen) >= p.worst_cases:
                break
            if per_pert.get(case.perturbation, 0) >= 2:
                continue
            per_pert[case.perturbation] = per_pert.get(case.perturbation, 0) + 1
            chosen.append(case)
        records, artifacts = [], []
        for rank, case in enumerate(chosen, 1):
            record = self._case_record(case, sweep)
            record["rank"] = rank
            clean_image = data[case.index].load_image() if data.has_images else None
            clean_text = texts_of(data, [case.index], sweep.plan.text_field)[0] if sweep.plan.text_field else None
            perturbed_image, perturbed_text = _split(_replay(sweep, case))
            if clean_image is not None and perturbed_image is not None:
                stem = safe_name(
                    f"{ctx.check_id}-worst{rank:02d}-{case.perturbation}-s{case.severity}-{data[case.index].id}"
                )
                record["clean_artifact"] = f"{stem}-clean.png"
                record["perturbed_artifact"] = f"{stem}-perturbed.png"
                record["side_by_side_artifact"] = f"{stem}-side-by-side.png"
                artifacts += [
                    image_artifact(record["clean_artifact"], clean_image),
                    image_artifact(record["perturbed_artifact"], _rgb(perturbed_image)),
                    image_artifact(record["side_by_side_artifact"], side_by_side(clean_image, perturbed_image)),
                ]
            if perturbed_text is not None:
                record["clean_text"] = clean_text
                record["perturbed_text"] = perturbed_text
            records.append(record)
        return records, artifacts


def _collect(
    best: dict[int, _Case],
    keep_n: int,
    pert: Perturbation[Any],
    severity: int,
    clean: TaskResult,
    result: TaskResult,
    params: list[dict[str, Any] | None],
) -> None:
    """Offer this severity's largest drops (at most ``keep_n``) to the per-sample best cases."""
    drop = clean.per_sample - result.per_sample
    for found in largest_drops(drop, keep_n):
        i = int(found)
        if i in best and best[i].drop >= drop[i]:
            continue
        drawn = params[i]
        assert drawn is not None, "a shard dropped the parameters of one of its largest drops"
        extra: dict[str, Any] = {}
        if clean.outputs:
            extra["clean_output"] = clean.outputs[i]
        if result.outputs:
            extra["perturbed_output"] = result.outputs[i]
        best[i] = _Case(
            float(drop[i]), pert.name, pert.group, severity, i, float(clean.per_sample[i]),
            float(result.per_sample[i]), drawn, extra,
        )  # fmt: skip


def _replay(sweep: _Sweep, case: _Case) -> Any:
    """The perturbed input of a case, rebuilt from the clean sample and the recorded parameters.

    A perturbation that samples a batch as a whole (``sample_batch`` overridden: OCR ghosting
    copies the previous item of the batch in) cannot be replayed from one item: its parameters
    point into the batch the unit perturbed. For those the case's shard is perturbed again, with
    the unit's own seed, and the case's item is taken from it (the same bytes the unit scored).
    """
    pert: Perturbation[Any] = perturb.get(case.perturbation).bind(sweep.bind)
    data, field_ = sweep.data, sweep.plan.text_field
    if _samples_whole_batches(pert):
        start, stop = next((a, b) for a, b in sweep.shards if a <= case.index < b)
        shard = clean_inputs(pert, data, list(range(start, stop)), field_)
        rng = seeded_rng(sweep.plan.seed, sweep.plan.check_id, pert.name, case.severity, start)
        perturbed, _ = pert(shard, case.severity, rng=rng)
        return perturbed[case.index - start]
    item = clean_inputs(pert, data, [case.index], field_)[0]
    return pert.replay([item], Applied(case.perturbation, case.severity, (case.params,)))[0]


_ITEMWISE_BASES: tuple[type, ...] = (Perturbation, TextPerturbation)


def _samples_whole_batches(pert: Perturbation[Any]) -> bool:
    """Whether the perturbation's parameters for an item depend on the rest of its batch."""
    own = type(pert).sample_batch
    return not any(own is getattr(base, "sample_batch", None) for base in _ITEMWISE_BASES)


def _text_field(data: Dataset, target: Target) -> str | None:
    """Where text perturbations find their text: a VQA set's questions for a generative target that
    does not embed texts (what it reads is the question), else the captions, else the questions."""
    if data.has_questions and target.has(Capability.GENERATE) and not target.has(Capability.EMBED_TEXT):
        return "question"
    if data.has_captions:
        return "caption"
    return "question" if data.has_questions else None


def _texts(data: Dataset, target: Target) -> list[str]:
    """The texts text perturbations work on, over the whole of ``data`` (see :func:`_text_field`)."""
    return texts_of(data, list(range(len(data))), _text_field(data, target))


def _split(perturbed: Any) -> tuple[Any, str | None]:
    if isinstance(perturbed, MultimodalSample):
        return perturbed.image, perturbed.text
    if isinstance(perturbed, str):
        return None, perturbed
    return perturbed, None


def _rgb(image: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    if image.ndim == 2:
        return np.repeat(image[..., None], 3, axis=2)
    if image.shape[2] == 1:
        return np.repeat(image, 3, axis=2)
    return np.ascontiguousarray(image[..., :3])


def side_by_side(clean: npt.NDArray[np.uint8], perturbed: npt.NDArray[np.uint8], gap: int = 4) -> npt.NDArray[np.uint8]:
    """Clean (left) and perturbed (right) on one white canvas, top-aligned."""
    a, b = _rgb(clean), _rgb(perturbed)
    h = max(a.shape[0], b.shape[0])
    canvas = np.full((h, a.shape[1] + gap + b.shape[1], 3), 255, np.uint8)
    canvas[: a.shape[0], : a.shape[1]] = a
    canvas[: b.shape[0], a.shape[1] + gap :] = b
    return canvas


_SUGGEST = {
    "noise": "add noise augmentation in training, or denoise before the encoder",
    "blur": "add blur augmentation; reject images below a sharpness threshold at the gateway",
    "weather": "augment with weather and lens effects (fog, frost, snow, over-exposure)",
    "digital": "avoid re-encoding at low JPEG quality in the upload path; augment with compression and resampling",
    "deployment": "fix the serving path (EXIF, colour order, resize chain) and augment with camera/occlusion effects",
    "typographic": "CLIP-style models read text in images: mask rendered text, or train with typographic negatives",
    "text-char": "normalise text (NFKC, confusables, zero-width, whitespace) before tokenising; augment with typos",
    "text-word": "augment captions with paraphrases and word-order changes; check truncation at the context limit",
    "multimodal": "detect a missing or blank modality before inference and answer it explicitly",
}
_SUGGEST_SENSITIVITY = {
    "negation": "CLIP-style encoders ignore negation: do not rely on negated prompts, or fine-tune with negated "
    "hard negatives",
    "attribute_swap": "train with attribute-swapped hard negatives (colour/shape/position binding)",
    "caption_mismatch": "add an image-text agreement check (similarity threshold) before trusting a pair",
}
