"""reference_parity against real built-in models: a deployment with one real pipeline bug fails with
the cause named; the same checkpoint passes; ``validate --reference`` runs it end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mmchaos.checks.base import CheckContext
from mmchaos.checks.integration.reference_parity import ReferenceParity
from mmchaos.data import load_dataset
from mmchaos.findings import Finding, Verdict
from mmchaos.targets import load_target
from mmchaos.targets.base import Target
from tests.fakes import parity as fp

DATA = "builtin:shapes?n=48"


def _run(target: Target, reference: Target) -> dict[str, Finding]:
    ctx = CheckContext(
        target=target, dataset=load_dataset(DATA), seed=0, check_id="reference_parity", reference=reference
    )
    return {f.title.split(" ")[0]: f for f in ReferenceParity().run(ctx)}


@pytest.fixture(scope="module")
def clip() -> Target:
    return load_target("builtin:tiny-clip")


@pytest.mark.check_contract("reference_parity", "broken")
def test_bgr_fed_tiny_clip_fails_naming_channel_order(clip: Target) -> None:
    found = _run(fp.tiny_clip_bgr(), clip)
    assert found["image"].verdict is Verdict.FAIL
    assert found["image"].evidence["cause"] == "channel order swapped (BGR fed as RGB)"
    assert found["zero_shot:"].verdict is Verdict.FAIL
    assert found["zero_shot:"].metrics["reference"] >= 0.9 > found["zero_shot:"].metrics["deployment"] + 0.3


@pytest.mark.check_contract("reference_parity", "broken")
def test_wrong_normalisation_fails_naming_it(clip: Target, tmp_path: Path) -> None:
    broken = load_target(f"hf:{fp.renormalised_clip(tmp_path / 'clip', (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))}")
    found = _run(broken, clip)
    assert found["image"].verdict is Verdict.FAIL
    assert found["image"].evidence["cause"] == "wrong normalisation (mean/std 0.5 (scaled to [-1, 1]))"
    assert "checkpoint's mean/std" in (found["image"].suggestion or "")


@pytest.mark.check_contract("reference_parity", "clean")
def test_the_same_checkpoint_passes(clip: Target) -> None:
    found = _run(load_target("builtin:tiny-clip"), clip)
    assert {k: f.verdict for k, f in found.items()} == {k: Verdict.PASS for k in found}
    assert found["image"].metrics["mean_cosine"] > 0.9999


def test_validate_reference_end_to_end(run_cli: Any, tmp_path: Path) -> None:
    suite = tmp_path / "parity.yaml"
    suite.write_text("name: parity\nchecks:\n  - check: reference_parity\n")
    out = tmp_path / "out"
    argv = ["--suite", str(suite), "--data", DATA, "--store", str(tmp_path / "runs.db"), "--out", str(out)]
    code, _, err = run_cli("validate", "--target", "py:tests.fakes.parity:tiny_clip_bgr", "--reference",
                           "builtin:tiny-clip", *argv)  # fmt: skip
    assert code == 1, err
    results = json.loads((out / "results.json").read_text())
    titles = [f["title"] for f in results["findings"]]
    assert any("channel order swapped" in t for t in titles), titles
    code, _, err = run_cli("validate", "--target", "builtin:tiny-clip", "--reference", "builtin:tiny-clip", *argv)
    assert code == 0, err
    code, _, err = run_cli("validate", "--target", "builtin:tiny-clip", "--reference", "nope:x", *argv)
    assert code == 2 and "nope" in err
