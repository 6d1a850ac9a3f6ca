"""Generation settings as shipped: the built-in tiny VLM with one setting saved wrong (a right-padded
tokenizer, a generation_config naming the wrong EOS) is tested as it ships, through the real loader,
processor and ``generate``, and the checks that judge those settings fail it; the built-in passes,
in-process and served by ``mmchaos serve``'s server over ``openai:``. ``generation_semantics`` also
meets a FAKE OpenAI server that drops ``max_tokens`` (real HTTP on loopback; the servers that do
this cannot run here)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mmchaos.checks.engine.generation_batch_invariance import GenerationBatchInvariance
from mmchaos.checks.integration.fingerprint_match import FingerprintMatch, FingerprintMatchParams
from mmchaos.checks.integration.generation_semantics import GenerationSemantics
from mmchaos.data.vqa import make_vqa
from mmchaos.findings import Finding, Verdict
from mmchaos.targets import TargetOptions, load_target
from mmchaos.targets.base import Target
from mmchaos.targets.hf_vlm import HFVisionLanguageTarget
from tests.fakes.chat_vlm_server import OWN_MAX_TOKENS, ChatServerConfig, chat_vlm_server
from tests.fakes.shipped_vlms import WRONG_EOS, ShippedVLMs
from tests.support import run_check

pytestmark = pytest.mark.integration

DATA = make_vqa(8, seed=3)
BATCHES = GenerationBatchInvariance.Params(probes=1, runs=2)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShippedVLMs]:
    """One loaded copy of the built-in tiny VLM per edit, for this module."""
    loaded = ShippedVLMs(tmp_path_factory.mktemp)
    yield loaded
    loaded.close()


def _fingerprint(target: HFVisionLanguageTarget) -> Finding:
    (finding,) = run_check(FingerprintMatch(FingerprintMatchParams(probe=False)), target, DATA)
    return finding


# -- padding side --------------------------------------------------------------------------------


def test_the_hf_target_pads_as_the_tokenizer_was_saved(shipped: ShippedVLMs) -> None:
    assert shipped("none").padding_side == "left"
    assert shipped("right_padding").padding_side == "right"


@pytest.mark.check_contract("generation_batch_invariance", "broken")
def test_generation_batch_invariance_fails_a_vlm_shipped_right_padded(
    shipped: ShippedVLMs,
) -> None:
    [finding] = run_check(GenerationBatchInvariance(BATCHES), shipped("right_padding"), DATA)
    assert finding.verdict == Verdict.FAIL, finding.title
    assert finding.metrics["mismatched_probes"] == 1
    assert finding.title.endswith("the target pads batches on the right, as its tokenizer was saved")
    assert (finding.suggestion or "").startswith("save the tokenizer with padding_side 'left'")


@pytest.mark.check_contract("generation_batch_invariance", "clean")
def test_generation_batch_invariance_passes_the_builtin_as_shipped(
    shipped: ShippedVLMs,
) -> None:
    [finding] = run_check(GenerationBatchInvariance(BATCHES), shipped("none"), DATA)
    assert finding.verdict == Verdict.PASS, finding.title


@pytest.mark.check_contract("fingerprint_match", "broken")
def test_fingerprint_match_names_the_right_padded_tokenizer_with_the_fix(
    shipped: ShippedVLMs,
) -> None:
    finding = _fingerprint(shipped("right_padding"))
    assert finding.verdict == Verdict.FAIL and finding.title.startswith("tokenizer does not belong"), finding.title
    assert "padding_side 'right'" in finding.title
    assert "padding_side 'left'" in (finding.suggestion or "")
    assert finding.evidence["generation"]["padding_side"] == "right"


# -- EOS and the other ids generate uses ---------------------------------------------------------------


@pytest.mark.check_contract("fingerprint_match", "broken")
def test_fingerprint_match_fails_a_generation_config_naming_the_wrong_eos(
    shipped: ShippedVLMs,
) -> None:
    finding = _fingerprint(shipped("wrong_eos"))
    assert finding.verdict == Verdict.FAIL and finding.title.startswith("generation_config does not belong")
    assert f"eos_token_id is {WRONG_EOS}" in finding.title and "id 257" in finding.title
    problems = [p["problem"] for p in finding.evidence["problems"] if p["component"] == "generation_config"]
    # what the model emits: it ends its answers with </s> (257), and generate runs on past it
    assert any("greedy answers contain '</s>' (id 257) and run on" in p for p in problems), problems
    emitted = finding.evidence["generation"]["emitted"]
    assert emitted["ended_by_length"] == emitted["answers"] == 3
    assert "eos_token_id to 257" in (finding.suggestion or "")


@pytest.mark.check_contract("fingerprint_match", "clean")
def test_fingerprint_match_passes_the_builtin_generation_settings(
    shipped: ShippedVLMs,
) -> None:
    finding = _fingerprint(shipped("none"))
    assert finding.verdict == Verdict.PASS, finding.message
    generation = finding.evidence["generation"]
    assert generation["generation_config_eos"] == [257] and generation["padding_side"] == "left"
    assert generation["emitted"] == {"answers": 3, "ended_by_length": 0, "end_tokens_run_past": {}}
    assert "generation_config compared with the tokenizer, config and 3 greedy answers" in finding.title


# -- generation_semantics ------------------------------------------------------------------------------


def _semantics(target: Target) -> dict[str, Finding]:
    return {f.evidence["part"]: f for f in run_check(GenerationSemantics(), target, DATA)}


def _over_openai(url: str) -> dict[str, Finding]:
    target = load_target(f"openai:{url}", TargetOptions())
    try:
        return _semantics(target)
    finally:
        target.close()


PARTS = ("max_tokens", "stop", "n", "finish")


@pytest.mark.check_contract("generation_semantics", "clean")
def test_generation_semantics_passes_the_builtin_in_process_and_served(
    shipped: ShippedVLMs,
) -> None:
    from mmchaos.server import ServerThread

    builtin = shipped("none")
    local = _semantics(builtin)
    assert {p: f.verdict for p, f in local.items()} == dict.fromkeys(PARTS, Verdict.PASS), [
        f.title for f in local.values()
    ]
    with ServerThread(builtin) as srv:
        served = _over_openai(srv.base_url)
    assert {p: f.verdict for p, f in served.items()} == dict.fromkeys(PARTS, Verdict.PASS)
    assert served["max_tokens"].metrics["uncounted"] == 0  # the server's logprobs count the tokens
    assert served["stop"].metrics["cases"] == local["stop"].metrics["cases"] == 3


@pytest.mark.check_contract("generation_semantics", "broken")
def test_generation_semantics_fails_answers_that_run_past_a_wrong_eos(
    shipped: ShippedVLMs,
) -> None:
    finish = _semantics(shipped("wrong_eos"))["finish"]
    assert finish.verdict == Verdict.FAIL and finish.title.startswith("answers run on: 3 of 3")


@pytest.mark.check_contract("generation_semantics", "broken")
def test_generation_semantics_fails_a_server_that_ignores_max_tokens() -> None:
    with chat_vlm_server(ChatServerConfig(ignore_max_tokens=True)) as url:
        found = _over_openai(url)
    assert found["max_tokens"].verdict == Verdict.FAIL
    assert f"{OWN_MAX_TOKENS} tokens for max_tokens 32" in found["max_tokens"].title
    assert found["max_tokens"].metrics["violations"] == found["max_tokens"].metrics["cases"] == 9
    with chat_vlm_server() as url:  # the same server honouring max_tokens: counted from its usage
        clean = _over_openai(url)
    assert {p: f.verdict for p, f in clean.items()} == dict.fromkeys(PARTS, Verdict.PASS), [
        f.title for f in clean.values()
    ]
    assert "asked one at a time" in clean["n"].title  # it ignores n: the openai: target asks again, reported


def test_fingerprint_match_over_openai_reads_the_served_directorys_generation_config(shipped: ShippedVLMs) -> None:
    """An openai: target exposes no model: with ``model_dir`` the directory it serves is compared
    (what vLLM's ``--generation-config auto`` applies), statically."""
    from mmchaos.server import ServerThread

    broken = shipped("wrong_eos")
    with ServerThread(broken) as srv:
        target = load_target(f"openai:{srv.base_url}", TargetOptions())
        try:
            params = FingerprintMatchParams(model_dir=str(broken.path), probe=False)
            (finding,) = run_check(FingerprintMatch(params), target, DATA)
        finally:
            target.close()
    assert finding.verdict == Verdict.FAIL and finding.title.startswith("generation_config does not belong")
    assert "emitted" not in finding.evidence["generation"] and "padding_side" not in finding.evidence["generation"]
