"""White-box PGD on a generative VLM: the negative log-likelihood of the reference answer.

Each sample is attacked alone (a VLM request is one chat), in work units of one eps and up to 8
samples (judged together): the processor builds the prompt's
model inputs once, the torch mirror of its image processor (checked equal to the processor's own
``pixel_values``) makes the pixels differentiable, and PGD raises the teacher-forced NLL of the
reference answer. The adversarial images are judged by asking the target, greedy, through its
public ``generate`` (the VQA task: normalised match with the reference answers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from mmchaos._lazy import require
from mmchaos.attacks.gradient import AttackConfig, pgd
from mmchaos.attacks.losses import answer_nll_loss
from mmchaos.attacks.preprocess import DIFFERENTIABLE, MIRROR_TOLERANCE, processor_mirror, to_images, to_tensor
from mmchaos.checks.adversarial._common import SampledPlan, decode_image, encode_image
from mmchaos.checks.base import CheckContext
from mmchaos.data.base import Dataset
from mmchaos.errors import TargetCallError
from mmchaos.executors import Worker
from mmchaos.targets.wrappers import as_model_call, unwrap
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


def _vlm_parts(target: Any) -> tuple[Any, Any, Any, Any, str] | str:
    """The VLM's input builder, model, tokenizer and torch mirror of its image processor, or why not."""
    inner = unwrap(target)
    build = getattr(inner, "build_inputs", None)
    model = getattr(inner, "model", None)
    tokenizer = getattr(inner, "tokenizer", None)
    proc = getattr(getattr(inner, "processor", None), "image_processor", None)
    if not (callable(build) and model is not None and tokenizer is not None and proc is not None):
        return "the target exposes no processor, tokenizer and model to differentiate through"
    device = str(getattr(inner, "device", "cpu"))
    mirror = processor_mirror(proc, device)
    if mirror is None:
        return f"the image processor ({type(proc).__name__}) has no torch mirror"
    return build, model, tokenizer, mirror, device


@dataclass(frozen=True)
class VlmPlan(SampledPlan):
    """What every unit of the VLM attack shares; sent once to each worker."""

    configs: dict[float, AttackConfig]


@dataclass(frozen=True)
class VlmUnit:
    """PGD at one eps on a batch of samples (each attacked alone: one chat each), judged together."""

    level: float
    positions: tuple[int, ...]

    @property
    def key(self) -> str:
        return f"pgd-vlm/eps{self.level:g}/{self.positions[0]}+{len(self.positions)}"


@dataclass
class VlmResult:
    """Per sample: right under attack, the answer, and the adversarial image where it was flipped."""

    correct: list[bool]
    answers: list[str]
    flipped: dict[int, Any]


def run_vlm_unit(worker: Worker, plan: VlmPlan, unit: VlmUnit) -> VlmResult:
    """PGD on the answer NLL of each sample of the batch (seeded by eps and sample), judged through ``generate``."""
    torch = require("torch")
    parts = worker.memo("vlm/parts", lambda: _vlm_parts(worker.target))
    if isinstance(parts, str):
        raise TargetCallError(f"white-box VLM attack cannot run on this worker: {parts}", code="attack_no_path")
    build, model, tokenizer, mirror, device = parts
    data = plan.data(worker)
    cfg = plan.configs[unit.level]
    adv = []
    for i in unit.positions:
        image = data[i].load_image()
        inputs = build(data[i].question or "", [image])
        answer = list(tokenizer(data[i].answer or "", add_special_tokens=False)["input_ids"])
        loss = answer_nll_loss(model, inputs, answer, mirror.pixels)
        gen = torch.Generator(device=device)
        gen.manual_seed(cfg.seed + i)
        x_adv, _ = as_model_call(worker.target, partial(pgd, generator=gen), loss, to_tensor([image], device), cfg)
        adv.append(to_images(x_adv)[0])
    judged = VQAAccuracy(batch_size=8).evaluate(worker.target, data.select(list(unit.positions)), images=adv)
    correct = [bool(v > 0) for v in judged.per_sample]
    flipped = {i: a for i, a, c in zip(unit.positions, adv, correct, strict=True) if not c}
    return VlmResult(correct, list(judged.outputs), flipped)


def _encode(r: VlmResult) -> dict[str, Any]:
    return {
        "correct": r.correct,
        "answers": r.answers,
        "flipped": {str(i): encode_image(a) for i, a in r.flipped.items()},
    }


def _decode(body: dict[str, Any]) -> VlmResult:
    flipped = {int(i): decode_image(a) for i, a in body["flipped"].items()}
    return VlmResult([bool(c) for c in body["correct"]], [str(a) for a in body["answers"]], flipped)


def attack_vlm(
    ctx: CheckContext, indices: tuple[int, ...], data: Dataset, levels: list[float], steps: int, random_start: bool
) -> GenerativeOutcome | str:
    """PGD per eps on every sample the VLM answers right clean; a string says why it cannot run.

    The attack runs as work units (eps x batch of 8 samples) through ``ctx.map_units``.
    """
    parts = _vlm_parts(ctx.target)
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
                                              encode=_encode, decode=_decode), strict=True):  # fmt: skip
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
