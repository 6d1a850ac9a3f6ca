"""Step 3, transfer: adversarial images crafted white-box on a surrogate, replayed on the target.

The attacker's cheapest move against a closed model: run PGD on an open model (the built-in
tiny-clip by default) and upload the result. The surrogate's loss is zero-shot cross-entropy when
the dataset has class labels, else a task-free push of its image embedding away from the clean
one (so the same images can be replayed on an OCR target or a retrieval endpoint). The target is
only queried through its public API, once per image per eps. Gate: the target's quality on the
transferred images at ``gate.eps`` relative to clean.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from mmchaos.attacks.gradient import AttackConfig, eps_label, eps_values
from mmchaos.attacks.judge import Judge
from mmchaos.attacks.preprocess import ImagePath, image_path
from mmchaos.attacks.units import (
    AttackPlan,
    PgdOutcome,
    decode_pgd,
    encode_pgd,
    pgd_units,
    run_transfer_unit,
)
from mmchaos.checks.adversarial._common import JUDGED_IMAGE_TASKS, attack_set, flip_cases, worst_records
from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets import load_target
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.wrappers import unwrap

__all__ = ["Transfer", "TransferGate", "TransferParams"]


class TransferParams(Params):
    surrogate: str = Field("builtin:tiny-clip", description="the open model PGD runs on (needs a torch image path)")
    eps: list[float] = Field(default_factory=lambda: [4.0, 8.0], description="eps in grey levels (k/255), 1-16")
    steps: int = Field(10, ge=1, le=1000)
    samples: int = Field(16, ge=1)
    batch_size: int = Field(32, ge=1)
    worst_cases: int = Field(3, ge=0)

    @field_validator("eps")
    @classmethod
    def _eps(cls, v: list[float]) -> list[float]:
        return eps_values(v)


class TransferGate(Gate):
    eps: float = Field(8.0, ge=1, le=16, description="the declared eps (grey levels) the gate holds at")
    min_relative: float = Field(0.5, ge=0.0, le=1.0, description="quality on transferred images / clean at gate eps")


class Transfer(Check[TransferParams, TransferGate]):
    """PGD crafted on a surrogate model (builtin:tiny-clip), replayed on the target through its public API."""

    name = "adversarial_transfer"
    step = Step.ADVERSARIAL
    requires = JUDGED_IMAGE_TASKS

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p, g = self.params, self.gate
        s = attack_set(ctx, p.samples)
        data, clean = s.data, s.clean
        if s.kind is None:
            why = "no image task fits this target and dataset (labels, captions or transcriptions)"
            yield self.finding(ctx, Verdict.SKIPPED, f"transfer attack not run: {why}", message=why)
            return
        own = getattr(unwrap(ctx.target), "uri", "") == p.surrogate
        surrogate: Target = unwrap(ctx.target) if own else load_target(p.surrogate)
        try:
            path = image_path(surrogate, clean[0], exact=False)
            if path is None:
                why = f"the surrogate {p.surrogate} gives no differentiable image path"
                yield self.finding(ctx, Verdict.SKIPPED, f"transfer attack not run: {why}", message=why)
                return
            judge = Judge(ctx.target, data, batch_size=p.batch_size)
            idx = list(range(len(data)))
            clean_ok = judge.correct(clean, idx) if judge.kind != "ocr" else np.ones(len(data), bool)
            zero_shot = data.has_labels and len(data.classes) > 1 and surrogate.has(Capability.EMBED_TEXT)
            loss_kind = ("zero-shot margin loss on the surrogate" if zero_shot
                         else "embedding shift on the surrogate (task-free)")  # fmt: skip
            levels = sorted(set(p.eps) | {g.eps})
            configs = {
                level: AttackConfig(eps=level / 255, steps=p.steps, seed=int(ctx.rng("transfer", k).integers(2**31)))
                for k, level in enumerate(levels)
            }
            plan = AttackPlan(
                ctx.check_id, ctx.seed, s.indices, judge.state(), p.batch_size, tuple(bool(c) for c in clean_ok),
                surrogate=p.surrogate, surrogate_loss="zero_shot" if zero_shot else "shift", configs=configs,
                # In this process the units use the surrogate loaded here (a Ray actor loads its own).
                local_surrogate=(surrogate, path) if ctx.executor is None else None,
            )  # fmt: skip
            units = pgd_units(levels, configs, clean, p.batch_size)
            out = PgdOutcome()
            results = ctx.map_units(run_transfer_unit, plan, units, keys=[u.key for u in units], encode=encode_pgd,
                                    decode=decode_pgd)  # fmt: skip
            for unit, res in zip(units, results, strict=True):
                out.add(unit, res)
        finally:
            if not own:
                surrogate.close()
        robust, flip_at = out.curve(levels, clean_ok)
        adv_at = out.adv_at
        attacks = [configs[level].describe() for level in levels]
        yield self._finding(ctx, data, judge, path, loss_kind, clean, clean_ok, robust, flip_at, adv_at, attacks, own)

    def _finding(
        self,
        ctx: CheckContext,
        data: Any,
        judge: Judge,
        path: ImagePath,
        loss_kind: str,
        clean: list[Any],
        clean_ok: Any,
        robust: dict[float, float],
        flip_at: dict[int, float],
        adv_at: dict[float, dict[int, Any]],
        attacks: list[dict[str, Any]],
        own: bool,
    ) -> Finding:
        p, g = self.params, self.gate
        clean_q = float(clean_ok.mean())
        metrics: dict[str, float] = {"clean": clean_q}
        for level, acc in robust.items():
            metrics[f"robust_eps{level:g}"] = acc
        rel = robust[g.eps] / clean_q if clean_q > 0 else 1.0
        metrics["relative_at_gate"] = rel
        cases = flip_cases(data, flip_at, p.worst_cases)
        artifacts = worst_records(ctx.check_id, data, cases, clean, adv_at)
        evidence: dict[str, Any] = {
            "perturbation": f"transfer from {p.surrogate}",
            "attack": "pgd-linf on the surrogate, replayed",
            "surrogate": p.surrogate,
            "surrogate_loss": loss_kind,
            "surrogate_preprocessing": path.describe(),
            "target_is_surrogate": own,
            "task": judge.kind,
            "metric": judge.metric,
            "eps_curve": [{"eps_255": lv, "eps": lv / 255, "robust": robust[lv]} for lv in sorted(robust)],
            "attacks": attacks,
            "samples": len(data),
            "seed": ctx.seed,
            "worst_cases": cases,
        }
        gate = f"{judge.metric} on transferred images at eps {eps_label(g.eps)} >= {g.min_relative:.0%} of clean"
        curve = ", ".join(f"{eps_label(lv)}: {robust[lv]:.2f}" for lv in sorted(robust))
        title = (f"{judge.metric} {clean_q:.2f} clean, {robust[g.eps]:.2f} on images crafted on {p.surrogate} at "
                 f"eps {eps_label(g.eps)}")  # fmt: skip
        message = f"robust {judge.metric} per eps {curve}"
        if own:
            message += " (the target is the surrogate: this is a white-box number)"
        if rel < g.min_relative:
            return self.finding(
                ctx, Verdict.FAIL, title, severity=Severity.MEDIUM, metrics=metrics, gate=gate, message=message,
                evidence=evidence, artifacts=artifacts,
                suggestion="perturbations made on an open model carry over: adversarial training or input "
                "purification; do not ship a public copy of the same weights",
            )  # fmt: skip
        return self.finding(ctx, Verdict.PASS, title, metrics=metrics, gate=gate, message=message,
                            evidence=evidence, artifacts=artifacts)  # fmt: skip
