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
