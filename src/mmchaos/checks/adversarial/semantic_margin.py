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
from typing import Any, Literal

import numpy as np
from pydantic import Field

from mmchaos._lazy import require
from mmchaos.attacks.semantic import deepfool_margins, pixel_forward
from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.checks.evidence import image_artifact, safe_name
from mmchaos.findings import Artifact, Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability

__all__ = ["SemanticMargin", "SemanticMarginGate", "SemanticMarginParams"]


class SemanticMarginParams(Params):
    samples: int = Field(32, ge=1, description="labelled images measured (the first N of the dataset)")
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
    Params = SemanticMarginParams
    Gate = SemanticMarginGate

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p, g = self.params, self.gate
        torch = require("torch")
        data = ctx.dataset.sample(p.samples, ctx.seed)
        if not (data.has_images and data.has_labels and len(data.classes) >= 2):
            yield self.finding(
                ctx, Verdict.SKIPPED, "semantic margin: the dataset has no labelled images of two or more classes",
                message="the margin is measured to the nearest other zero-shot class",
            )  # fmt: skip
            return
        path = pixel_forward(ctx.target)
        if isinstance(path, str):
            yield self.finding(ctx, Verdict.SKIPPED, "semantic margin: no differentiable image path", message=path)
            return
        classes = list(data.classes)
        prompts = [data.prompt_template.format(c) for c in classes]
        text = np.asarray(ctx.target.embed_texts(prompts), dtype=np.float32)
        class_emb = torch.nn.functional.normalize(torch.from_numpy(text), dim=-1)
        images = [s.load_image() for s in data]
        truth = torch.tensor([classes.index(s.label or "") for s in data])
        parts, x_parts = [], []
        bar = ctx.progress.task(f"{ctx.check_id}: images", total=len(images))
        try:
            for start in range(0, len(images), p.batch_size):
                x0 = path.pixels(images[start : start + p.batch_size])
                class_emb = class_emb.to(x0.device)
                parts.append(deepfool_margins(
                    path.forward, x0, truth[start : start + p.batch_size].to(x0.device), class_emb, norm=p.norm,
                    max_iter=p.max_iter, overshoot=p.overshoot, candidates=p.candidates,
                    bisection_steps=p.bisection_steps,
                ))  # fmt: skip
                x_parts.append(x0.detach().cpu())
                bar.advance(int(x0.shape[0]))
        finally:
            bar.close()
        # Images wrong before any attack have no margin to measure (they are counted, not gated).
        with torch.no_grad():
            x_all = torch.cat(x_parts)
            clean_pred = torch.cat([
                (torch.nn.functional.normalize(path.forward(x_all[i : i + p.batch_size].to(class_emb.device)), dim=-1)
                 @ class_emb.T).argmax(1).cpu()
                for i in range(0, len(x_all), p.batch_size)
            ])  # fmt: skip
        correct = (clean_pred == truth).numpy()
        l2 = np.concatenate([r.l2 for r in parts])
        linf = np.concatenate([r.linf for r in parts])
        to = np.concatenate([r.flipped_to for r in parts])
        deltas = torch.cat([r.deltas.cpu() for r in parts])
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
        worst, artifacts = self._worst(ctx, data, idx, margins, to, classes, truth, x_all, deltas)
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
        x_all: Any, deltas: Any,
    ) -> tuple[list[dict[str, Any]], list[Artifact]]:  # fmt: skip
        records: list[dict[str, Any]] = []
        artifacts: list[Artifact] = []
        order = sorted(idx, key=lambda i: (margins[i], i))[: self.params.worst_cases]
        unit = "/255" if self.params.norm == "linf" else " L2"
        for rank, i in enumerate(order, 1):
            if not np.isfinite(margins[i]):
                break
            stem = safe_name(f"{ctx.check_id}-worst{rank:02d}-{data[i].id}")
            clean = _to_uint8(x_all[i])
            moved = _to_uint8((x_all[i] + deltas[i]).clamp(0, 1))
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


def _to_uint8(x: Any) -> Any:
    arr = x.detach().cpu().numpy().transpose(1, 2, 0)
    return np.ascontiguousarray(np.clip(np.rint(arr * 255.0), 0, 255).astype(np.uint8))
