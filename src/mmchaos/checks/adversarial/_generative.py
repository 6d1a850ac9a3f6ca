"""White-box PGD on a generative VLM: the negative log-likelihood of the reference answer.

Each sample is attacked alone (a VLM request is one chat): the processor builds the prompt's
model inputs once, the torch mirror of its image processor (checked equal to the processor's own
``pixel_values``) makes the pixels differentiable, and PGD raises the teacher-forced NLL of the
reference answer. The adversarial images are judged by asking the target, greedy, through its
public ``generate`` (the VQA task: normalised match with the reference answers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmchaos._lazy import require
from mmchaos.attacks.gradient import AttackConfig, pgd
from mmchaos.attacks.losses import answer_nll_loss
from mmchaos.attacks.preprocess import DIFFERENTIABLE, MIRROR_TOLERANCE, processor_mirror, to_images, to_tensor
from mmchaos.checks.base import CheckContext
from mmchaos.data.base import Dataset
from mmchaos.targets.wrappers import unwrap
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
    ctx: CheckContext, data: Dataset, levels: list[float], steps: int, random_start: bool
) -> GenerativeOutcome | str:
    """PGD per eps on every sample the VLM answers right clean; a string says why it cannot run."""
    inner = unwrap(ctx.target)
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
    torch = require("torch")
    task = VQAAccuracy(batch_size=8)
    clean = [s.load_image() for s in data]
    result = task.evaluate(ctx.target, data)
    out = GenerativeOutcome(clean_ok=result.per_sample > 0, clean_answers=list(result.outputs))
    gaps = []
    prepared: dict[int, tuple[Any, list[int]]] = {}
    for i in np.flatnonzero(out.clean_ok).tolist():
        inputs = build(data[i].question or "", [clean[i]])
        x = to_tensor([clean[i]], device)
        with torch.no_grad():
            gaps.append(float((mirror.pixels(x) - inputs["pixel_values"].float()).abs().max()))
        answer = tokenizer(data[i].answer or "", add_special_tokens=False)["input_ids"]
        prepared[i] = (inputs, list(answer))
    gap = max(gaps, default=0.0)
    if gap > MIRROR_TOLERANCE:
        return f"the torch mirror of the image processor differs from it by {gap:.2g}"
    out.preprocessing = {"mode": DIFFERENTIABLE, "note": f"the VLM's image processor mirrored in torch (max "
                         f"deviation {gap:.2g}); loss: NLL of the reference answer, teacher-forced"}  # fmt: skip
    for k, level in enumerate(levels):
        cfg = AttackConfig(eps=level / 255, steps=steps, random_start=random_start,
                           seed=int(ctx.rng("pgd-vlm", k).integers(2**31)))  # fmt: skip
        out.attacks.append(cfg.describe())
        adv = dict(enumerate(clean))
        for i, (inputs, answer) in prepared.items():
            loss = answer_nll_loss(model, inputs, answer, mirror.pixels)
            gen = torch.Generator(device=device)
            gen.manual_seed(cfg.seed + i)
            x_adv, _ = pgd(loss, to_tensor([clean[i]], device), cfg, generator=gen)
            adv[i] = to_images(x_adv)[0]
        judged = task.evaluate(ctx.target, data, images=[adv[i] for i in range(len(data))])
        ok = (judged.per_sample > 0) & out.clean_ok
        out.robust[level] = float(ok.mean())
        out.adv_at[level] = adv
        out.answers[level] = list(judged.outputs)
        for i in prepared:
            if not ok[i]:
                out.flip_at.setdefault(i, level)
    return out
