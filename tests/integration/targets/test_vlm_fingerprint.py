"""fingerprint_match on generative VLMs: the served chat template and processor against the model
directory's. The served copies are the built-in tiny VLM's directory with one file changed, as a
serving image or an export would ship them; the weights are the same."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mmchaos.checks.integration.fingerprint_match import FingerprintMatch, FingerprintMatchParams
from mmchaos.data.vqa import make_vqa
from mmchaos.errors import ConfigError
from mmchaos.findings import Finding, Verdict
from mmchaos.targets.builtin import TINY_VLM_DIR
from mmchaos.targets.hf_vlm import HFVisionLanguageTarget
from tests.support import run_check

pytestmark = pytest.mark.integration

DATA = make_vqa(8, seed=3)


def _served_copy(tmp_path: Path, edit: str) -> Path:
    served = tmp_path / "served"
    shutil.copytree(TINY_VLM_DIR, served, ignore=shutil.ignore_patterns("training.json"))
    if edit == "template":  # a --chat-template with other role tags
        path = served / "chat_template.jinja"
        path.write_text(path.read_text().replace('"USER: "', '"Human: "').replace('"ASSISTANT:"', '"Assistant:"'))
    elif edit == "processor":  # an exported processor config that forgot the CLS token in the image count
        path = served / "processor_config.json"
        config = json.loads(path.read_text())
        config["num_additional_image_tokens"] = 0
        path.write_text(json.dumps(config))
    return served


def _run(served: Path, model_dir: Path | None) -> Finding:
    target = HFVisionLanguageTarget(served)
    params = FingerprintMatchParams(model_dir=str(model_dir) if model_dir else None, probe=False)
    (finding,) = run_check(FingerprintMatch(params), target, DATA)
    return finding


def test_fingerprint_match_passes_a_vlm_served_with_its_own_template_and_processor() -> None:
    finding = _run(TINY_VLM_DIR, None)
    assert finding.verdict == Verdict.PASS and "chat template and processor compared" in finding.title
    vlm = finding.evidence["vlm"]
    assert vlm["served_processor"] == vlm["model_dir_processor"]
    assert vlm["served_processor"]["image_token"] == "<image>" and vlm["served_processor"]["patch_size"] == 16
    assert vlm["prompt_tokens_served"] == vlm["prompt_tokens_model_dir"]


def test_fingerprint_match_fails_a_served_chat_template_that_differs(tmp_path: Path) -> None:
    finding = _run(_served_copy(tmp_path, "template"), TINY_VLM_DIR)
    assert finding.verdict == Verdict.FAIL and finding.title.startswith("chat template does not belong")
    problems = [p["problem"] for p in finding.evidence["problems"]]
    assert any(p.startswith("chat_template_sha256") for p in problems)
    assert any("a text request is" in p and "chat template and tokenizer" in p for p in problems), problems


def test_fingerprint_match_fails_a_served_processor_with_another_image_token_count(tmp_path: Path) -> None:
    finding = _run(_served_copy(tmp_path, "processor"), TINY_VLM_DIR)
    assert finding.verdict == Verdict.FAIL and "processor" in finding.title
    problems = {p["problem"].split(" ")[0]: p for p in finding.evidence["problems"]}
    assert problems["num_additional_image_tokens"]["component"] == "processor"
    # the model consumes 17 image features: the 16 placeholders the served processor makes are refused
    assert any("a one-image request fails" in p["problem"] for p in finding.evidence["problems"])


def test_fingerprint_match_refuses_a_model_dir_that_is_not_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        _run(TINY_VLM_DIR, tmp_path / "nowhere")
    assert info.value.code == "model_dir_missing"


@pytest.mark.parametrize("edit", ["none", "template"])
def test_fingerprint_match_over_http_compares_the_served_prompt_tokens(tmp_path: Path, edit: str) -> None:
    """An openai: target exposes no processor: the prompt tokens the server reports for a text and a
    one-image request are compared with what the model directory's template and processor make."""
    from mmchaos.server import ServerThread
    from mmchaos.targets import TargetOptions, load_target

    served = TINY_VLM_DIR if edit == "none" else _served_copy(tmp_path, edit)
    with ServerThread(HFVisionLanguageTarget(served)) as srv:
        target = load_target(f"openai:{srv.base_url}", TargetOptions())
        try:
            params = FingerprintMatchParams(model_dir=str(TINY_VLM_DIR), probe=False)
            (finding,) = run_check(FingerprintMatch(params), target, DATA)
        finally:
            target.close()
    vlm = finding.evidence["vlm"]
    assert "served_processor" not in vlm and vlm["prompt_tokens_served"]["one_image"] is not None
    if edit == "none":
        assert finding.verdict == Verdict.PASS and vlm["prompt_tokens_served"] == vlm["prompt_tokens_model_dir"]
    else:
        assert finding.verdict == Verdict.FAIL and finding.title.startswith("chat template does not belong")
        assert "a text request is" in finding.evidence["problems"][0]["problem"]
