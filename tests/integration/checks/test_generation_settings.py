"""Generation settings as shipped: the built-in tiny VLM with one setting saved wrong (a right-padded
tokenizer, a generation_config naming the wrong EOS) is tested as it ships, through the real loader,
processor and ``generate``, and the checks that judge those settings fail it; the built-in passes."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from mmchaos.checks.engine.generation_batch_invariance import GenerationBatchInvariance
from mmchaos.checks.integration.fingerprint_match import FingerprintMatch, FingerprintMatchParams
from mmchaos.data.vqa import make_vqa
from mmchaos.findings import Finding, Verdict
from mmchaos.targets import load_target
from mmchaos.targets.hf_vlm import HFVisionLanguageTarget
from tests.fakes.shipped_vlms import WRONG_EOS, Edit, shipped_copy
from tests.support import run_check

pytestmark = pytest.mark.integration

DATA = make_vqa(8, seed=3)
BATCHES = GenerationBatchInvariance.Params(probes=1, runs=2)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[Edit], HFVisionLanguageTarget]]:
    """One loaded copy of the built-in tiny VLM per edit, for this module."""
    loaded: dict[str, HFVisionLanguageTarget] = {}

    def get(edit: Edit) -> HFVisionLanguageTarget:
        if edit not in loaded:
            target = load_target(f"hf:{shipped_copy(tmp_path_factory.mktemp(edit), edit)}")
            assert isinstance(target, HFVisionLanguageTarget)
            loaded[edit] = target
        return loaded[edit]

    yield get
    for target in loaded.values():
        target.close()


def _fingerprint(target: HFVisionLanguageTarget) -> Finding:
    (finding,) = run_check(FingerprintMatch(FingerprintMatchParams(probe=False)), target, DATA)
    return finding


# -- padding side --------------------------------------------------------------------------------


def test_the_hf_target_pads_as_the_tokenizer_was_saved(shipped: Callable[[Edit], HFVisionLanguageTarget]) -> None:
    assert shipped("none").padding_side == "left"
    assert shipped("right_padding").padding_side == "right"


@pytest.mark.check_contract("generation_batch_invariance", "broken")
def test_generation_batch_invariance_fails_a_vlm_shipped_right_padded(
    shipped: Callable[[Edit], HFVisionLanguageTarget],
) -> None:
    [finding] = run_check(GenerationBatchInvariance(BATCHES), shipped("right_padding"), DATA)
    assert finding.verdict == Verdict.FAIL, finding.title
    assert finding.metrics["mismatched_probes"] == 1


@pytest.mark.check_contract("generation_batch_invariance", "clean")
def test_generation_batch_invariance_passes_the_builtin_as_shipped(
    shipped: Callable[[Edit], HFVisionLanguageTarget],
) -> None:
    [finding] = run_check(GenerationBatchInvariance(BATCHES), shipped("none"), DATA)
    assert finding.verdict == Verdict.PASS, finding.title


@pytest.mark.check_contract("fingerprint_match", "broken")
def test_fingerprint_match_names_the_right_padded_tokenizer_with_the_fix(
    shipped: Callable[[Edit], HFVisionLanguageTarget],
) -> None:
    finding = _fingerprint(shipped("right_padding"))
    assert finding.verdict == Verdict.FAIL and finding.title.startswith("tokenizer does not belong"), finding.title
    assert "padding_side 'right'" in finding.title
    assert "padding_side 'left'" in (finding.suggestion or "")
    assert finding.evidence["generation"]["padding_side"] == "right"


# -- EOS and the other ids generate uses ---------------------------------------------------------------


@pytest.mark.check_contract("fingerprint_match", "broken")
def test_fingerprint_match_fails_a_generation_config_naming_the_wrong_eos(
    shipped: Callable[[Edit], HFVisionLanguageTarget],
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
    shipped: Callable[[Edit], HFVisionLanguageTarget],
) -> None:
    finding = _fingerprint(shipped("none"))
    assert finding.verdict == Verdict.PASS, finding.message
    generation = finding.evidence["generation"]
    assert generation["generation_config_eos"] == [257] and generation["padding_side"] == "left"
    assert generation["emitted"] == {"answers": 3, "ended_by_length": 0, "end_tokens_run_past": {}}
    assert "generation_config compared with the tokenizer, config and 3 greedy answers" in finding.title
