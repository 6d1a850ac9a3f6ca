"""Step 3: how far each image is from another class in pixel space (a minimal-norm embedding move).

For white-box targets: DeepFool on the zero-shot logits, refined by bisection
(:mod:`mmchaos.attacks.semantic`), finds for every correctly classified image a small pixel
change that moves its embedding across a class boundary. The size of that change is the image's
margin; reported as a distribution (median, min, 10th percentile, per class) and gated on a
declared minimum median. L-inf margins are in grey levels (1/255), L2 margins in [0, 1] pixel
units at the tower's input resolution. Margins found by an attack are upper bounds: a small one
proves fragility, a large one is evidence of robustness, not proof.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field

from mmchaos._lazy import require
from mmchaos.attacks.plan import SampledPlan, decode_image, encode_image
from mmchaos.attacks.semantic import deepfool_margins, pixel_forward
from mmchaos.checks.adversarial._common import attack_set
from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.checks.evidence import image_artifact, safe_name
from mmchaos.errors import TargetCallError
from mmchaos.executors import Worker
from mmchaos.findings import Artifact, Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability
from mmchaos.targets.wrappers import as_model_call

__all__ = ["SemanticMargin", "SemanticMarginGate", "SemanticMarginParams"]


class SemanticMarginParams(Params):
    samples: int = Field(32, ge=1, description="labelled images measured (seeded, stratified by label)")
    norm: Literal["linf", "l2"] = Field("linf", description="the norm the margin is measured in")
    max_iter: int = Field(20, ge=1, description="DeepFool steps per image")
    overshoot: float = Field(0.02, ge=0.0, le=1.0, description="DeepFool's overshoot")
    candidates: int = Field(5, ge=1, description="closest other classes considered at each step")
    bisection_steps: int = Field(10, ge=0, description="halvings of the step length that refine each margin")
    batch_size: int = Field(32, ge=1)
    worst_cases: int = Field(3, ge=0, description="smallest-margin images saved (clean and moved, tower resolution)")


class SemanticMarginGate(Gate):
    min_median_linf: float = Field(
        1.0, ge=0.0, description="L-inf: median margin in grey levels (1/255); below 1 a change that 8-bit images "
        "cannot even hold reliably flips half the decisions"
    )  # fmt: skip
    min_median_l2: float = Field(0.2, ge=0.0, description="L2: median margin in [0, 1] pixel units")


class SemanticMargin(Check[SemanticMarginParams, SemanticMarginGate]):
    """Smallest pixel change that moves each image's embedding across a zero-shot class boundary."""

    name = "semantic_margin"
    step = Step.ADVERSARIAL
    requires = (
        frozenset({Capability.TORCH_MODULE, Capability.PREPROCESS, Capability.EMBED_IMAGE, Capability.EMBED_TEXT}),
    )

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p, g = self.params, self.gate
        s = attack_set(ctx, p.samples, cap=False)
        data = s.data
        if not (data.has_images and data.has_labels and len(data.classes) >= 2):
            yield self.finding(
                ctx, Verdict.SKIPPED, "semantic margin: the dataset has no labelled images of two or more classes",
                message="the margin is measured to the nearest other zero-shot class",
            )  # fmt: skip
            return
        path = pixel_forward(ctx.target)
        if isinstance(path, str):
            yield self.finding(ctx, Verdict.SKIPPED, f"semantic margin not run: {path}", message=path)
            return
        classes = list(data.classes)
        prompts = [data.prompt_template.format(c) for c in classes]
        text = np.asarray(ctx.target.embed_texts(prompts), dtype=np.float32)
        truth = np.array([classes.index(s.label or "") for s in data], dtype=np.int64)
        plan = MarginPlan(ctx.check_id, ctx.seed, s.indices, text, tuple(int(t) for t in truth), p.norm, p.max_iter,
                          p.overshoot, p.candidates, p.bisection_steps, p.worst_cases)  # fmt: skip
        units = [
            tuple(range(start, min(start + p.batch_size, len(data)))) for start in range(0, len(data), p.batch_size)
        ]
        parts: list[MarginBatch] = []
        bar = ctx.progress.task(f"{ctx.check_id}: images", total=len(data))
        try:
            for part in ctx.map_units(run_margin_unit, plan, units, keys=[f"margin/{u[0]}+{len(u)}" for u in units],
                                      encode=_encode_margin, decode=_decode_margin):  # fmt: skip
                parts.append(part)
                bar.advance(len(part.correct))
        finally:
            bar.close()
        # Images wrong before any attack have no margin to measure (they are counted, not gated).
        correct = np.array([c for r in parts for c in r.correct], bool)
        l2 = np.array([v for r in parts for v in r.l2], np.float64)
        linf = np.array([v for r in parts for v in r.linf], np.float64)
        to = np.array([v for r in parts for v in r.flipped_to], np.int64)
        shown = {i: pair for r in parts for i, pair in r.shown.items()}
        unit = 255.0 if p.norm == "linf" else 1.0
        margins = (linf if p.norm == "linf" else l2) * unit
        idx = np.flatnonzero(correct)
        metrics: dict[str, float] = {"clean_accuracy": float(correct.mean()), "measured": float(len(idx))}
        evidence: dict[str, Any] = {
            "attack": "DeepFool (Moosavi-Dezfooli et al. 2016) on the zero-shot logits, refined by bisection",
            "norm": p.norm,
            "unit": "grey levels (1/255)" if p.norm == "linf" else "L2 of [0, 1] pixels at the tower's resolution",
            "attack_space": path.space,
            "upper_bound": "margins found by an attack are upper bounds of the true minimal distance",
            "samples": len(data),
            "seed": ctx.seed,
            "params": p.model_dump(),
        }
        if not len(idx):
            yield self.finding(
                ctx, Verdict.SKIPPED, "semantic margin: no image is classified correctly, no margin to measure",
                metrics=metrics, evidence=evidence,
            )  # fmt: skip
            return
        m = margins[idx]
        found = np.isfinite(m)
        metrics.update({
            "median": float(np.median(m)),
            "min": float(m.min()),
            "p10": float(np.percentile(m, 10, method="lower")),
            "not_flipped": float((~found).sum()),
            "median_l2": float(np.median(l2[idx])),
            "median_linf_255": float(np.median(linf[idx]) * 255.0),
        })  # fmt: skip
        if found.any():
            metrics["mean_of_found"] = float(m[found].mean())
        per_class: dict[str, float] = {}
        for k in sorted({int(truth[i]) for i in idx}):
            sel = [i for i in idx if int(truth[i]) == k]
            per_class[classes[k]] = round(float(np.median(margins[sel])), 6)
        evidence["per_class_median"] = per_class
        weakest = min(per_class, key=lambda c: per_class[c])
        metrics["worst_class_median"] = per_class[weakest]
        evidence["weakest_class"] = weakest
        worst, artifacts = self._worst(ctx, data, idx, margins, to, classes, truth, shown)
        evidence.update({"perturbation": "semantic_margin", "metric": f"{p.norm} margin", "worst_cases": worst})
        floor = g.min_median_linf if p.norm == "linf" else g.min_median_l2
        unit_name = "/255" if p.norm == "linf" else " (L2)"
        gate = f"median {p.norm} margin >= {floor}{unit_name}"
        title = (
            f"semantic margin ({p.norm}): median {metrics['median']:.3g}{unit_name}, min {metrics['min']:.3g}; "
            f"weakest class {weakest} {per_class[weakest]:.3g}"
        )
        if metrics["median"] < floor:
            yield self.finding(
                ctx, Verdict.FAIL, title, severity=Severity.MEDIUM, metrics=metrics, gate=gate, evidence=evidence,
                artifacts=artifacts,
                message=f"half of the {len(idx)} correct decisions flip under a change of {metrics['median']:.3g}"
                f"{unit_name} or less",
                suggestion="adversarial training or input smoothing (randomised smoothing, JPEG/blur defences); "
                "check for high-gain features the tower reacts to (look at the saved deltas)",
            )  # fmt: skip
            return
        yield self.finding(
            ctx, Verdict.PASS, title, metrics=metrics, gate=gate, evidence=evidence, artifacts=artifacts,
            message=f"median margin {metrics['median']:.3g}{unit_name} over {len(idx)} correct decisions",
        )  # fmt: skip

    def _worst(
        self, ctx: CheckContext, data: Any, idx: Any, margins: Any, to: Any, classes: list[str], truth: Any,
        shown: dict[int, tuple[Any, Any]],
    ) -> tuple[list[dict[str, Any]], list[Artifact]]:  # fmt: skip
        records: list[dict[str, Any]] = []
        artifacts: list[Artifact] = []
        order = sorted(idx, key=lambda i: (margins[i], i))[: self.params.worst_cases]
        unit = "/255" if self.params.norm == "linf" else " L2"
        for rank, i in enumerate(order, 1):
            if not np.isfinite(margins[i]):
                break
            stem = safe_name(f"{ctx.check_id}-worst{rank:02d}-{data[i].id}")
            clean, moved = shown[i]
            records.append({
                "rank": rank, "sample": data[i].id, "index": int(i), "margin": round(float(margins[i]), 6),
                "severity": f" margin {float(margins[i]):.3g}{unit}", "truth": classes[int(truth[i])],
                "clean_output": classes[int(truth[i])], "perturbed_output": classes[int(to[i])],
                "moved_to": classes[int(to[i])], "params": {"norm": self.params.norm, "margin": float(margins[i])},
                "clean_artifact": f"{stem}-clean.png", "perturbed_artifact": f"{stem}-moved.png",
                "side_by_side_artifact": f"{stem}-clean-moved.png",
                "note": "shown at the tower's resolution in 8-bit: rounding can undo a move below 1/255",
            })  # fmt: skip
            gap = np.full((clean.shape[0], 4, 3), 255, np.uint8)
            artifacts += [
                image_artifact(f"{stem}-clean.png", clean),
                image_artifact(f"{stem}-moved.png", moved),
                image_artifact(f"{stem}-clean-moved.png", np.concatenate([clean, gap, moved], axis=1)),
            ]
        return records, artifacts


@dataclass(frozen=True)
class MarginPlan(SampledPlan):
    """What every batch of the margin measurement shares; sent once to each worker."""

    class_emb: Any
    """The class prompts' embeddings, computed once on the driver (``(K, D)`` float32)."""
    truth: tuple[int, ...]
    norm: str
    max_iter: int
    overshoot: float
    candidates: int
    bisection_steps: int
    worst_cases: int


@dataclass
class MarginBatch:
    """Per image of a batch: right before the attack, its margins and where it moved; the clean and
    moved images (tower resolution, uint8) of the batch's smallest margins, the worst-case candidates."""

    correct: list[bool]
    l2: list[float]
    linf: list[float]
    flipped_to: list[int]
    shown: dict[int, tuple[Any, Any]]


def run_margin_unit(worker: Worker, plan: MarginPlan, positions: tuple[int, ...]) -> MarginBatch:
    """DeepFool and bisection on one batch, through the worker's target (its torch work is model time)."""
    torch = require("torch")
    path = worker.memo("semantic/pixel_forward", lambda: pixel_forward(worker.target))
    if isinstance(path, str):
        raise TargetCallError(f"no differentiable image path on this worker: {path}", code="attack_no_path")
    data = plan.data(worker)
    x0 = path.pixels([data[i].load_image() for i in positions])
    class_emb = torch.nn.functional.normalize(torch.from_numpy(np.asarray(plan.class_emb)), dim=-1).to(x0.device)
    truth = torch.tensor([plan.truth[i] for i in positions]).to(x0.device)

    def measure() -> tuple[Any, Any]:
        result = deepfool_margins(
            path.forward, x0, truth, class_emb, norm=plan.norm, max_iter=plan.max_iter,  # type: ignore[arg-type]
            overshoot=plan.overshoot, candidates=plan.candidates, bisection_steps=plan.bisection_steps,
        )  # fmt: skip
        with torch.no_grad():
            pred = (torch.nn.functional.normalize(path.forward(x0), dim=-1) @ class_emb.T).argmax(1)
        return result, pred

    result, pred = as_model_call(worker.target, measure)
    correct = (pred.cpu() == truth.cpu()).numpy()
    margins = (result.linf * 255.0) if plan.norm == "linf" else result.l2
    order = sorted((j for j in range(len(positions)) if correct[j] and np.isfinite(margins[j])),
                   key=lambda j: (margins[j], positions[j]))[: plan.worst_cases]  # fmt: skip
    x_cpu, deltas = x0.detach().cpu(), result.deltas.detach().cpu()
    shown = {positions[j]: (_to_uint8(x_cpu[j]), _to_uint8((x_cpu[j] + deltas[j]).clamp(0, 1))) for j in order}
    return MarginBatch(
        [bool(c) for c in correct], [float(v) for v in result.l2], [float(v) for v in result.linf],
        [int(v) for v in result.flipped_to], shown,
    )  # fmt: skip


def _finite(v: float) -> float | None:
    return v if np.isfinite(v) else None


def _encode_margin(r: MarginBatch) -> dict[str, Any]:
    return {"correct": r.correct, "l2": [_finite(v) for v in r.l2], "linf": [_finite(v) for v in r.linf],
            "to": r.flipped_to,
            "shown": {str(i): [encode_image(c), encode_image(m)] for i, (c, m) in r.shown.items()}}  # fmt: skip


def _decode_margin(body: dict[str, Any]) -> MarginBatch:
    inf = float("inf")
    return MarginBatch(
        [bool(c) for c in body["correct"]], [inf if v is None else float(v) for v in body["l2"]],
        [inf if v is None else float(v) for v in body["linf"]], [int(v) for v in body["to"]],
        {int(i): (decode_image(c), decode_image(m)) for i, (c, m) in body["shown"].items()},
    )  # fmt: skip


def _to_uint8(x: Any) -> Any:
    arr = x.detach().cpu().numpy().transpose(1, 2, 0)
    return np.ascontiguousarray(np.clip(np.rint(arr * 255.0), 0, 255).astype(np.uint8))
