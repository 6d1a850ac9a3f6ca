"""generation_batch_invariance mixes image sizes and aspect ratios in each batch (issue 25 item 3)."""

from __future__ import annotations

import pytest

from mmchaos.checks.engine.generation_batch_invariance import GenerationBatchInvariance
from mmchaos.data.vqa import make_vqa
from mmchaos.findings import Verdict
from tests.fakes.batching_vlm import PaddedBatchVLM, UnmaskedPaddingVLM
from tests.support import run_check_class

DATA = make_vqa(12, seed=0)  # 64x64 images: every probe the same size


@pytest.mark.check_contract("generation_batch_invariance", "broken")
def test_a_padding_mask_bug_fails_once_neighbours_differ_in_size() -> None:
    (finding,) = run_check_class(GenerationBatchInvariance, UnmaskedPaddingVLM(), {"probes": 2, "runs": 3}, data=DATA)
    assert finding.verdict == Verdict.FAIL, finding.title
    assert finding.metrics["mismatched_probes"] >= 1
    sizes = {tuple(s) for r in finding.evidence["probes"] for m in r["mismatches"] for s in m["neighbour_sizes"]}
    assert len(sizes) >= 2, "the failing batches held images of several sizes"


@pytest.mark.check_contract("generation_batch_invariance", "clean")
def test_a_masked_dynamic_resolution_batch_passes() -> None:
    (finding,) = run_check_class(GenerationBatchInvariance, PaddedBatchVLM(), {"probes": 2, "runs": 3}, data=DATA)
    assert finding.verdict == Verdict.PASS, finding.title
    sizes = finding.evidence["neighbour_sizes"]
    assert len({tuple(s) for s in sizes}) >= 3 and len({round(h / w, 2) for h, w in sizes}) >= 3
