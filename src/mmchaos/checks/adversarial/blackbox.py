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

from mmchaos.attacks.query import QueryBudget, square_attack
from mmchaos.checks.adversarial._common import Judge, by_shape, eps_label, eps_values, flip_cases, worst_records
from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.errors import TargetCallError
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability
from mmchaos.tasks.ocr_metrics import corpus_cer

__all__ = ["BlackBox", "BlackBoxGate", "BlackBoxParams"]


class BlackBoxParams(Params):
    eps: list[float] = Field(default_factory=lambda: [4.0, 8.0], description="eps in grey levels (k/255), 1-16")
    samples: int = Field(8, ge=1, description="samples attacked (the first N): the blast radius")
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
    requires = (
        frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT}),
        frozenset({Capability.READ_TEXT}),
    )
    Params = BlackBoxParams
    Gate = BlackBoxGate

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p, g = self.params, self.gate
        data = ctx.dataset.sample(min(ctx.max_samples or p.samples, p.samples), ctx.seed)
        if Judge.choose(ctx.target, data) is None:
            why = "no image task fits this target and dataset (labels, captions or transcriptions)"
            yield self.finding(ctx, Verdict.SKIPPED, f"black-box attack not run: {why}", message=why)
            return
        budget = QueryBudget(p.max_queries)
        judge = Judge(ctx.target, data, batch_size=p.batch_size, budget=budget)
        clean = [s.load_image() for s in data]
        idx = list(range(len(data)))
        clean_ok = judge.correct(clean, idx) if judge.kind != "ocr" else np.ones(len(data), bool)
        attacked = [i for i in idx if clean_ok[i]]
        levels = sorted(set(p.eps) | {g.eps})
        robust: dict[float, float] = {}
        flip_at: dict[int, float] = {}
        adv_at: dict[float, dict[int, Any]] = {}
        runs: list[dict[str, Any]] = []
        stopped = False
        bar = ctx.progress.task(f"{ctx.check_id}: eps", total=len(levels))
        try:
            for k, level in enumerate(levels):
                adv: dict[int, Any] = {i: clean[i] for i in idx}
                success = np.zeros(len(data), bool)
                for group in by_shape([clean[i] for i in attacked]):
                    part = [attacked[j] for j in group]
                    seed = int(ctx.rng("square", k, part[0]).integers(2**31))
                    try:
                        res = square_attack(
                            judge.scorer(part), [clean[i] for i in part], level / 255, budget=budget,
                            queries_per_image=p.queries_per_sample, seed=seed, p_init=p.p_init,
                        )  # fmt: skip
                    except TargetCallError as exc:
                        if exc.code != "attack_budget_spent":
                            raise
                        stopped = True
                        break
                    stopped = stopped or res.stopped_by_budget
                    for i, image, ok in zip(part, res.images, res.success, strict=True):
                        adv[i], success[i] = image, bool(ok)
                    runs.append({**res.params, "eps_255": level, "samples": len(part),
                                 "succeeded": int(res.success.sum()), "queries": int(res.queries.sum())})  # fmt: skip
                robust[level] = float((clean_ok & ~success).mean())
                adv_at[level] = adv
                for hit in np.flatnonzero(success).tolist():
                    flip_at.setdefault(int(hit), level)
                bar.advance()
                if stopped:
                    break
        finally:
            bar.close()
        yield self._finding(ctx, data, judge, clean, clean_ok, robust, flip_at, adv_at, runs, budget, stopped)

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
