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
from tests.fakes.shipped_vlms import Edit, shipped_copy
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
