"""Step 4/5 generation checks on real tiny VLMs (built from config here): each check passes a
clean tiny VLM and fails a broken one from ``tests/fakes/broken_vlms.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from mmchaos.checks.base import CheckContext
from mmchaos.checks.engine.generation_batch_invariance import GenerationBatchInvariance
from mmchaos.checks.engine.generation_precision import (
    GenerationPrecision,
    GenerationPrecisionGate,
    GenerationPrecisionParams,
)
from mmchaos.checks.engine.image_context_boundary import ImageContextBoundary
from mmchaos.checks.engine.image_token_consistency import ImageTokenConsistency
from mmchaos.checks.integration.image_cache_isolation import ImageCacheIsolation
from mmchaos.checks.integration.multi_turn_consistency import MultiTurnConsistency
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Finding, Verdict
from mmchaos.runner import TimedTarget
from mmchaos.server import ServerConfig, ServerThread
from mmchaos.targets import load_target
from mmchaos.targets.hf_vlm import HFVisionLanguageTarget
from mmchaos.targets.tiny_vlms import build_tiny_vlm
from tests.fakes import broken_vlms as bv
from tests.support.vlms import loaded_vlms

pytestmark = pytest.mark.integration

DATA = make_shapes(8, seed=3, image_size=48)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_vlm("qwen2_vl", tmp_path_factory.mktemp("qwen2_vl"))


@pytest.fixture(scope="module")
def qwen(qwen_dir: Path) -> Iterator[HFVisionLanguageTarget]:
    target = load_target(f"hf:{qwen_dir}")
    assert isinstance(target, HFVisionLanguageTarget)
    yield target
    target.close()


@pytest.fixture(scope="module")
def family_vlms(tiny_vlm_dirs: Callable[[str], Path]) -> Iterator[Callable[[str], HFVisionLanguageTarget]]:
    """Loads one tiny VLM per family on first use, for this module (the session's built directories)."""
    yield from loaded_vlms(tiny_vlm_dirs)


def run_check(check: Any, target: Any) -> list[Finding]:
    ctx = CheckContext(target=TimedTarget(target), dataset=DATA, seed=0, check_id=check.name)
    assert check.missing_capabilities(ctx.target) is None
    return list(check.run(ctx))


# -- image_cache_isolation ---------------------------------------------------------------------


@pytest.mark.check_contract("image_cache_isolation", "clean")
def test_image_cache_isolation_passes_a_clean_vlm(qwen: HFVisionLanguageTarget) -> None:
    [finding] = run_check(ImageCacheIsolation(), qwen)
    assert finding.verdict == Verdict.PASS, finding.title
    assert finding.metrics["with_logprobs"] == 1.0 and finding.metrics["requests"] == 9


@pytest.mark.check_contract("image_cache_isolation", "broken")
def test_image_cache_isolation_fails_a_cache_keyed_on_the_prompt_text(qwen: HFVisionLanguageTarget) -> None:
    [finding] = run_check(ImageCacheIsolation(), bv.TextKeyedCacheVLM(qwen))
    assert finding.verdict == Verdict.FAIL, finding.title
    assert finding.metrics["shared_answers_same_text"] == 9  # 3 prompts x 3 image pairs
    assert finding.metrics["shared_answers_same_image"] == 0
    assert "prompt text alone" in (finding.message or "")


def test_image_cache_isolation_fails_a_cache_keyed_on_the_image(qwen: HFVisionLanguageTarget) -> None:
    [finding] = run_check(ImageCacheIsolation(), bv.ImageKeyedCacheVLM(qwen))
    assert finding.verdict == Verdict.FAIL, finding.title
    assert finding.metrics["shared_answers_same_image"] == 9  # 3 images x 3 prompt pairs
    assert finding.metrics["shared_answers_same_text"] == 0


def test_image_cache_isolation_without_logprobs_warns_when_the_model_cannot_answer(
    qwen: HFVisionLanguageTarget,
) -> None:
    # Without logprobs the check judges on known-answer images; an untrained tiny VLM names no
    # colour right, so the black-box probe cannot judge: a warning that says so, never a pass.
    [finding] = run_check(ImageCacheIsolation(), bv.TextKeyedCacheVLM(bv.NoLogprobs(qwen)))
    assert finding.verdict == Verdict.WARN, finding.title
    assert finding.metrics["with_logprobs"] == 0 and finding.evidence["method"] == "black-box probe"
    assert finding.title.startswith("not judged")


@contextmanager
def served(target: Any) -> Iterator[Any]:
    """``target`` behind ``mmchaos serve``'s reference server, reached as ``openai:``."""
    with ServerThread(target, ServerConfig()) as srv:
        client = load_target(f"openai:{srv.base_url}")
        try:
            yield client
        finally:
            client.close()


def test_image_cache_isolation_judges_by_logprobs_through_mmchaos_serve(qwen: HFVisionLanguageTarget) -> None:
    with served(qwen) as client:
        [clean] = run_check(ImageCacheIsolation(), client)
    with served(bv.TextKeyedCacheVLM(qwen)) as client:
        [broken] = run_check(ImageCacheIsolation(), client)
    assert clean.verdict == Verdict.PASS, clean.title
    assert broken.verdict == Verdict.FAIL, broken.title
    assert clean.evidence["method"] == broken.evidence["method"] == "logprobs"
    assert broken.metrics["shared_answers_same_text"] == 9


# -- multi_turn_consistency --------------------------------------------------------------------


@pytest.mark.check_contract("multi_turn_consistency", "clean")
def test_multi_turn_consistency_passes_a_clean_vlm(qwen: HFVisionLanguageTarget) -> None:
    [finding] = run_check(MultiTurnConsistency(), qwen)
    assert finding.verdict == Verdict.PASS, finding.title
    assert finding.metrics["first_image_changes_last_answer"] == 1.0


@pytest.mark.check_contract("multi_turn_consistency", "broken")
def test_multi_turn_consistency_fails_a_vlm_that_answers_about_the_first_image(qwen: HFVisionLanguageTarget) -> None:
    [finding] = run_check(MultiTurnConsistency(), bv.FirstImageOnlyVLM(qwen))
    assert finding.verdict == Verdict.FAIL, finding.title
    assert finding.metrics["shared_last_answers"] == 3


def test_multi_turn_consistency_judges_by_logprobs_through_mmchaos_serve(qwen: HFVisionLanguageTarget) -> None:
    with served(bv.FirstImageOnlyVLM(qwen)) as client:
        [finding] = run_check(MultiTurnConsistency(), client)
    assert finding.verdict == Verdict.FAIL, finding.title
    assert finding.evidence["method"] == "logprobs" and finding.metrics["shared_last_answers"] == 3


# -- generation_batch_invariance ---------------------------------------------------------------


@pytest.mark.check_contract("generation_batch_invariance", "clean")
def test_generation_batch_invariance_passes_a_clean_left_padded_vlm(qwen: HFVisionLanguageTarget) -> None:
    [finding] = run_check(GenerationBatchInvariance(), qwen)
    assert finding.verdict == Verdict.PASS, finding.title
    assert finding.metrics["max_distinct_completions"] == 1 and finding.metrics["mismatched_probes"] == 0


@pytest.mark.check_contract("generation_batch_invariance", "broken")
def test_generation_batch_invariance_fails_batch_dependent_logits(qwen_dir: Path) -> None:
    broken = bv.BatchBiasedVLM(qwen_dir)
    [finding] = run_check(GenerationBatchInvariance(), broken)
    assert finding.verdict == Verdict.FAIL, finding.title
    assert finding.metrics["mismatched_probes"] == 2 and finding.metrics["earliest_divergence"] == 0
    assert finding.metrics["max_distinct_completions"] >= 2


def test_generation_batch_invariance_fails_right_padding(qwen: HFVisionLanguageTarget) -> None:
    qwen.padding_side = "right"  # the classic decoder-only batching bug, through the real processor
    try:
        [finding] = run_check(GenerationBatchInvariance(), qwen)
    finally:
        qwen.padding_side = "left"
    assert finding.verdict == Verdict.FAIL, finding.title
    assert finding.metrics["mismatched_probes"] >= 1


# -- image_token_consistency -------------------------------------------------------------------


@pytest.mark.check_contract("image_token_consistency", "clean")
@pytest.mark.parametrize("family", ["qwen2_vl", "llava", "idefics3"])
def test_image_token_consistency_passes_clean_vlms(
    family: str, family_vlms: Callable[[str], HFVisionLanguageTarget]
) -> None:
    target = family_vlms(family)
    findings = {f.evidence["part"]: f for f in run_check(ImageTokenConsistency(), target)}
    assert findings["expansion"].verdict == Verdict.PASS, findings["expansion"].title
    assert findings["expansion"].metrics["expected_two_images"] > 0
    mismatch = findings["mismatch"]
    assert mismatch.verdict == Verdict.PASS, mismatch.title
    outcomes = mismatch.evidence["outcomes"]
    assert outcomes["extra_placeholder"]["code"] == "processor_refused"
    assert outcomes["placeholder_without_image"]["code"] == "processor_refused"


@pytest.mark.check_contract("image_token_consistency", "broken")
def test_image_token_consistency_fails_a_vlm_that_drops_an_image(qwen: HFVisionLanguageTarget) -> None:
    findings = {f.evidence["part"]: f for f in run_check(ImageTokenConsistency(), bv.OneImageVLM(qwen))}
    expansion = findings["expansion"]
    assert expansion.verdict == Verdict.FAIL, expansion.title
    assert expansion.metrics["image_tokens_ab"] == expansion.metrics["image_tokens_a"]  # the second image vanished
    assert findings["mismatch"].verdict == Verdict.FAIL  # the assistant-turn image is dropped silently too
    assert findings["mismatch"].evidence["outcomes"]["image_in_assistant_turn"]["outcome"] == "answered"


# -- image_context_boundary --------------------------------------------------------------------


@pytest.fixture(scope="module")
def short_llava_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny LLaVA with 96 positions: two images (8 image tokens) and a short text fill it."""
    return bv.shrink_context(build_tiny_vlm("llava", tmp_path_factory.mktemp("llava96")), 96)


@pytest.mark.check_contract("image_context_boundary", "clean")
@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_image_context_boundary_passes_a_vlm_that_refuses_past_its_positions(
    family: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = bv.shrink_context(build_tiny_vlm(family, tmp_path_factory.mktemp(f"{family}-short")), 128)
    target = load_target(f"hf:{path}")
    assert getattr(target, "context_tokens", None) == 128
    [finding] = run_check(ImageContextBoundary(), target)
    assert finding.verdict == Verdict.PASS, finding.title
    assert finding.metrics["refused_over_limit"] == 6  # 3 over-limit lengths x 2 arrangements, all refused
    codes = {c.get("code") for c in finding.evidence["cases"] if c.get("outcome") == "refused"}
    assert codes == {"context_exceeded"}


@pytest.mark.check_contract("image_context_boundary", "broken")
def test_image_context_boundary_fails_silent_image_truncation(short_llava_dir: Path) -> None:
    broken = bv.TruncatingLlava(short_llava_dir)
    [finding] = run_check(ImageContextBoundary(), broken)
    assert finding.verdict == Verdict.FAIL, finding.title
    assert "image tokens (images truncated or dropped silently)" in finding.title
    assert "images_last" in finding.title  # text first, images at the end: the cut lands on them


def test_image_context_boundary_skips_without_a_limit(qwen: HFVisionLanguageTarget) -> None:
    limit, qwen.context_tokens = qwen.context_tokens, None
    try:
        [finding] = run_check(ImageContextBoundary(), qwen)
    finally:
        qwen.context_tokens = limit
    assert finding.verdict == Verdict.SKIPPED and "context_tokens" in finding.title


# -- generation_precision ----------------------------------------------------------------------


@pytest.mark.check_contract("generation_precision", "clean")
def test_generation_precision_passes_a_clean_vlm_and_restores_it(qwen: HFVisionLanguageTarget) -> None:
    before = qwen.generate("Describe.", [DATA[0].load_image()])
    findings = {f.evidence["dtype"]: f for f in run_check(GenerationPrecision(), qwen)}
    assert set(findings) == {"float16", "bfloat16"}
    for f in findings.values():
        assert f.verdict == Verdict.PASS, f.title
        assert f.metrics["nonfinite_requests"] == 0 and f.metrics["token_agreement"] >= 0.75
    after = qwen.generate("Describe.", [DATA[0].load_image()])
    assert before.token_ids == after.token_ids and before.logprobs == after.logprobs  # fp32 back bit for bit


@pytest.mark.check_contract("generation_precision", "broken")
def test_generation_precision_fails_a_layer_that_overflows_in_fp16(tmp_path: Path) -> None:
    path = build_tiny_vlm("qwen2_vl", tmp_path / "qwen-overflow")
    scaled = bv.overflow_in_fp16(path)
    target = load_target(f"hf:{path}")
    findings = {f.evidence["dtype"]: f for f in run_check(GenerationPrecision(), target)}
    fp16 = findings["float16"]
    assert fp16.verdict == Verdict.FAIL, fp16.title
    assert fp16.metrics["nonfinite_requests"] == 3
    origin = fp16.evidence["nonfinite_origin"]["module"]  # e.g. model.language_model.layers.1.mlp.down_proj
    assert origin.endswith(".layers." + scaled.split(".layers.")[1].removesuffix(".weight")), (origin, scaled)
    assert findings["bfloat16"].verdict == Verdict.PASS  # bf16 has fp32's range: no overflow


# -- every check on every tiny family ----------------------------------------------------------


@pytest.mark.parametrize("family", ["llava", "qwen2_vl", "qwen2_5_vl", "idefics3"])
def test_every_generation_check_passes_clean_tiny_vlms(
    family: str, family_vlms: Callable[[str], HFVisionLanguageTarget]
) -> None:
    target = family_vlms(family)
    checks = [GenerationBatchInvariance(), GenerationPrecision(), ImageTokenConsistency(), ImageContextBoundary(),
              ImageCacheIsolation(), MultiTurnConsistency()]  # fmt: skip
    for check in checks:
        for finding in run_check(check, target):
            assert finding.verdict == Verdict.PASS, f"{family} {check.name}: {finding.title}"


def test_generation_precision_scores_a_divergence_by_the_fp32_margin(
    family_vlms: Callable[[str], HFVisionLanguageTarget],
) -> None:
    # The seed-0 tiny Qwen2.5-VL has a near-tie (fp32 gap ~2e-4 nats) at token 1 of one request,
    # which fp16 rounding flips: noise, not a precision bug, unless the gate asks for no margin.
    target = family_vlms("qwen2_5_vl")
    params = GenerationPrecisionParams(dtypes=["float16"])
    [tolerant] = run_check(GenerationPrecision(params), target)
    assert tolerant.verdict == Verdict.PASS, tolerant.title
    assert tolerant.metrics["divergences_within_margin"] == 1 and tolerant.metrics["token_agreement_raw"] < 1
    [margin] = [m for m in tolerant.evidence["fp32_margin_at_divergence"] if m is not None]
    assert 0 < margin < 0.05
    [strict] = run_check(GenerationPrecision(params, GenerationPrecisionGate(min_confident_margin=0.0)), target)
    assert strict.verdict == Verdict.FAIL and "token agreement" in strict.title
