"""Step 5 checks: thread safety, determinism, fingerprint match; correct twins pass, broken ones fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmchaos.checks.integration.determinism import Determinism, DeterminismParams
from mmchaos.checks.integration.fingerprint_match import FingerprintMatch, FingerprintMatchGate, FingerprintMatchParams
from mmchaos.checks.integration.thread_safety import ThreadSafety, ThreadSafetyParams
from mmchaos.findings import Verdict
from tests.fakes import broken_targets as bt
from tests.support.integration_checks import LastBitJitterTarget, _run


@pytest.mark.integration
def test_thread_safety_over_http_tolerates_last_bit_differences() -> None:
    from mmchaos.server import ServerThread
    from mmchaos.targets import load_target

    with ServerThread(LastBitJitterTarget()) as srv:
        remote = load_target(f"openai:{srv.base_url}")
        try:
            findings = _run(ThreadSafety(ThreadSafetyParams(threads=4, calls_per_thread=2, encoded=False)), remote)
        finally:
            remote.close()  # type: ignore[attr-defined]
    assert {f.evidence["method"]: f.verdict for f in findings} == {
        "embed_images": Verdict.PASS,
        "embed_texts": Verdict.PASS,
    }
    assert max(f.metrics["max_abs_diff"] for f in findings) > 0.0, "the jitter crossed HTTP and was measured"


@pytest.mark.integration
def test_thread_safety_on_real_models(model_dir: Path) -> None:
    params = ThreadSafetyParams(threads=6, calls_per_thread=4)
    good = {f.evidence["method"]: f.verdict for f in _run(ThreadSafety(params), bt.tiny_clip())}
    assert set(good.values()) == {Verdict.PASS}, good
    bad = {f.evidence["method"]: f for f in _run(ThreadSafety(params), bt.shared_buffer())}
    assert bad["embed_images"].verdict == Verdict.FAIL and bad["embed_encoded_images"].verdict == Verdict.FAIL
    assert bad["embed_texts"].verdict == Verdict.PASS


@pytest.mark.check_contract("determinism", "clean")
@pytest.mark.integration
def test_determinism_passes_a_deterministic_target_in_and_across_processes() -> None:
    findings = _run(Determinism(), bt.ContractSafeTarget())
    assert [(f.evidence["mode"], f.verdict) for f in findings] == [
        ("in_process", Verdict.PASS),
        ("cross_process", Verdict.PASS),
    ]
    assert findings[1].metrics["max_abs_diff_this_process_vs_worker"] == 0.0


@pytest.mark.integration
def test_determinism_reports_a_target_that_cannot_load_in_a_worker() -> None:
    class NotLoadable(bt.ContractSafeTarget):
        uri = "py:tests.no_such_module:factory"

    findings = _run(Determinism(DeterminismParams(start_timeout_s=60.0)), NotLoadable())
    assert [f.verdict for f in findings] == [Verdict.PASS, Verdict.ERROR]
    assert "py:tests.no_such_module:factory" in findings[1].title
    assert "in a worker process by its URI" in findings[1].message and "no_such_module" in findings[1].message


def test_determinism_catches_dropout_left_on(model_dir: Path) -> None:
    findings = _run(Determinism(DeterminismParams(samples=8, cross_process=False)), bt.dropout_on())
    assert [f.verdict for f in findings] == [Verdict.FAIL]
    assert "twice in this process: outputs differ" in findings[0].title
    good = _run(Determinism(DeterminismParams(samples=8, cross_process=False)), bt.tiny_clip())
    assert [f.verdict for f in good] == [Verdict.PASS]


@pytest.mark.integration
def test_determinism_across_processes_on_a_real_model(model_dir: Path) -> None:
    findings = _run(Determinism(DeterminismParams(samples=8)), bt.tiny_clip())
    assert [f.verdict for f in findings] == [Verdict.PASS, Verdict.PASS], [f.title for f in findings]


@pytest.mark.check_contract("fingerprint_match", "clean")
def test_fingerprint_match_passes_matching_components(model_dir: Path, tmp_path: Path) -> None:
    lock = tmp_path / "lock.json"
    lock.write_text(json.dumps({"target": {"fingerprint": bt.tiny_clip().fingerprint().to_dict()}}))
    [f] = _run(FingerprintMatch(FingerprintMatchParams(lock=str(lock), probe=bt.is_trained(model_dir))), bt.tiny_clip())
    assert f.verdict == Verdict.PASS, f.title
    assert "recorded hashes compared" in f.title and "static consistency checked" in f.title


@pytest.mark.parametrize(
    ("kind", "component", "phrase"),
    [
        ("processor_size", "processor", "the vision tower was built for"),
        ("tokenizer_vocab", "tokenizer", "index out of range"),
    ],
)
def test_fingerprint_match_finds_a_mismatch_without_any_record(
    model_dir: Path, tmp_path: Path, kind: str, component: str, phrase: str
) -> None:
    from mmchaos.targets.hf import HFContrastiveTarget

    path = bt.mismatched_dir(kind, tmp_path / kind)
    [f] = _run(FingerprintMatch(), HFContrastiveTarget(str(path)))  # the probe runs too, and must not crash
    assert f.verdict == Verdict.FAIL and f.title.startswith(f"{component} does not belong")
    assert phrase in f.title
    [warned] = _run(
        FingerprintMatch(FingerprintMatchParams(probe=False), FingerprintMatchGate(on_mismatch="warn")),
        HFContrastiveTarget(str(path)),
    )
    assert warned.verdict == Verdict.PASS and warned.title.startswith("warning: ")


@pytest.mark.check_contract("fingerprint_match", "broken")
def test_fingerprint_match_catches_a_normalisation_swap_through_the_lock(model_dir: Path, tmp_path: Path) -> None:
    from mmchaos.targets.hf import HFContrastiveTarget

    lock = tmp_path / "lock.json"
    lock.write_text(json.dumps(bt.tiny_clip().fingerprint().to_dict()))
    path = bt.mismatched_dir("processor_norm", tmp_path / "norm")
    [f] = _run(FingerprintMatch(FingerprintMatchParams(lock=str(lock), probe=False)), HFContrastiveTarget(str(path)))
    assert f.verdict == Verdict.FAIL and "processor hash" in f.title


def test_fingerprint_match_probe_catches_a_normalisation_swap_on_the_trained_model(
    model_dir: Path, tmp_path: Path
) -> None:
    assert bt.is_trained(model_dir), "the zero-shot probe needs the trained built-in tiny-clip"
    from mmchaos.data.shapes import make_shapes as shapes
    from mmchaos.targets.hf import HFContrastiveTarget

    data = shapes(96, seed=0)  # the split and seed training.json's accuracy was measured on
    [good] = _run(FingerprintMatch(), bt.tiny_clip(), data)
    assert good.verdict == Verdict.PASS and good.metrics["accuracy_over_chance"] >= 3.0
    assert good.metrics["reference_accuracy"] >= 0.9
    path = bt.mismatched_dir("processor_norm", tmp_path / "norm")
    [bad] = _run(FingerprintMatch(), HFContrastiveTarget(str(path)), data)
    assert bad.verdict == Verdict.FAIL and "below the" in bad.title and "training.json" in bad.title
    other = _run(FingerprintMatch(), HFContrastiveTarget(str(path)), shapes(96, seed=5))[0]
    assert "reference_accuracy" not in other.metrics, "a record measured on other data is not compared"


@pytest.mark.integration
def test_new_steps_run_through_the_runner_and_reports(tmp_path: Path) -> None:
    from mmchaos.report import write_reports
    from mmchaos.runner import RunConfig, run_suite
    from mmchaos.store import RunStore
    from mmchaos.suites import SuiteSpec

    suite = SuiteSpec.model_validate(
        {
            "name": "t",
            "checks": [
                {"check": "contract", "params": {"cases": ["exif", "zero_byte", "int32_*", "text_*"]}},
                {"check": "thread_safety", "params": {"threads": 4, "calls_per_thread": 2}},
                {"check": "determinism", "params": {"samples": 4}},
                {"check": "fingerprint_match"},
                {"check": "precision"},
            ],
        }
    )
    cfg = RunConfig(target="py:tests.fakes.broken_targets:exif_ignoring", suite=suite, data="builtin:shapes?n=8")
    with RunStore(tmp_path / "runs.db") as store:
        result = run_suite(cfg, store)
        results = write_reports(store, result.run_id, tmp_path / "report")
    steps = {f.step.value for f in result.findings}
    assert steps == {1, 4, 5}
    exif = [f for f in result.findings if f.check == "contract" and f.verdict == Verdict.FAIL]
    assert len(exif) == 7 and not result.gates_passed
    assert (tmp_path / "report" / "report.html").is_file()
    assert any(s["step"] == 1 and s["status"] != "not available in this version" for s in results["steps"])
    skipped = [f for f in result.findings if f.check == "precision"]
    assert skipped[0].verdict == Verdict.SKIPPED and "torch_module" in skipped[0].message
    saved = {p.name for p in (tmp_path / "report").rglob("contract-exif_orientation_*.jpg")}
    assert len(saved) == 7, "every failing input is saved with the report"
