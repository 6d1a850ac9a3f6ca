"""The generative tasks and step 2 on a real transformers VLM (a tiny random LLaVA built from config):
the whole path runs (chat template, image-token expansion, batched generate) and is scored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mmchaos.checks.base import CheckContext
from mmchaos.checks.robustness.missing_modality import MissingModality, MissingModalityParams
from mmchaos.checks.robustness.robustness import Robustness, RobustnessParams
from mmchaos.data.textlines import make_textlines
from mmchaos.data.vqa import make_vqa
from mmchaos.findings import Verdict
from mmchaos.targets import load_target
from mmchaos.targets.base import Target
from mmchaos.targets.tiny_vlms import build_tiny_vlm
from mmchaos.tasks.generative import GenerativeOCR, VQAAccuracy

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    path: Path = build_tiny_vlm("llava", tmp_path_factory.mktemp("llava"))
    target = load_target(f"hf:{path}")
    yield target
    target.close()


def test_vqa_and_ocr_tasks_score_a_transformers_vlm(vlm: Target) -> None:
    data = make_vqa(4)
    result = VQAAccuracy(batch_size=3).evaluate(vlm, data)
    assert len(result.outputs) == 4 and all(isinstance(o, str) for o in result.outputs)
    assert set(result.per_sample.tolist()) <= {0.0, 1.0} and 0.0 <= result.metric <= 1.0
    # batched answers are the answers alone (left padding): the score does not depend on batch size
    assert VQAAccuracy(batch_size=1).evaluate(vlm, data).outputs == result.outputs
    ocr = GenerativeOCR(batch_size=2).evaluate(vlm, make_textlines(2))
    assert ocr.metric >= 0.0 and len(ocr.outputs) == 2


def test_robustness_and_missing_modality_run_on_a_transformers_vlm(vlm: Target) -> None:
    ctx = CheckContext(target=vlm, dataset=make_vqa(4), seed=0, check_id="t")
    params = RobustnessParams(perturbations=["gaussian_noise", "keyboard_typo"], severities=[1, 3], samples=4)
    findings = list(Robustness(params).run(ctx))
    sweeps = {f.evidence["perturbation"]: f for f in findings}
    assert set(sweeps) == {"gaussian_noise", "keyboard_typo", "whole sweep"}
    assert all(f.verdict != Verdict.ERROR for f in findings)
    assert {"clean", "s1", "s3"} <= set(sweeps["gaussian_noise"].metrics)
    found = list(MissingModality(MissingModalityParams(image_size=32, questions=2, max_new_tokens=4)).run(ctx))
    by = {f.evidence["probe"]: f for f in found}
    assert set(by) == {"black_image", "white_image", "gray_image", "no_image", "image_only"}
    assert all(f.metrics["crashed"] == 0.0 for f in found), [f.title for f in found]
    assert "confident_hallucination_rate" in by["black_image"].metrics  # hf gives logprobs


# -- a request the model cannot take is refused alone, counted, and the sweep goes on -------------

LONG = "Please look very carefully at the picture. " * 13 + "What colour is the shape?"  # ~570 tokens


@pytest.fixture(scope="module")
def tiny_vlm() -> Iterator[Target]:
    target = load_target("builtin:tiny-vlm")
    yield target
    target.close()


def test_a_batch_names_the_request_past_the_context_and_ask_refuses_it_alone(tiny_vlm: Target) -> None:
    from mmchaos.errors import TargetCallError
    from mmchaos.targets.generation import GenerationParams, Message
    from mmchaos.tasks.generative import ask

    data = make_vqa(3)
    image = data[0].load_image()
    params = GenerationParams(max_new_tokens=16, logprobs=False)
    with pytest.raises(TargetCallError) as info:
        tiny_vlm.generate_batch([[Message("user", (image, "What colour?"))], [Message("user", (image, LONG))]], params)
    assert info.value.code == "context_exceeded" and info.value.message.startswith("request 1 of 2:")
    questions = ["What colour is the shape?", LONG, "What shape is it?"]
    answers = ask(tiny_vlm, questions, [image] * 3, params, batch=3)
    assert answers.refused == {1: "context_exceeded"} and answers[1] == ""
    assert answers[0] == tiny_vlm.generate(questions[0], [image], params).text  # the others answered as alone
    assert answers[2] == tiny_vlm.generate(questions[2], [image], params).text
    assert answers.refusal_extra() == {"refused_rate": pytest.approx(1 / 3)}


def test_robustness_counts_refused_overlong_prompts_per_perturbation_and_severity(tiny_vlm: Target) -> None:
    """context_overflow at severity 3 puts every question past builtin:tiny-vlm's 256 positions:
    a refusal per sample, counted in that perturbation's finding, never an error stopping the sweep."""
    params = RobustnessParams(samples=4, severities=[1, 3], perturbations=["context_overflow"], batch_size=4)
    check = Robustness(params)
    ctx = CheckContext(target=tiny_vlm, dataset=make_vqa(8), seed=0, check_id="robustness")
    findings = [f for f in check.run(ctx) if f.evidence.get("perturbation") == "context_overflow"]
    assert findings and all(f.verdict != Verdict.ERROR for f in findings), [f.title for f in findings]
    metrics = findings[0].metrics
    assert metrics["refused_rate_s1"] == 0.0 and metrics["refused_rate_s3"] == 1.0
