"""The shipped ``builtin:tiny-vlm``: a genuine LLaVA checkpoint that loads offline through ``hf:``'s
code paths (chat template, LlavaProcessor image-token expansion, ``generate``), answers held-out
questions of the built-in ``vqa`` set, abstains about blank and absent images, and records how it
was made. Trained by ``scripts/train_tiny_vlm.py``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from mmchaos.checks.base import CheckContext
from mmchaos.checks.robustness.missing_modality import MissingModality, MissingModalityParams
from mmchaos.data.vqa import make_vqa
from mmchaos.findings import Verdict
from mmchaos.targets import load_target
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.builtin import TINY_VLM_DIR
from mmchaos.tasks.generative import VQAAccuracy

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not (TINY_VLM_DIR / "model.safetensors").is_file(), reason="built-in tiny-vlm not installed"),
]


@pytest.fixture(scope="module")
def vlm() -> Iterator[Target]:
    target = load_target("builtin:tiny-vlm")
    yield target
    target.close()


def test_it_is_a_llava_checkpoint_with_its_record() -> None:
    config = json.loads((TINY_VLM_DIR / "config.json").read_text())
    assert config["architectures"] == ["LlavaForConditionalGeneration"]
    record = json.loads((TINY_VLM_DIR / "training.json").read_text())
    assert {"seed", "steps_done", "train_wall_s", "heldout", "curve", "versions", "command"} <= set(record)
    assert record["heldout"]["vqa_accuracy"] >= 0.9
    assert (TINY_VLM_DIR / "model.safetensors").stat().st_size < 16 * 2**20


def test_it_answers_held_out_questions(vlm: Target) -> None:
    assert vlm.has(Capability.GENERATE) and vlm.uri == "builtin:tiny-vlm"
    data = make_vqa(48, seed=0, split="test")
    result = VQAAccuracy(batch_size=16).evaluate(vlm, data)
    assert result.metric >= 0.85, list(zip([s.answer for s in data], result.outputs))
    one = data[0]
    assert vlm.generate(one.question or "", [one.load_image()]).text.strip() == result.outputs[0].strip()


def test_it_abstains_about_blank_and_absent_images(vlm: Target) -> None:
    ctx = CheckContext(target=vlm, dataset=make_vqa(8), seed=0, check_id="mm")
    found = {f.evidence["probe"]: f for f in MissingModality(MissingModalityParams(image_size=64)).run(ctx)}
    assert found["image_only"].verdict == Verdict.PASS
    assert found["no_image"].metrics["hallucination_rate"] <= 0.25
    assert all(f.metrics["crashed"] == 0.0 for f in found.values())
