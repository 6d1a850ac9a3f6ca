"""Step 3, white-box: PGD through the target's own differentiable preprocessing, per eps.

For every eps (grey levels k/255) PGD maximises the task loss (zero-shot cross-entropy over the
class prompts, or the distance to the own caption for retrieval); the adversarial images are
rounded to uint8 and judged through the target's *public* API, so what is reported is what an
upload would do. Reported: robust accuracy per eps, the smallest eps that flips each sample, the
worst cases (clean, adversarial, amplified difference). Gate: robust accuracy at ``gate.eps``
relative to clean accuracy.

Then the gradient-masking sanity check (Carlini et al. 2019, "On evaluating adversarial
robustness"): a score-based black-box attack at the same eps must not succeed clearly more often
than the white-box one. When it does, the gradient the white-box attack follows is broken
(quantisation, a non-differentiable step, a saturated softmax), and the white-box robustness is
an illusion: that is its own finding.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from mmchaos.attacks.gradient import AttackConfig, AttackStats, eps_label, eps_values
from mmchaos.attacks.judge import Judge
from mmchaos.attacks.plan import batches, by_shape
from mmchaos.attacks.preprocess import ImagePath, image_path, not_pixel_grid
from mmchaos.attacks.units import (
    AttackPlan,
    PgdOutcome,
    SquareUnit,
    decode_pgd,
    decode_square,
    encode_pgd,
    encode_square,
    pgd_units,
    run_pgd_unit,
    run_square_unit,
)
from mmchaos.checks.adversarial._common import attack_set, flip_cases, worst_records
from mmchaos.checks.adversarial._generative import attack_vlm
from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability

__all__ = ["WhiteBox", "WhiteBoxGate", "WhiteBoxParams"]


class WhiteBoxParams(Params):
    eps: list[float] = Field(
        default_factory=lambda: [1.0, 2.0, 4.0, 8.0], description="eps in grey levels (k/255), 1-16"
    )
    norm: str = Field("linf", pattern="^(linf|l2)$", description="linf, or l2 (eps per element, RMS)")
    steps: int = Field(10, ge=1, le=1000, description="PGD steps (1 with random_start false is FGSM)")
    step_size: float | None = Field(None, gt=0, description="per step, in grey levels; default 2.5*eps/steps")
    random_start: bool = True
    loss: str = Field("margin", pattern="^(margin|ce)$", description="zero-shot loss: margin (CW) or ce (saturates)")
    samples: int = Field(32, ge=1, description="samples attacked (seeded, stratified by label)")
    batch_size: int = Field(32, ge=1)
    worst_cases: int = Field(4, ge=0, description="flipped samples saved as clean/adversarial images")
    masking_check: bool = Field(True, description="compare with a black-box attack at the gate eps")
    masking_queries: int = Field(100, ge=2, description="black-box queries per sample for the masking check")

    @field_validator("eps")
    @classmethod
    def _eps(cls, v: list[float]) -> list[float]:
        return eps_values(v)


class WhiteBoxGate(Gate):
    eps: float = Field(2.0, ge=1, le=16, description="the declared eps (grey levels) the gate holds at")
    min_relative: float = Field(0.5, ge=0.0, le=1.0, description="robust accuracy / clean accuracy at gate eps")
    max_masking_gap: float = Field(
        0.2, ge=0.0, le=1.0, description="black-box success may exceed white-box success by at most this"
    )


class WhiteBox(Check[WhiteBoxParams, WhiteBoxGate]):
    """PGD/FGSM through the target's differentiable preprocessing: robust accuracy per eps, and gradient masking."""

    name = "adversarial_whitebox"
    step = Step.ADVERSARIAL
    requires = (
        frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT, Capability.TORCH_MODULE}),
        frozenset({Capability.GENERATE, Capability.TORCH_MODULE}),
    )
    parallel_units = True  # eps x batch units, each seeded by its position: independent, model-bound

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p, g = self.params, self.gate
        s = attack_set(ctx, p.samples)
        data = s.data
        if not ctx.target.has(Capability.EMBED_IMAGE, Capability.EMBED_TEXT):
            yield self._generative(ctx, s.indices, data)
            return
        kind, clean = s.kind, s.clean
        path = image_path(ctx.target, clean[0] if clean else None) if clean else None
        if kind == "ocr":
            why = "white-box OCR needs a recogniser with a torch CTC head; attack it with adversarial_blackbox"
            yield self.finding(ctx, Verdict.SKIPPED, f"white-box attack not run: {why}", message=why)
            return
        if kind is None or path is None:
            no_path = not_pixel_grid(ctx.target) or "the target gives no differentiable image path"
            why = no_path if path is None and kind else "no image task fits this dataset (needs labels or captions)"
            yield self.finding(ctx, Verdict.SKIPPED, f"white-box attack not run: {why}", message=why)
            return
        judge = Judge(ctx.target, data, batch_size=p.batch_size)
        inputs = path.inputs(clean)
        idx = list(range(len(data)))
        clean_ok = judge.correct(inputs, idx)
        clean_acc = float(clean_ok.mean())
        levels = sorted(set(p.eps) | {g.eps})
        configs = {
            level: AttackConfig(
                eps=level / 255, norm="l2" if p.norm == "l2" else "linf", steps=p.steps,
                step_size=p.step_size / 255 if p.step_size else None, random_start=p.random_start,
                seed=int(ctx.rng("pgd", k).integers(2**31)),
            )
            for k, level in enumerate(levels)
        }  # fmt: skip
        plan = AttackPlan(
            ctx.check_id, ctx.seed, s.indices, judge.state(), p.batch_size, tuple(bool(c) for c in clean_ok),
            prepared=True, loss=p.loss, configs=configs,
        )  # fmt: skip
        units = pgd_units(levels, configs, inputs, p.batch_size)
        out = PgdOutcome()
        bar = ctx.progress.task(f"{ctx.check_id}: attack batches", total=len(units))
        try:
            results = ctx.map_units(run_pgd_unit, plan, units, keys=[u.key for u in units], encode=encode_pgd,
                                    decode=decode_pgd)  # fmt: skip
            for unit, res in zip(units, results, strict=True):
                out.add(unit, res)
                bar.advance()
        finally:
            bar.close()
        robust, flip_at = out.curve(levels, clean_ok)
        adv_at, zero, correct = out.adv_at, out.zero, out.correct
        attacks = [configs[level].describe() for level in levels]
        cases = flip_cases(data, flip_at, p.worst_cases)
        for case in cases:
            i = case["index"]
            case["clean_output"] = judge.outputs([inputs[i]], [i])[0]
            case["perturbed_output"] = judge.outputs([adv_at[case["eps_255"]][i]], [i])[0]
        yield self._robustness(
            ctx, data, judge.kind, judge.metric, path.describe(), inputs, clean_acc, robust, flip_at, adv_at,
            attacks, cases,
        )  # fmt: skip
        if p.masking_check:
            stats = AttackStats(steps=p.steps, zero_gradient_steps=[zero[g.eps][i] for i in sorted(zero[g.eps])])
            white_wrong = {i: not c for i, c in correct[g.eps].items()}
            yield self._masking(ctx, data, path, plan, inputs, clean_ok, white_wrong, stats)

    def _generative(self, ctx: CheckContext, indices: tuple[int, ...], data: Any) -> Finding:
        """PGD on the answer likelihood of a VLM, judged through ``generate`` (no masking check:
        there is no score to query black-box)."""
        p, g = self.params, self.gate
        if not (data.has_questions and data.has_images):
            why = "a generative target needs a dataset of questions about images (e.g. builtin:vqa)"
            return self.finding(ctx, Verdict.SKIPPED, f"white-box attack not run: {why}", message=why)
        levels = sorted(set(p.eps) | {g.eps})
        out = attack_vlm(ctx, indices, data, levels, p.steps, p.random_start)
        if isinstance(out, str):
            return self.finding(ctx, Verdict.SKIPPED, f"white-box attack not run: {out}", message=out)
        clean = [s.load_image() for s in data]
        cases = flip_cases(data, out.flip_at, p.worst_cases)
        for case in cases:
            case["truth"] = data[case["index"]].answer
            case["clean_output"] = out.clean_answers[case["index"]]
            case["perturbed_output"] = out.answers[case["eps_255"]][case["index"]]
        return self._robustness(
            ctx, data, "vqa", "accuracy", out.preprocessing, clean, float(np.mean(out.clean_ok)), out.robust,
            out.flip_at, out.adv_at, out.attacks, cases,
        )  # fmt: skip

    def _robustness(
        self,
        ctx: CheckContext,
        data: Any,
        task: str,
        metric: str,
        preprocessing: dict[str, Any],
        inputs: list[Any],
        clean_acc: float,
        robust: dict[float, float],
        flip_at: dict[int, float],
        adv_at: dict[float, dict[int, Any]],
        attacks: list[dict[str, Any]],
        cases: list[dict[str, Any]],
    ) -> Finding:
        p, g = self.params, self.gate
        metrics: dict[str, float] = {"clean": clean_acc}
        for level, acc in robust.items():
            metrics[f"robust_eps{level:g}"] = acc
        rel = robust[g.eps] / clean_acc if clean_acc > 0 else 1.0
        metrics["relative_at_gate"] = rel
        metrics["flipped"] = float(len(flip_at))
        if flip_at:
            metrics["median_flip_eps"] = float(np.median(list(flip_at.values())))
        artifacts = worst_records(ctx.check_id, data, cases, inputs, adv_at)
        evidence: dict[str, Any] = {
            "perturbation": f"PGD-{p.norm} white-box",
            "attack": "pgd" if p.steps > 1 or p.random_start else "fgsm",
            "task": task,
            "metric": metric,
            "eps_curve": [{"eps_255": lv, "eps": lv / 255, "robust": robust[lv]} for lv in sorted(robust)],
            "attacks": attacks,
            "loss": "answer NLL" if task == "vqa" else ("cosine to own caption" if task == "retrieval" else p.loss),
            "preprocessing": preprocessing,
            "smallest_flip_eps": {data[i].id: flip_at.get(i) for i in range(len(data))},
            "samples": len(data),
            "seed": ctx.seed,
            "worst_cases": cases,
        }
        gate = f"robust {metric} at eps {eps_label(g.eps)} >= {g.min_relative:.0%} of clean"
        where = f"({preprocessing.get('mode')}: {preprocessing.get('note')})"
        title = (f"{metric} {clean_acc:.2f} clean, {robust[g.eps]:.2f} under PGD at eps {eps_label(g.eps)} "
                 f"({rel:.0%} of clean)")  # fmt: skip
        curve = ", ".join(f"{eps_label(lv)}: {robust[lv]:.2f}" for lv in sorted(robust))
        message = f"robust {metric} per eps {curve}; {len(flip_at)} sample(s) flipped {where}"
        if rel < g.min_relative:
            return self.finding(
                ctx, Verdict.FAIL, title, severity=Severity.HIGH if rel < 0.25 else Severity.MEDIUM, metrics=metrics,
                gate=gate, message=message, evidence=evidence, artifacts=artifacts,
                suggestion="adversarial training (PGD-AT/TRADES) or a certified front end (randomised smoothing); "
                "at least rate-limit and monitor score-probing clients",
            )  # fmt: skip
        return self.finding(
            ctx, Verdict.PASS, title, metrics=metrics, gate=gate, message=message, evidence=evidence,
            artifacts=artifacts,
        )  # fmt: skip

    def _masking(
        self,
        ctx: CheckContext,
        data: Any,
        path: ImagePath,
        plan: AttackPlan,
        inputs: list[Any],
        clean_ok: Any,
        white_wrong: dict[int, bool],
        stats: AttackStats,
    ) -> Finding:
        p, g = self.params, self.gate
        attacked = [i for i in range(len(data)) if clean_ok[i]]
        white_rate = float(np.mean([white_wrong[i] for i in attacked])) if attacked else 0.0
        units = [
            SquareUnit("masking", g.eps, tuple(part), int(ctx.rng("square", part[0]).integers(2**31)),
                       p.masking_queries, p.masking_queries * len(part))
            for part in batches([[attacked[j] for j in group] for group in by_shape([inputs[i] for i in attacked])],
                                p.batch_size)
        ]  # fmt: skip
        black_success, used = 0, 0
        results: list[dict[str, Any]] = []
        for res in ctx.map_units(run_square_unit, plan, units, keys=[u.key for u in units], encode=encode_square,
                                 decode=decode_square):  # fmt: skip
            black_success += sum(res.success)
            used += res.used
            results.append({**res.params, "samples": len(res.success), "succeeded": sum(res.success)})
        black_rate = black_success / len(attacked) if attacked else 0.0
        gap = black_rate - white_rate
        zero_share = stats.zero_gradient_share()
        metrics = {"whitebox_success": white_rate, "blackbox_success": black_rate, "gap": gap,
                   "zero_gradient_share": zero_share, "queries": float(used)}  # fmt: skip
        evidence = {"eps_255": g.eps, "attacked": len(attacked), "blackbox": results, "seed": ctx.seed,
                    "preprocessing": path.describe(), "definition": "success = share of clean-correct samples the "
                    "attack makes wrong, judged through the public API; gap = black-box - white-box"}  # fmt: skip
        gate = f"black-box success - white-box success <= {g.max_masking_gap:.0%} at eps {eps_label(g.eps)}"
        title = (f"black-box {black_rate:.0%} vs white-box {white_rate:.0%} success at "
                 f"eps {eps_label(g.eps)}")  # fmt: skip
        if attacked and gap > g.max_masking_gap:
            return self.finding(
                ctx, Verdict.FAIL, f"gradient masking: {title}", severity=Severity.HIGH, metrics=metrics, gate=gate,
                message=f"a query attack that sees only scores beats PGD by {gap:.0%}; {zero_share:.0%} of PGD steps "
                "had an all-zero gradient: the white-box robustness is an artefact of a broken gradient",
                suggestion="find the non-differentiable step on the torch path (rounding, argmax, clamp, JPEG) and "
                "attack through it with BPDA (straight-through gradient) before trusting white-box numbers",
                evidence=evidence,
            )  # fmt: skip
        return self.finding(
            ctx, Verdict.PASS, f"no gradient masking: {title}", metrics=metrics, gate=gate, evidence=evidence,
            message=f"{zero_share:.0%} of PGD steps had an all-zero gradient",
        )  # fmt: skip
