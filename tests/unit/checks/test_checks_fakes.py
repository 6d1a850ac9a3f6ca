"""Each check against a correct numpy target (passes) and a deliberately broken one (fails)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mmchaos.checks.base import CheckContext
from mmchaos.checks.engine.batch_invariance import BatchInvariance, BatchInvarianceParams
from mmchaos.checks.robustness.missing_modality import MissingModality
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Verdict
from mmchaos.runner import RunConfig, run_suite
from mmchaos.store import RunStore
from mmchaos.suites import SuiteSpec
from tests.fakes import targets as fakes

DATA = make_shapes(16, seed=1)


def _ctx(target: object) -> CheckContext:
    return CheckContext(target=target, dataset=DATA, seed=0, check_id="t")  # type: ignore[arg-type]


def _verdicts(findings: list) -> dict[str, str]:
    return {f.evidence.get("modality") or f.evidence.get("probe") or f.title: f.verdict.value for f in findings}


@pytest.mark.check_contract("batch_invariance", "clean")
def test_batch_invariance_passes_a_correct_target() -> None:
    findings = list(
        BatchInvariance(BatchInvarianceParams(samples=8, batch_sizes=[1, 2, 7])).run(_ctx(fakes.HashEmbedTarget()))
    )
    assert _verdicts(findings) == {"image": "pass", "text": "pass"}
    assert all(f.metrics["max_deviation"] <= 1e-6 for f in findings)


@pytest.mark.check_contract("batch_invariance", "broken")
def test_batch_invariance_fails_a_padding_dependent_target() -> None:
    findings = list(
        BatchInvariance(BatchInvarianceParams(samples=8, batch_sizes=[1, 2, 7])).run(_ctx(fakes.PaddingLeakTarget()))
    )
    verdicts = _verdicts(findings)
    assert verdicts == {"image": "pass", "text": "fail"}
    text = next(f for f in findings if f.evidence["modality"] == "text")
    assert text.metrics["max_deviation_b1"] <= 1e-6 and text.metrics["max_deviation"] > 1e-3
    worst = text.evidence["worst"]
    assert worst["batch_size"] in (2, 7) and -1 in worst["batch"], "the repro names the batch, filler included"


@pytest.mark.check_contract("missing_modality", "clean")
def test_missing_modality_passes_a_correct_target() -> None:
    findings = list(MissingModality().run(_ctx(fakes.HashEmbedTarget())))
    assert findings and all(f.verdict == Verdict.PASS for f in findings)


@pytest.mark.check_contract("missing_modality", "broken")
def test_missing_modality_fails_nan_on_uniform_images() -> None:
    findings = list(MissingModality().run(_ctx(fakes.NaNOnUniformTarget())))
    v = _verdicts(findings)
    assert v["black_image"] == v["white_image"] == v["gray_image"] == "fail"
    assert v["empty_text"] == "pass"
    black = next(f for f in findings if f.evidence["probe"] == "black_image")
    assert black.metrics["nonfinite_values"] > 0 and black.artifacts, "the blank input is saved as evidence"


def test_missing_modality_fails_a_crash_on_empty_text() -> None:
    findings = list(MissingModality().run(_ctx(fakes.CrashOnEmptyTextTarget())))
    empty = next(f for f in findings if f.evidence["probe"] == "empty_text")
    assert empty.verdict == Verdict.FAIL and "IndexError" in empty.message


def _suite(*checks: dict) -> SuiteSpec:
    return SuiteSpec.model_validate({"name": "t", "checks": list(checks)})


def test_runner_turns_a_raising_target_into_an_error_finding(tmp_path: Path) -> None:
    suite = _suite({"check": "batch_invariance", "params": {"samples": 4, "batch_sizes": [1, 2]}})
    cfg = RunConfig(target="py:tests.fakes.targets:padding_leak", suite=suite, data="builtin:shapes?n=8")
    with RunStore(tmp_path / "r.db") as store:
        result = run_suite(cfg, store)
        assert not result.gates_passed
        assert {f.verdict for f in result.findings} == {Verdict.PASS, Verdict.FAIL}

    class Exploding(fakes.HashEmbedTarget):
        def embed_texts(self, texts):  # type: ignore[no-untyped-def]
            raise RuntimeError("CUDA error: device-side assert triggered")

    import tests.fakes.targets as mod

    mod.exploding = lambda: Exploding()  # type: ignore[attr-defined]
    cfg = RunConfig(target="py:tests.fakes.targets:exploding", suite=suite, data="builtin:shapes?n=8")
    with RunStore(tmp_path / "r.db") as store:
        result = run_suite(cfg, store)
    [err] = [f for f in result.findings if f.verdict == Verdict.ERROR]
    assert "device-side assert" in err.message and "Traceback" in err.evidence["traceback"]


def test_runner_skips_checks_the_target_cannot_serve_with_the_reason(tmp_path: Path) -> None:
    suite = _suite(
        {"check": "robustness", "params": {"samples": 4, "perturbations": ["gaussian_noise", "keyboard_typo"]}}
    )
    cfg = RunConfig(target="py:tests.fakes.targets:duck", suite=suite, data="builtin:shapes?n=8")
    with RunStore(tmp_path / "r.db") as store:
        result = run_suite(cfg, store)
    [f] = result.findings
    assert f.verdict == Verdict.SKIPPED and "embed_image+embed_text or read_text" in f.message
    assert result.gates_passed


def test_runner_is_deterministic_by_seed(tmp_path: Path) -> None:
    suite = _suite({"check": "batch_invariance", "params": {"samples": 6, "batch_sizes": [2, 5]}})
    cfg = RunConfig(target="py:tests.fakes.targets:padding_leak", suite=suite, data="builtin:shapes?n=8", seed=5)
    with RunStore(tmp_path / "r.db") as store:
        a = run_suite(cfg, store).findings
        b = run_suite(cfg, store).findings
    assert [f.to_dict() for f in a] == [f.to_dict() for f in b]
    assert np.isfinite([m for f in a for m in f.metrics.values()]).all()


def test_py_target_validation_errors() -> None:
    from mmchaos.errors import TargetLoadError, UnknownNameError
    from mmchaos.targets import load_target

    with pytest.raises(TargetLoadError, match="not a mmchaos Target"):
        load_target("py:tests.fakes.targets:not_a_target")
    with pytest.raises(TargetLoadError, match="cannot import"):
        load_target("py:no_such_module_xyz:factory")
    with pytest.raises(TargetLoadError, match="py:package.module:factory"):
        load_target("py:justamodule")
    with pytest.raises(UnknownNameError, match="builtin:tiny-clip"):
        load_target("builtin:tiny-clp")
    with pytest.raises(UnknownNameError, match="unknown target scheme"):
        load_target("ftp:somewhere")
    duck = load_target("py:tests.fakes.targets:duck")
    assert duck.embed_texts(["a b"]).shape == (1, fakes.DIM) and duck.fingerprint().weights == "duck"
