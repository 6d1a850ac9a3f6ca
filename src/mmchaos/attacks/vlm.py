"""White-box PGD on a generative VLM as work units: the negative log-likelihood of the reference answer.

Each sample is attacked alone (a VLM request is one chat), in work units of one eps and up to 8
samples (judged together): the processor builds the prompt's model inputs once, the torch mirror
of its image processor (checked equal to the processor's own ``pixel_values`` by the driver)
makes the pixels differentiable, and PGD raises the teacher-forced NLL of the reference answer.
The adversarial images are judged by asking the target, greedy, through its public ``generate``
(the VQA task: normalised match with the reference answers).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from mmchaos._lazy import require
from mmchaos.attacks.gradient import AttackConfig, pgd
from mmchaos.attacks.losses import answer_nll_loss
from mmchaos.attacks.plan import SampledPlan, UnitWorker, decode_image, encode_image
from mmchaos.attacks.preprocess import processor_mirror, to_images, to_tensor
from mmchaos.errors import TargetCallError
from mmchaos.targets.wrappers import as_model_call, unwrap
from mmchaos.tasks.generative import VQAAccuracy

__all__ = ["VlmPlan", "VlmResult", "VlmUnit", "decode_vlm", "encode_vlm", "run_vlm_unit", "vlm_parts"]


def vlm_parts(target: Any) -> tuple[Any, Any, Any, Any, str] | str:
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


def run_vlm_unit(worker: UnitWorker, plan: VlmPlan, unit: VlmUnit) -> VlmResult:
    """PGD on the answer NLL of each sample of the batch (seeded by eps and sample), judged through ``generate``."""
    torch = require("torch")
    parts = worker.memo("vlm/parts", lambda: vlm_parts(worker.target))
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


def encode_vlm(r: VlmResult) -> dict[str, Any]:
    return {
        "correct": r.correct,
        "answers": r.answers,
        "flipped": {str(i): encode_image(a) for i, a in r.flipped.items()},
    }


def decode_vlm(body: dict[str, Any]) -> VlmResult:
    flipped = {int(i): decode_image(a) for i, a in body["flipped"].items()}
    return VlmResult([bool(c) for c in body["correct"]], [str(a) for a in body["answers"]], flipped)
