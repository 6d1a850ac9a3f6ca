"""Step 2: the task metric under severity-graded perturbations, against the clean metric."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from mmchaos import perturb, tasks
from mmchaos.checks.base import Check, CheckContext, Finding, Gate, Params, Severity, Step, Verdict
from mmchaos.checks.evidence import image_artifact, safe_name
from mmchaos.data.base import Dataset
from mmchaos.perturb.base import Applied, Modality, Perturbation
from mmchaos.targets.base import Capability, Target
from mmchaos.tasks.base import Task, TaskResult

__all__ = ["Robustness"]

DEFAULT_PERTURBATIONS = (
    "gaussian_noise",
    "shot_noise",
    "gaussian_blur",
    "jpeg_compression",
    "low_light",
    "block_occlusion",
    "keyboard_typo",
    "whitespace_insert",
    "homoglyph",
    "word_shuffle",
)


class RobustnessParams(Params):
    perturbations: list[str] = Field(default_factory=lambda: list(DEFAULT_PERTURBATIONS))
    severities: list[int] = Field(default_factory=lambda: [1, 2, 3, 4, 5])
    samples: int = Field(256, ge=1, description="samples of the dataset used (the first N)")
    batch_size: int = Field(64, ge=1)
    worst_cases: int = Field(3, ge=0, description="worst cases saved as evidence per perturbation")
    image_task: str | None = Field(None, description="task for image perturbations; default by target")
    text_task: str | None = Field(None, description="task for text perturbations; default by target")

    @field_validator("severities")
    @classmethod
    def _severities(cls, v: list[int]) -> list[int]:
        if not v or any(s not in (1, 2, 3, 4, 5) for s in v):
            raise ValueError("severities must be a non-empty list of values in 1-5")
        return sorted(set(v))

    @field_validator("perturbations")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        for name in v:
            perturb.REGISTRY.get(name)  # raises UnknownNameError with close matches
        return v


class RobustnessGate(Gate):
    min_relative: float = Field(
        0.5, ge=0.0, le=1.0, description="perturbed/clean task quality must stay at or above this"
    )
    up_to_severity: int = Field(3, ge=1, le=5, description="severities above this are reported, not gated")


class Robustness(Check):
    """Degradation curves of the task metric per perturbation and severity."""

    name = "robustness"
    step = Step.ROBUSTNESS
    requires = (
        frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT}),
        frozenset({Capability.READ_TEXT}),
    )
    Params = RobustnessParams
    Gate = RobustnessGate

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p: RobustnessParams = self.params  # type: ignore[assignment]
        data = ctx.dataset.head(p.samples)
        images = [s.load_image() for s in data] if data.has_images else []
        task_cache: dict[str, tuple[Task, TaskResult]] = {}
        bar = ctx.progress.task(f"{ctx.check_id}: perturbations", total=len(p.perturbations) * len(p.severities))
        try:
            for name in p.perturbations:
                pert = perturb.get(name)
                task_name = self._task_for(pert, ctx.target, data)
                if task_name is None:
                    bar.advance(len(p.severities))
                    yield self.finding(
                        ctx,
                        Verdict.SKIPPED,
                        f"{name}: no task scores {pert.modality} perturbations here",
                        message=f"target {ctx.target.uri} with dataset {data.name} has no task for "
                        f"{pert.modality} perturbations",
                        evidence={"perturbation": name},
                    )
                    continue
                if task_name not in task_cache:
                    task = tasks.REGISTRY.get(task_name)(batch_size=p.batch_size)
                    task.setup(ctx.target, data)
                    task_cache[task_name] = (task, task.evaluate(ctx.target, data))
                task, clean = task_cache[task_name]
                yield self._sweep(ctx, pert, task, clean, data, images, bar)
        finally:
            bar.close()

    def _task_for(self, pert: Perturbation[Any], target: Target, data: Dataset) -> str | None:
        p: RobustnessParams = self.params  # type: ignore[assignment]
        explicit = p.image_task if pert.modality == Modality.IMAGE else p.text_task
        if explicit is not None:
            return explicit if tasks.REGISTRY.get(explicit).supports(target, data) else None
        return tasks.default_task(pert.modality.value, target, data)

    def _sweep(
        self,
        ctx: CheckContext,
        pert: Perturbation[Any],
        task: Task,
        clean: TaskResult,
        data: Dataset,
        images: list[np.ndarray],
        bar: Any,
    ) -> Finding:
        p: RobustnessParams = self.params  # type: ignore[assignment]
        g: RobustnessGate = self.gate  # type: ignore[assignment]
        is_image = pert.modality == Modality.IMAGE
        clean_inputs: list[Any] = images if is_image else [s.caption or "" for s in data]
        clean_quality = task.quality(clean.metric)
        metrics: dict[str, float] = {"clean": clean.metric}
        runs: dict[int, tuple[list[Any], Applied, TaskResult]] = {}
        for sev in p.severities:
            perturbed, applied = pert(clean_inputs, sev, rng=ctx.rng(pert.name, sev))
            result = (
                task.evaluate(ctx.target, data, images=perturbed)
                if is_image
                else task.evaluate(ctx.target, data, texts=perturbed)
            )
            runs[sev] = (perturbed, applied, result)
            rel = task.quality(result.metric) / clean_quality if clean_quality > 0 else 0.0
            metrics[f"s{sev}"] = result.metric
            metrics[f"relative_s{sev}"] = rel
            for key, value in result.extra.items():
                metrics[f"{key}_s{sev}"] = value
            bar.advance()
        rels = [metrics[f"relative_s{s}"] for s in p.severities]
        gated = [s for s in p.severities if s <= g.up_to_severity]
        metrics["mean_relative"] = float(np.mean(rels))
        broken = [s for s in gated if metrics[f"relative_s{s}"] < g.min_relative]
        if gated:
            metrics["min_relative_gated"] = min(metrics[f"relative_s{s}"] for s in gated)
        gate_text = f"relative {task.metric_name} >= {g.min_relative} at severities <= {g.up_to_severity}"
        worst_sev = max(gated) if gated else max(p.severities)
        worst, artifacts = self._worst_cases(ctx, pert, clean, runs[worst_sev], worst_sev, data, clean_inputs)
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
            "worst_cases": worst,
        }
        if broken:
            first = min(broken)
            severity = Severity.HIGH if first == 1 else Severity.MEDIUM if first == 2 else Severity.LOW
            return self.finding(
                ctx,
                Verdict.FAIL,
                f"{pert.name}: {task.metric_name} falls to {metrics[f'relative_s{first}']:.0%} of clean at severity {first}",
                severity=severity,
                metrics=metrics,
                gate=gate_text,
                message=f"{task.metric_name} {clean.metric:.3f} clean -> {metrics[f's{first}']:.3f} at severity {first}",
                suggestion=_SUGGEST.get(pert.group, "augment training or preprocessing for this perturbation"),
                evidence=evidence,
                artifacts=artifacts,
            )
        return self.finding(
            ctx,
            Verdict.PASS,
            f"{pert.name}: {task.metric_name} keeps >= {g.min_relative:.0%} of clean up to severity {g.up_to_severity}",
            metrics=metrics,
            gate=gate_text,
            message=f"{task.metric_name} {clean.metric:.3f} clean, mean relative {metrics['mean_relative']:.2f}",
            evidence=evidence,
            artifacts=artifacts,
        )

    def _worst_cases(
        self,
        ctx: CheckContext,
        pert: Perturbation[Any],
        clean: TaskResult,
        run: tuple[list[Any], Applied, TaskResult],
        severity: int,
        data: Dataset,
        clean_inputs: list[Any],
    ) -> tuple[list[dict[str, Any]], list[Any]]:
        p: RobustnessParams = self.params  # type: ignore[assignment]
        perturbed, applied, result = run
        drop = clean.per_sample - result.per_sample
        order = np.argsort(-drop, kind="stable")[: p.worst_cases]
        cases, artifacts = [], []
        for i in (int(j) for j in order):
            if drop[i] <= 0:
                break
            sample = data[i]
            case: dict[str, Any] = {
                "sample": sample.id,
                "index": i,
                "severity": severity,
                "clean_score": float(clean.per_sample[i]),
                "perturbed_score": float(result.per_sample[i]),
                "params": applied.items[i],
                "truth": sample.label or sample.text or sample.caption,
            }
            if clean.outputs:
                case["clean_output"] = clean.outputs[i]
            if result.outputs:
                case["perturbed_output"] = result.outputs[i]
            if pert.modality == Modality.IMAGE:
                stem = safe_name(f"{ctx.check_id}-{pert.name}-s{severity}-{sample.id}")
                case["clean_artifact"] = f"{stem}-clean.png"
                case["perturbed_artifact"] = f"{stem}-perturbed.png"
                artifacts += [
                    image_artifact(case["clean_artifact"], clean_inputs[i]),
                    image_artifact(case["perturbed_artifact"], perturbed[i]),
                ]
            else:
                case["clean_text"] = clean_inputs[i]
                case["perturbed_text"] = perturbed[i]
            cases.append(case)
        return cases, artifacts


_SUGGEST = {
    "noise": "add noise augmentation in training, or denoise before the encoder",
    "blur": "add blur augmentation; reject images below a sharpness threshold at the gateway",
    "digital": "avoid re-encoding at low JPEG quality in the upload path; augment with compression",
    "deployment": "augment with camera/occlusion effects seen in production traffic",
    "text-char": "normalise text (NFKC, confusables, whitespace) before tokenising; augment with typos",
    "text-word": "augment captions with word-order changes",
}
