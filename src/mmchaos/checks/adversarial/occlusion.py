"""Step 3: how little occluded area flips the answer, where the model looks versus at random.

The cells of the image the target relies on most (``saliency_occlusion``: attention rollout on a
ViT tower, input gradients on other white-box models, occlusion sensitivity through a black box's
answers; the method and, where it is not the best one, why, are in the finding) are blanked with
the image's mean colour, at each area; the same number of random cells of the same grid, with the
same fill, is the baseline, averaged over seeded draws. A model that uses the whole object loses
little at a small area; one that answers from a few pixels (a shortcut) loses everything once they
are covered, while random cells rarely hit them. Gate: quality under saliency-guided occlusion at
``gate.severity`` relative to clean. A saliency that does not hurt more than random cells of the
same area has not found the key regions: the finding says so (a warning), since the worst case it
reports is then understated. Where neither hurts, the model is robust at that area: a pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from mmchaos import perturb
from mmchaos.attacks.judge import Judge
from mmchaos.checks.adversarial._common import JUDGED_IMAGE_TASKS, attack_set
from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.perturb.base import SEVERITIES, BindContext, severity_value
from mmchaos.perturb.deployment import AREA
from mmchaos.perturb.saliency import SaliencyOcclusion, random_cells

__all__ = ["OcclusionAttack", "OcclusionAttackGate", "OcclusionAttackParams"]


class OcclusionAttackParams(Params):
    severities: list[int] = Field(
        default_factory=lambda: [1, 3], description="areas as saliency_occlusion's severities (1-5: 5 to 45%)"
    )
    samples: int = Field(48, ge=4, description="samples occluded (seeded, stratified by label)")
    random_draws: int = Field(2, ge=1, le=16, description="seeded draws of random cells averaged per area")
    batch_size: int = Field(32, ge=1)

    @field_validator("severities")
    @classmethod
    def _severities(cls, v: list[int]) -> list[int]:
        if not v or any(s not in SEVERITIES for s in v):
            raise ValueError(f"severities must be a non-empty subset of {list(SEVERITIES)}")
        return sorted(set(v))


class OcclusionAttackGate(Gate):
    severity: int = Field(1, ge=1, le=5, description="the area (as a severity) the gate holds at")
    min_relative: float = Field(
        0.3, ge=0.0, le=1.0, description="quality under saliency-guided occlusion / clean quality at that area"
    )
    min_gap: float = Field(
        0.05, ge=0.0, le=1.0, description="how much more the saliency must hurt than random cells to count as found"
    )


class OcclusionAttack(Check[OcclusionAttackParams, OcclusionAttackGate]):
    """Blank the cells the model looks at (rollout, gradients, occlusion) against random cells of the same area."""

    name = "occlusion_attack"
    step = Step.ADVERSARIAL
    requires = JUDGED_IMAGE_TASKS

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p, g = self.params, self.gate
        s = attack_set(ctx, p.samples)
        if s.kind is None or not s.clean:
            yield self.finding(
                ctx, Verdict.SKIPPED, "no image task fits this target and dataset (labels, captions or text needed)",
            )  # fmt: skip
            return
        severities = sorted(set(p.severities) | {g.severity})
        judge = Judge(ctx.target, s.data, batch_size=p.batch_size)
        idx = list(range(len(s.data)))
        clean_q = float(judge.correct(s.clean, idx).mean())
        if clean_q == 0:
            yield self.finding(
                ctx, Verdict.SKIPPED, "the target gets no sample right clean: nothing to occlude",
                metrics={"clean_quality": 0.0}, evidence={"task": s.kind},
            )  # fmt: skip
            return
        saliency = perturb.get("saliency_occlusion")
        assert isinstance(saliency, SaliencyOcclusion)
        saliency.bind(BindContext(target=ctx.target, labels=tuple(s.data.classes),
                                  prompt_template=s.data.prompt_template))  # fmt: skip
        method, fallback = saliency.choice()
        rows: dict[int, dict[str, Any]] = {}
        for sev in severities:
            share = float(severity_value(AREA, sev))
            occluded, _ = saliency(s.clean, severity=sev, rng=ctx.rng("saliency", sev))
            sal_q = float(judge.correct(list(occluded), idx).mean())
            draws = []
            for d in range(p.random_draws):
                rng = ctx.rng("random", sev, d)
                draws.append(float(judge.correct([random_cells(im, share, rng)[0] for im in s.clean], idx).mean()))
            rand_q = float(np.mean(draws))
            rows[sev] = {"area": share, "saliency_quality": sal_q, "random_quality": rand_q,
                         "saliency_relative": sal_q / clean_q, "random_relative": rand_q / clean_q,
                         "random_draws": draws}  # fmt: skip
        yield self._verdict(ctx, s.kind, method, fallback, clean_q, rows)

    def _verdict(
        self, ctx: CheckContext, kind: str, method: str, fallback: str, clean_q: float, rows: dict[int, dict[str, Any]]
    ) -> Finding:
        g = self.gate
        metrics: dict[str, float] = {"clean_quality": clean_q}
        for r in rows.values():
            pct = f"{round(100 * r['area'])}pct"
            metrics[f"saliency_relative_{pct}"] = r["saliency_relative"]
            metrics[f"random_relative_{pct}"] = r["random_relative"]
        at = rows[g.severity]
        area = f"{round(100 * at['area'])}%"
        # Not found: random cells hurt and the saliency's cells hurt no more. Where neither hurts the
        # model is robust at that area, and there is nothing for a saliency to find.
        not_found = [
            sev
            for sev, r in rows.items()
            if r["random_relative"] - r["saliency_relative"] < g.min_gap and r["saliency_relative"] < 1 - g.min_gap
        ]
        evidence: dict[str, Any] = {
            "task": kind, "method": method, "fallback": fallback or None, "seed": ctx.seed,
            "baseline": "random cells of the same 8x8 grid, as many, the same mean-colour fill",
            "areas": {str(sev): r for sev, r in rows.items()},
        }  # fmt: skip
        gate = f"quality under saliency-guided occlusion of {area} of the image >= {g.min_relative:g} x clean"
        how = method.replace("_", " ")
        detail = (
            f"occluding the {area} of the image {how} ranks highest leaves {at['saliency_relative']:.0%} of clean "
            f"quality (random cells of the same area: {at['random_relative']:.0%})"
        )
        if at["saliency_relative"] < g.min_relative:
            return self.finding(
                ctx, Verdict.FAIL, f"{area} of occluded area flips the answer: {detail}",
                severity=Severity.MEDIUM, metrics=metrics, gate=gate, evidence=evidence,
                message="the model answers from a few key cells (a shortcut): covering them loses the answer",
                suggestion="train with occlusion augmentation (random erasing, CutOut) and check the model uses the "
                "whole object; look at the saved saliency cells",
            )  # fmt: skip
        if not_found:
            areas = ", ".join(f"{round(100 * rows[s]['area'])}%" for s in not_found)
            return self.finding(
                ctx, Verdict.WARN, f"{detail}; at {areas} the saliency hurts no more than random cells",
                severity=Severity.LOW, metrics=metrics, gate=gate, evidence=evidence,
                message=f"{how} did not find the key regions" + (f" ({fallback})" if fallback else "")
                + ": the worst case reported is understated",
                suggestion="give white-box access (a torch module with a ViT tower) for attention rollout",
            )  # fmt: skip
        return self.finding(ctx, Verdict.PASS, detail, metrics=metrics, gate=gate, evidence=evidence)
