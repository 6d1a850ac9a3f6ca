"""Step 1 over the whole corpus on the built-in targets: every input judged, and judged right.

The built-in adapters validate arrays and texts before any copy (typed refusals), so every
hostile input must be rejected cleanly or handled correctly. The time budget is measured in
``benchmarks/contract_step.py``, not asserted here.
"""

from __future__ import annotations

import pytest

from mmchaos.checks.base import CheckContext
from mmchaos.checks.contract.contract import Contract
from mmchaos.data import load_dataset
from mmchaos.findings import Finding, Verdict
from mmchaos.targets import load_target

pytestmark = pytest.mark.integration


def _run(uri: str, data: str) -> list[Finding]:
    target = load_target(uri)
    ctx = CheckContext(target=target, dataset=load_dataset(data), seed=0, check_id="contract")
    return list(Contract().run(ctx))


def _judged_and_decoded(findings: list[Finding]) -> dict[str, str]:
    assert not [f for f in findings if f.verdict == Verdict.ERROR], "every input must be judged"
    summary = findings[-1]
    failed = {f.evidence["case"]: f.title for f in findings if f.verdict == Verdict.FAIL}
    passed = summary.evidence["passed"]
    for name in ("zero_byte", "truncated_jpeg", "decompression_bomb", "int32_png_50000x50000", "int32_png_46341x46341"):
        assert passed[name].startswith("rejected"), (name, failed.get(name))
    for name in ("exif_orientation_6", "mode_I16_png", "mode_CMYK_jpeg", "animated_gif"):
        assert passed[name].startswith("handled"), (name, failed.get(name))
    return failed


def test_whole_corpus_on_tiny_clip() -> None:
    pytest.importorskip("torch")
    findings = _run("builtin:tiny-clip", "builtin:shapes?n=8")
    assert findings[-1].metrics["n_cases"] >= 55
    assert _judged_and_decoded(findings) == {}


def test_whole_corpus_on_ppocr() -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    findings = _run("builtin:ppocr", "builtin:textlines?n=4")
    assert _judged_and_decoded(findings) == {}
