"""The step-1 contract check, in worker processes, against correct and deliberately broken targets."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mmchaos.checks.contract.contract import ContractGate, classify, replay
from mmchaos.executors.jobs import ErrorInfo, JobResult
from mmchaos.hostile import get_case
from tests.fakes import broken_targets as bt


def _ok(output: Any, refs: dict[str, Any] | None = None, method: str = "embed_encoded_images") -> JobResult:
    main = {"status": "ok", "output": output, "seconds": 0.01, "rss_growth_mb": 0.0, "method": method}
    return JobResult("ok", value={"main": main, "refs": refs or {}})


def test_classify_names_each_outcome() -> None:
    g = ContractGate()
    args = (g.min_equivalent_cosine, g.max_equivalent_cer, g.max_reject_rss_mb)
    vec = np.array([[0.1, 0.5, -0.2]], np.float32)
    exif = get_case("exif_orientation_3")
    assert classify(exif, JobResult("hung", detail="no answer within 3 s"), *args).outcome == "hung"
    assert classify(exif, JobResult("crashed", detail="SIGSEGV"), *args).outcome == "crashed"
    raised = JobResult("ok", value={"main": {"status": "raised", "seconds": 0.0, "rss_growth_mb": 900.0,
                                             "error": ErrorInfo("TargetCallError", "too large", True, "x")},
                                    "refs": {}})  # fmt: skip
    late = classify(get_case("decompression_bomb"), raised, *args)
    assert late.outcome == "rejected" and late.late_rejection and "after allocating 900 MB" in late.detail
    assert classify(get_case("zero_byte"), _ok(vec), *args).outcome == "garbage"
    assert "all-zero" in classify(get_case("size_1x1"), _ok(vec * 0), *args).detail
    good = {"expected": {"status": "ok", "output": vec}, "exif_orientation_ignored": {"status": "ok", "output": -vec}}
    assert classify(exif, _ok(vec, good), *args).outcome == "handled"
    bad = classify(exif, _ok(-vec, good), *args)
    assert bad.outcome == "garbage" and "exif_orientation_ignored" in bad.detail
    text_refs = {"expected": {"status": "ok", "output": ["HELLO"]}}
    empty = classify(exif, _ok([""], text_refs, "read_encoded_images"), *args)
    assert empty.outcome == "garbage" and "empty transcription" in empty.detail


def test_replay_reproduces_one_case_in_process() -> None:
    result = replay(bt.ExifIgnoringTarget(), "exif_orientation_8")
    assert result["main"]["status"] == "ok" and "exif_orientation_ignored" in result["refs"]


@pytest.mark.parametrize("name", ["contract"])
def test_contract_is_registered_for_step_1(name: str) -> None:
    from mmchaos.checks import REGISTRY
    from mmchaos.findings import AVAILABLE_STEPS

    cls = REGISTRY.get(name)
    assert cls.step in AVAILABLE_STEPS and (cls.__doc__ or "").strip()
