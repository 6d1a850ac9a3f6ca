"""The step-1 contract check, in worker processes, against correct and deliberately broken targets."""

from __future__ import annotations

from typing import Any

import pytest

from mmchaos.checks.base import CheckContext
from mmchaos.checks.contract.contract import Contract, ContractParams
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Finding, Verdict
from mmchaos.hostile import get_case, select_cases
from mmchaos.runner import TimedTarget
from tests.fakes import broken_targets as bt
from tests.fakes import targets as fakes

DATA = make_shapes(4, seed=1)


def _run(target: Any, **params: Any) -> list[Finding]:
    params.setdefault("workers", 2)
    params.setdefault("timeout_s", 20.0)
    ctx = CheckContext(target=TimedTarget(target), dataset=DATA, seed=0, check_id="contract")
    return list(Contract(ContractParams(**params)).run(ctx))


def _failures(findings: list[Finding]) -> dict[str, Finding]:
    return {f.evidence["case"]: f for f in findings if f.verdict == Verdict.FAIL}


@pytest.mark.check_contract("contract", "clean")
@pytest.mark.integration
def test_a_validating_target_passes_the_whole_corpus() -> None:
    findings = _run(bt.ContractSafeTarget())
    assert not _failures(findings), [f.title for f in findings if f.verdict != Verdict.PASS]
    [summary] = findings
    m = summary.metrics
    assert m["n_cases"] >= 50 and m["n_passed"] == m["n_cases"]
    assert m["n_crashed"] == m["n_hung"] == m["n_garbage"] == 0
    traps = len(select_cases(["int32_*"], []))  # PNG and array headers, and the A0 page at 1200 dpi
    assert m["int32_cases"] == m["int32_cases_rejected"] == traps == 5, "every int32 trap is rejected"
    passed = summary.evidence["passed"]
    assert passed["exif_orientation_6"].startswith("handled: same answer as the correct picture")
    assert passed["int32_png_50000x50000"].startswith("rejected: TargetCallError[element_count_overflow]")


@pytest.mark.check_contract("contract", "broken")
@pytest.mark.integration
def test_a_processor_that_ignores_exif_fails_every_rotated_photo() -> None:
    failures = _failures(_run(bt.ExifIgnoringTarget(), cases=["exif", "mode_L", "zero_byte"]))
    assert sorted(failures) == [f"exif_orientation_{o}" for o in range(2, 9)]
    f = failures["exif_orientation_6"]
    assert "garbage" in f.title and "exif_orientation_ignored" in f.title
    assert f.metrics["cosine_to_exif_orientation_ignored"] > f.metrics["cosine_to_correct"]
    [artifact] = f.artifacts
    assert artifact.name.endswith(".jpg") and artifact.data == get_case("exif_orientation_6").build(_base()).data, (
        "the repro is the exact upload"
    )


def _base() -> Any:
    from mmchaos.checks.contract.contract import _base_sample

    return _base_sample(CheckContext(target=bt.ContractSafeTarget(), dataset=DATA, seed=0, check_id="x"))


@pytest.mark.integration
def test_a_hang_is_killed_and_the_worker_replaced() -> None:
    findings = _run(bt.HangOnTinyTarget(), cases=["size_1x1", "size_2x10000", "mode_L", "zero_byte"], timeout_s=3.0)
    failures = _failures(findings)
    assert list(failures) == ["size_1x1"]
    assert "hung" in failures["size_1x1"].title and "no answer within 3 s" in failures["size_1x1"].title
    summary = findings[-1]
    assert summary.metrics["worker_replacements"] >= 1 and summary.metrics["n_passed"] == 3


@pytest.mark.integration
def test_a_segfault_is_a_crash_and_the_run_goes_on() -> None:
    findings = _run(bt.SegfaultOnCMYKTarget(), cases=["mode_CMYK_*", "mode_RGBA", "exif_orientation_3"])
    failures = _failures(findings)
    assert sorted(failures) == ["mode_CMYK_jpeg", "mode_CMYK_tiff"]
    assert "SIGSEGV" in failures["mode_CMYK_jpeg"].title
    assert "Segmentation fault" in failures["mode_CMYK_jpeg"].evidence["worker_stderr"], "the native trace is kept"
    assert "decode_image" in failures["mode_CMYK_jpeg"].evidence["worker_stderr"]
    assert failures["mode_CMYK_jpeg"].severity.value == "critical"
    assert findings[-1].metrics["n_passed"] == 2


@pytest.mark.integration
def test_an_unvalidated_array_api_crashes_on_the_int32_trap_and_returns_garbage() -> None:
    findings = _run(fakes.HashEmbedTarget(), cases=["int32_array_*", "array_nan", "text_empty"])
    failures = _failures(findings)
    trap = failures["int32_array_50000x50000x3"]
    assert "crashed" in trap.title and "MemoryError" in trap.title  # the worker's memory limit caught it
    assert trap.evidence["declared_elements"] == 7_500_000_000 and trap.evidence["over_int32"]
    assert trap.artifacts[0].name.endswith(".json"), "a giant view is saved as a recipe, not materialised"
    assert "NaN/Inf" in failures["array_nan"].title
    assert "constant embedding" in failures["text_empty"].title


@pytest.mark.integration
def test_inprocess_isolation_and_unloadable_targets() -> None:
    class NotLoadable(bt.ContractSafeTarget):
        uri = "py:tests.no_such_module:factory"

    findings = _run(NotLoadable(), cases=["zero_byte"])
    assert findings[0].verdict == Verdict.ERROR and "isolation: inprocess" in findings[0].suggestion
    findings = _run(NotLoadable(), cases=["zero_byte", "exif_orientation_2", "int32_*"], isolation="inprocess")
    # zero_byte, exif_orientation_2 and the int32 traps this target is sent in-process (the A0 page included)
    assert [f.verdict for f in findings] == [Verdict.PASS] and findings[0].metrics["n_passed"] == 5
    assert findings[0].evidence["not_run_in_process"] == ["int32_array_50000x50000x3", "int32_array_1x715827883x3"]


@pytest.mark.integration
def test_a_real_model_behind_an_exif_ignoring_decoder(tmp_path_factory: pytest.TempPathFactory) -> None:
    pytest.importorskip("transformers")
    bt.ensure_tiny_clip(tmp_path_factory.getbasetemp())
    cases = {"cases": ["exif_orientation_[368]"], "isolation": "inprocess"}  # workers: see the tests above
    good = _run(bt.tiny_clip(), **cases)
    assert not _failures(good), [f.title for f in good]
    bad = _failures(_run(bt.exif_ignoring_hf(), **cases))
    assert sorted(bad) == ["exif_orientation_3", "exif_orientation_6", "exif_orientation_8"]
    assert all("exif_orientation_ignored" in f.title for f in bad.values())
