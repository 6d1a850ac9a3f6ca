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

from mmchaos._lazy import require
from mmchaos.attacks.gradient import AttackConfig, pgd
from mmchaos.attacks.losses import embedding_shift_loss, unit_tensor, zero_shot_loss
from mmchaos.attacks.preprocess import ImagePath, image_path, to_images, to_tensor
from mmchaos.checks.adversarial._common import Judge, by_shape, eps_label, eps_values, flip_cases, worst_records
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
    requires = (
        frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT}),
        frozenset({Capability.READ_TEXT}),
    )
    Params = TransferParams
    Gate = TransferGate

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p, g = self.params, self.gate
        data = ctx.dataset.sample(min(ctx.max_samples or p.samples, p.samples), ctx.seed)
        if Judge.choose(ctx.target, data) is None:
            why = "no image task fits this target and dataset (labels, captions or transcriptions)"
            yield self.finding(ctx, Verdict.SKIPPED, f"transfer attack not run: {why}", message=why)
            return
        clean = [s.load_image() for s in data]
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
            loss_kind, make_loss = self._loss(surrogate, path, data, clean)
            levels = sorted(set(p.eps) | {g.eps})
            robust: dict[float, float] = {}
            flip_at: dict[int, float] = {}
            adv_at: dict[float, dict[int, Any]] = {}
            attacks: list[dict[str, Any]] = []
            for k, level in enumerate(levels):
                cfg = AttackConfig(eps=level / 255, steps=p.steps, seed=int(ctx.rng("transfer", k).integers(2**31)))
                adv = self._craft(path, make_loss, clean, cfg)
                ok = judge.correct([adv[i] for i in idx], idx) & clean_ok
                robust[level], adv_at[level] = float(ok.mean()), adv
                attacks.append(cfg.describe())
                for i in idx:
                    if clean_ok[i] and not ok[i]:
                        flip_at.setdefault(i, level)
        finally:
            if not own:
                surrogate.close()
        yield self._finding(ctx, data, judge, path, loss_kind, clean, clean_ok, robust, flip_at, adv_at, attacks, own)

    def _loss(self, surrogate: Target, path: ImagePath, data: Any, clean: list[Any]) -> tuple[str, Any]:
        torch = require("torch")
        if data.has_labels and len(data.classes) > 1 and surrogate.has(Capability.EMBED_TEXT):
            refs = unit_tensor(
                surrogate.embed_texts([data.prompt_template.format(c) for c in data.classes]), path.device
            )
            index = {c: i for i, c in enumerate(data.classes)}
            truth = [index[s.label or ""] for s in data]
            return "zero-shot margin loss on the surrogate", lambda part: zero_shot_loss(
                path, refs, [truth[i] for i in part]
            )
        with torch.no_grad():
            feats: dict[int, Any] = {}
            for group in by_shape(clean):
                out = unit_tensor(path.features(to_tensor([clean[i] for i in group], path.device)), path.device)
                feats.update({i: out[j] for j, i in enumerate(group)})
        return "embedding shift on the surrogate (task-free)", lambda part: embedding_shift_loss(
            path, torch.stack([feats[i] for i in part])
        )

    def _craft(self, path: ImagePath, make_loss: Any, clean: list[Any], cfg: AttackConfig) -> dict[int, Any]:
        torch = require("torch")
        out: dict[int, Any] = {}
        bs = self.params.batch_size
        for group in by_shape(clean):
            for start in range(0, len(group), bs):
                part = group[start : start + bs]
                gen = torch.Generator(device=path.device)
                gen.manual_seed(cfg.seed + start)
                adv, _ = pgd(make_loss(part), to_tensor([clean[i] for i in part], path.device), cfg, generator=gen)
                out.update(zip(part, to_images(adv), strict=True))
        return out

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
