"""Step 3, black-box: a score-based query attack (Square Attack, L-inf) through the public API.

Runs on any image target (in-process, ONNX, PP-OCR, an ``openai:`` endpoint): it sees only the
answers a client sees. Every image sent, the class-prompt or caption embeddings included, is
booked on a hard query budget (``max_queries``) before it is sent; the attack stops where the
budget ends and says so. Per eps: the attack's success rate on the samples the target gets right
clean. For OCR, success means the text read changes. Gate: robust quality at ``gate.eps``
relative to clean.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from mmchaos.attacks.gradient import eps_label, eps_values
from mmchaos.attacks.judge import Judge
from mmchaos.attacks.plan import batches, by_shape
from mmchaos.attacks.query import QueryBudget
from mmchaos.attacks.units import AttackPlan, SquareUnit, decode_square, encode_square, run_square_unit
from mmchaos.checks.adversarial._common import JUDGED_IMAGE_TASKS, attack_set, flip_cases, worst_records
from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.errors import TargetCallError
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.tasks.ocr_metrics import corpus_cer

__all__ = ["BlackBox", "BlackBoxGate", "BlackBoxParams"]


class BlackBoxParams(Params):
    eps: list[float] = Field(default_factory=lambda: [4.0, 8.0], description="eps in grey levels (k/255), 1-16")
    samples: int = Field(8, ge=1, description="samples attacked (seeded, stratified by label): the blast radius")
    queries_per_sample: int = Field(200, ge=2, description="queries one sample may use per eps")
    max_queries: int = Field(5000, ge=1, description="hard cap on every request of this check, all eps together")
    p_init: float = Field(0.1, gt=0, le=1, description="initial share of the image one square covers")
    batch_size: int = Field(16, ge=1)
    worst_cases: int = Field(3, ge=0)

    @field_validator("eps")
    @classmethod
    def _eps(cls, v: list[float]) -> list[float]:
        return eps_values(v)


class BlackBoxGate(Gate):
    eps: float = Field(4.0, ge=1, le=16, description="the declared eps (grey levels) the gate holds at")
    min_relative: float = Field(0.5, ge=0.0, le=1.0, description="robust quality / clean quality at gate eps")


def _cer(judge: Judge, data: Any, clean: list[Any], adv: dict[int, Any], level: float) -> dict[str, float]:
    """Corpus CER against the transcriptions, clean and at the gate eps (when the budget allows)."""
    refs = [s.text or "" for s in data]
    out = {"cer_clean": corpus_cer(judge.clean_reads, refs)}
    try:
        out[f"cer_eps{level:g}"] = corpus_cer(
            judge.outputs([adv[i] for i in range(len(data))], list(range(len(data)))), refs
        )
    except TargetCallError as exc:
        if exc.code != "attack_budget_spent":
            raise
    return out


class BlackBox(Check[BlackBoxParams, BlackBoxGate]):
    """Square Attack within a hard query budget through the target's public API (HTTP included)."""

    name = "adversarial_blackbox"
    step = Step.ADVERSARIAL
    requires = JUDGED_IMAGE_TASKS
    parallel_units = True  # eps x batch units, each seeded by its position: independent, model-bound

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p, g = self.params, self.gate
        s = attack_set(ctx, p.samples)
        data = s.data
        if s.kind is None:
            why = "no image task fits this target and dataset (labels, captions or transcriptions)"
            yield self.finding(ctx, Verdict.SKIPPED, f"black-box attack not run: {why}", message=why)
            return
        budget = QueryBudget(p.max_queries)
        judge = Judge(ctx.target, data, batch_size=p.batch_size, budget=budget)
        clean = s.clean
        idx = list(range(len(data)))
        clean_ok = judge.correct(clean, idx) if judge.kind != "ocr" else np.ones(len(data), bool)
        attacked = [i for i in idx if clean_ok[i]]
        levels = sorted(set(p.eps) | {g.eps})
        plan = AttackPlan(ctx.check_id, ctx.seed, s.indices, judge.state(), p.batch_size,
                          tuple(bool(c) for c in clean_ok))  # fmt: skip
        parts = batches([[attacked[j] for j in group] for group in by_shape([clean[i] for i in attacked])],
                        p.batch_size)  # fmt: skip
        # The budget left is split up front, in unit order: each batch may spend what it could need
        # (queries_per_sample per image) while the budget lasts, so no batch waits for another's spend.
        left = budget.left
        units: list[SquareUnit] = []
        for k, level in enumerate(levels):
            for part in parts:
                allot = min(p.queries_per_sample * len(part), left)
                left -= allot
                seed = int(ctx.rng("square", k, part[0]).integers(2**31))
                units.append(SquareUnit("square", level, tuple(part), seed, p.queries_per_sample, allot, p.p_init))
        success: dict[float, dict[int, bool]] = {level: {} for level in levels}
        adv_at: dict[float, dict[int, Any]] = {level: {} for level in levels}
        runs: list[dict[str, Any]] = []
        stop_level: float | None = None
        bar = ctx.progress.task(f"{ctx.check_id}: attack batches", total=len(units))
        try:
            results = ctx.map_units(run_square_unit, plan, units, keys=[u.key for u in units],
                                    encode=encode_square, decode=decode_square)  # fmt: skip
            for unit, res in zip(units, results, strict=True):
                if stop_level is not None:
                    if unit.level != stop_level:
                        break  # the budget ran out at an earlier eps: later ones are not reported
                    continue
                budget.used += res.used
                budget.calls += res.calls
                success[unit.level].update(zip(unit.positions, res.success, strict=True))
                adv_at[unit.level].update(res.flipped)
                runs.append({**res.params, "eps_255": unit.level, "samples": len(unit.positions),
                             "succeeded": sum(res.success), "queries": sum(res.queries)})  # fmt: skip
                if res.stopped:
                    stop_level = unit.level
                bar.advance()
        finally:
            bar.close()
        robust: dict[float, float] = {}
        flip_at: dict[int, float] = {}
        for level in levels:
            hit = np.array([success[level].get(i, False) for i in idx], bool)
            robust[level] = float((clean_ok & ~hit).mean())
            for i in np.flatnonzero(hit).tolist():
                flip_at.setdefault(int(i), level)
            if level == stop_level:
                break
        adv_full = {lv: {i: adv.get(i, clean[i]) for i in idx} for lv, adv in adv_at.items() if lv in robust}
        stopped = stop_level is not None
        yield self._finding(ctx, data, judge, clean, clean_ok, robust, flip_at, adv_full, runs, budget, stopped)

    def _finding(
        self,
        ctx: CheckContext,
        data: Any,
        judge: Judge,
        clean: list[Any],
        clean_ok: Any,
        robust: dict[float, float],
        flip_at: dict[int, float],
        adv_at: dict[float, dict[int, Any]],
        runs: list[dict[str, Any]],
        budget: QueryBudget,
        stopped: bool,
    ) -> Finding:
        p, g = self.params, self.gate
        clean_q = float(clean_ok.mean())
        metrics: dict[str, float] = {"clean": clean_q, "queries": float(budget.used), "requests": float(budget.calls)}
        for level, acc in robust.items():
            metrics[f"robust_eps{level:g}"] = acc
        cases = flip_cases(data, flip_at, p.worst_cases)
        artifacts = worst_records(ctx.check_id, data, cases, clean, adv_at)
        evidence: dict[str, Any] = {
            "perturbation": "Square Attack (black-box)",
            "attack": "square",
            "task": judge.kind,
            "metric": judge.metric,
            "eps_curve": [{"eps_255": lv, "eps": lv / 255, "robust": robust[lv]} for lv in sorted(robust)],
            "runs": runs,
            "query_budget": {
                "max_queries": p.max_queries,
                "used": budget.used,
                "requests": budget.calls,
                "stopped_by_budget": stopped,
            },
            "preprocessing": "none needed: the attack perturbs the uploaded pixels and sees only the API's answers",
            "samples": len(data),
            "seed": ctx.seed,
            "worst_cases": cases,
        }
        if g.eps not in robust:
            return self.finding(
                ctx, Verdict.ERROR, f"the query budget ran out before eps {eps_label(g.eps)} ({budget.used} queries)",
                metrics=metrics, evidence=evidence, artifacts=artifacts,
                suggestion="raise max_queries or lower samples / queries_per_sample",
            )  # fmt: skip
        rel = robust[g.eps] / clean_q if clean_q > 0 else 1.0
        metrics["relative_at_gate"] = rel
        if judge.kind == "ocr" and data.has_transcriptions:
            metrics.update(_cer(judge, data, clean, adv_at[g.eps], g.eps))
        gate = f"robust {judge.metric} at eps {eps_label(g.eps)} >= {g.min_relative:.0%} of clean"
        curve = ", ".join(f"{eps_label(lv)}: {robust[lv]:.2f}" for lv in sorted(robust))
        title = (f"{judge.metric} {clean_q:.2f} clean, {robust[g.eps]:.2f} under a {p.queries_per_sample}-query "
                 f"black-box attack at eps {eps_label(g.eps)}")  # fmt: skip
        message = (
            f"robust {judge.metric} per eps {curve}; {budget.used}/{p.max_queries} queries in {budget.calls} requests"
        )
        if stopped:
            message += "; the budget stopped the attack early"
        if rel < g.min_relative:
            return self.finding(
                ctx, Verdict.FAIL, title, severity=Severity.HIGH, metrics=metrics, gate=gate, message=message,
                evidence=evidence, artifacts=artifacts,
                suggestion="an attacker with only API access flips answers: adversarial training, input purification, "
                "and rate limits / query-pattern detection on the endpoint",
            )  # fmt: skip
        return self.finding(ctx, Verdict.PASS, title, metrics=metrics, gate=gate, message=message,
                            evidence=evidence, artifacts=artifacts)  # fmt: skip
