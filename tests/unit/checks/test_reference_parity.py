"""reference_parity on numpy stand-ins: a BGR-fed deployment fails with the cause named; its twin passes."""

from __future__ import annotations

import numpy as np
import pytest

from mmchaos.checks.base import CheckContext
from mmchaos.checks.integration.reference_parity import ReferenceParity
from mmchaos.data import load_dataset
from mmchaos.findings import Finding, Verdict
from mmchaos.targets.base import Target
from mmchaos.targets.generation import Completion
from mmchaos.tasks.parity import compare_tokens, renormalised
from tests.fakes import parity as fp


def _run(target: Target, reference: Target | None, data: str = "builtin:shapes?n=48", **params: int) -> list[Finding]:
    check = ReferenceParity(ReferenceParity.Params.model_validate(params))
    data_set = load_dataset(data)
    ctx = CheckContext(target=target, dataset=data_set, seed=0, check_id="reference_parity", reference=reference)
    return list(check.run(ctx))


@pytest.mark.check_contract("reference_parity", "broken")
def test_bgr_fed_embedder_fails_naming_channel_order() -> None:
    findings = _run(fp.shape_colour_bgr(), fp.shape_colour())
    image = next(f for f in findings if f.title.startswith("image embeddings"))
    assert image.verdict is Verdict.FAIL
    assert image.evidence["cause"] == "channel order swapped (BGR fed as RGB)"
    score = next(f for f in findings if f.title.startswith("zero_shot"))
    assert score.verdict is Verdict.FAIL and score.metrics["reference"] - score.metrics["deployment"] > 0.3
    assert "channel order" in score.title
    text = next(f for f in findings if f.title.startswith("text embeddings"))
    assert text.verdict is Verdict.PASS  # only the image path is broken, and the check says so


@pytest.mark.check_contract("reference_parity", "clean")
def test_same_model_passes_everything() -> None:
    findings = _run(fp.shape_colour(), fp.shape_colour())
    assert findings and all(f.verdict is Verdict.PASS for f in findings), [f.title for f in findings]


def test_bgr_fed_vlm_fails_naming_channel_order_and_twin_passes() -> None:
    broken = _run(fp.words_bgr(), fp.words(), "builtin:vqa?n=12")
    gen = next(f for f in broken if f.title.startswith("greedy"))
    assert gen.verdict is Verdict.FAIL and "channel order" in gen.title
    assert gen.evidence["first_divergence"]["token_index"] == 0
    clean = _run(fp.words(), fp.words(), "builtin:vqa?n=12")
    assert all(f.verdict is Verdict.PASS for f in clean), [f.title for f in clean]


def test_without_reference_it_says_so() -> None:
    (only,) = _run(fp.shape_colour(), None)
    assert only.verdict is Verdict.SKIPPED and "--reference" in only.title


def test_logprobs_close_is_vllms_judgement() -> None:
    a = Completion("x", "stop", token_ids=(1, 2, 3), top_logprobs=({1: -0.1}, {2: -0.6, 7: -0.8}, {3: -0.1}))
    near = Completion("y", "stop", token_ids=(1, 7, 3), top_logprobs=({1: -0.1}, {7: -0.6, 2: -0.8}, {3: -0.1}))
    far = Completion("z", "stop", token_ids=(1, 9, 3), top_logprobs=({1: -0.1}, {9: -0.1, 8: -3.0}, {3: -0.1}))
    assert compare_tokens(a, a).equal
    tie = compare_tokens(a, near)
    assert not tie.equal and tie.first_divergence == 1 and tie.close is True
    assert compare_tokens(a, far).close is False
    assert compare_tokens(Completion("", "stop", token_ids=(1,)), Completion("", "stop", token_ids=(2,))).close is None


def test_renormalisation_emulates_the_wrong_pipeline_exactly() -> None:
    ref = ((0.48, 0.46, 0.41), (0.27, 0.26, 0.28))
    used = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    img = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    (fed,) = renormalised([img], ref, used)
    m, s = (np.asarray(v) for v in ref)
    got = (fed / 255.0 - m) / s  # what the reference's model sees
    want = img / 255.0  # what the broken pipeline feeds its model
    assert np.abs(got - want).max() < 0.5 / 255 / s.min() + 1e-9


@pytest.mark.check_contract("reference_parity", "broken")
def test_a_deployment_that_parts_only_when_batched_fails_the_batched_finding() -> None:
    findings = {f.title.split(" ")[0]: f for f in _run(fp.words_batch_shifted(), fp.words(), "builtin:vqa?n=12")}
    assert findings["greedy"].verdict is Verdict.PASS
    batched = findings["batched"]
    assert batched.verdict is Verdict.FAIL and "batching changes the answers" in batched.title
    assert batched.metrics["alone_greedy_match"] == 1.0 and batched.metrics["batched_greedy_match"] == 0.0


def test_logprob_deviation_is_measured_over_the_tokens_both_chose() -> None:
    from mmchaos.targets.generation import GenerationResult
    from mmchaos.tasks.parity import logprob_deviations

    a = GenerationResult((Completion("x y z", "stop", token_ids=(1, 2, 3), logprobs=(-0.1, -0.2, -0.3)),))
    b = GenerationResult((Completion("x y w", "stop", token_ids=(1, 2, 4), logprobs=(-0.15, -0.2, -5.0)),))
    assert logprob_deviations(a, b) == pytest.approx([0.05, 0.0])  # the third token differs: not compared
    bare = GenerationResult((Completion("x y z", "stop"),))
    assert logprob_deviations(a, bare) == []
