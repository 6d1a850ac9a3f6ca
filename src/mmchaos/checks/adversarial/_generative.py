"""The driver of the white-box attack on a generative VLM: which samples it attacks, the check that
the torch mirror of the image processor matches it, and the outcome per eps. The units it maps
run in :mod:`mmchaos.attacks.vlm`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmchaos._lazy import require
from mmchaos.attacks.gradient import AttackConfig
from mmchaos.attacks.preprocess import DIFFERENTIABLE, MIRROR_TOLERANCE, to_tensor
from mmchaos.attacks.vlm import VlmPlan, VlmUnit, decode_vlm, encode_vlm, run_vlm_unit, vlm_parts
from mmchaos.checks.base import CheckContext
from mmchaos.data.base import Dataset
from mmchaos.tasks.generative import VQAAccuracy

__all__ = ["GenerativeOutcome", "attack_vlm"]


@dataclass
class GenerativeOutcome:
    clean_ok: Any
    robust: dict[float, float] = field(default_factory=dict)
    flip_at: dict[int, float] = field(default_factory=dict)
    adv_at: dict[float, dict[int, Any]] = field(default_factory=dict)
    answers: dict[float, list[str]] = field(default_factory=dict)
    clean_answers: list[str] = field(default_factory=list)
    attacks: list[dict[str, Any]] = field(default_factory=list)
    preprocessing: dict[str, Any] = field(default_factory=dict)


def attack_vlm(
    ctx: CheckContext, indices: tuple[int, ...], data: Dataset, levels: list[float], steps: int, random_start: bool
) -> GenerativeOutcome | str:
    """PGD per eps on every sample the VLM answers right clean; a string says why it cannot run.

    The attack runs as work units (eps x batch of 8 samples) through ``ctx.map_units``.
    """
    parts = vlm_parts(ctx.target)
    if isinstance(parts, str):
        return parts
    build, _, _, mirror, device = parts
    torch = require("torch")
    task = VQAAccuracy(batch_size=8)
    clean = [s.load_image() for s in data]
    result = task.evaluate(ctx.target, data)
    out = GenerativeOutcome(clean_ok=result.per_sample > 0, clean_answers=list(result.outputs))
    gaps = []
    attacked = np.flatnonzero(out.clean_ok).tolist()
    for i in attacked:
        inputs = build(data[i].question or "", [clean[i]])
        with torch.no_grad():
            gaps.append(
                float((mirror.pixels(to_tensor([clean[i]], device)) - inputs["pixel_values"].float()).abs().max())
            )
    gap = max(gaps, default=0.0)
    if gap > MIRROR_TOLERANCE:
        return f"the torch mirror of the image processor differs from it by {gap:.2g}"
    out.preprocessing = {"mode": DIFFERENTIABLE, "note": f"the VLM's image processor mirrored in torch (max "
                         f"deviation {gap:.2g}); loss: NLL of the reference answer, teacher-forced"}  # fmt: skip
    configs = {
        level: AttackConfig(eps=level / 255, steps=steps, random_start=random_start,
                            seed=int(ctx.rng("pgd-vlm", k).integers(2**31)))
        for k, level in enumerate(levels)
    }  # fmt: skip
    out.attacks = [configs[level].describe() for level in levels]
    plan = VlmPlan(ctx.check_id, ctx.seed, indices, configs)
    units = [VlmUnit(level, tuple(attacked[s : s + 8])) for level in levels for s in range(0, len(attacked), 8)]
    for level in levels:
        out.adv_at[level] = dict(enumerate(clean))
        out.answers[level] = list(out.clean_answers)
        out.robust[level] = 0.0
    ok: dict[float, set[int]] = {level: set() for level in levels}
    for unit, res in zip(units, ctx.map_units(run_vlm_unit, plan, units, keys=[u.key for u in units],
                                              encode=encode_vlm, decode=decode_vlm), strict=True):  # fmt: skip
        for i, c, answer in zip(unit.positions, res.correct, res.answers, strict=True):
            out.answers[unit.level][i] = answer
            if c:
                ok[unit.level].add(i)
        out.adv_at[unit.level].update(res.flipped)
    for level in levels:
        out.robust[level] = len(ok[level]) / len(data) if len(data) else 0.0
        for i in attacked:
            if i not in ok[level]:
                out.flip_at.setdefault(i, level)
    return out
