"""Step 5 checks: thread safety, determinism, fingerprint match; correct twins pass, broken ones fail."""

from __future__ import annotations

from typing import Any

import pytest

from mmchaos.checks.integration.determinism import Determinism
from mmchaos.checks.integration.thread_safety import ThreadSafety, ThreadSafetyParams, max_difference
from mmchaos.findings import Verdict
from tests.fakes import broken_targets as bt
from tests.support.integration_checks import LastBitJitterTarget, _run


def test_max_difference() -> None:
    import numpy as np

    assert max_difference(np.ones(3), np.ones(3)) == 0.0
    assert max_difference(np.ones(3), np.ones(4)) == float("inf")
    assert max_difference(["a", "b"], ["a", "c"]) == 1.0
    assert max_difference(np.array([np.nan]), np.array([np.nan])) == 0.0


@pytest.mark.check_contract("thread_safety", "clean")
def test_thread_safety_passes_a_stateless_target() -> None:
    findings = _run(ThreadSafety(), bt.ContractSafeTarget())
    assert {f.evidence["method"]: f.verdict for f in findings} == {
        "embed_images": Verdict.PASS,
        "embed_encoded_images": Verdict.PASS,
        "embed_texts": Verdict.PASS,
    }


@pytest.mark.check_contract("thread_safety", "broken")
def test_thread_safety_fails_a_shared_preprocessing_buffer() -> None:
    findings = {f.evidence["method"]: f for f in _run(ThreadSafety(), bt.SharedBufferNumpyTarget())}
    bad = findings["embed_images"]
    assert bad.verdict == Verdict.FAIL and "results differ from sequential" in bad.title
    assert bad.evidence["worst_mismatch"]["batch"], "the finding names the batch"
    assert bad.artifacts[0].name.endswith(".npz")
    assert findings["embed_texts"].verdict == Verdict.PASS


def test_thread_safety_passes_outputs_that_differ_in_the_last_bits() -> None:
    # Issue 11: bit-equality failed a correct server whose dynamic batching changes floats by 1e-7.
    findings = _run(ThreadSafety(ThreadSafetyParams(threads=4, calls_per_thread=3)), LastBitJitterTarget())
    by_method = {f.evidence["method"]: f for f in findings}
    assert {m: f.verdict for m, f in by_method.items()} == {
        "embed_images": Verdict.PASS,
        "embed_encoded_images": Verdict.PASS,
        "embed_texts": Verdict.PASS,
    }
    for f in findings:  # the deviation is measured and reported, not hidden
        assert 0.0 < f.metrics["max_abs_diff"] < 1e-5, f.metrics
        assert 0.0 <= f.metrics["max_deviation"] < 1e-6 and f.metrics["top1_agreement"] == 1.0
        assert f.metrics["sequential_noise"] > 0.0
        assert "1 - cosine" in f.gate


def test_thread_safety_gate_can_still_demand_bit_equality() -> None:
    from mmchaos.checks.integration.thread_safety import ThreadSafetyGate

    strict = ThreadSafety(
        ThreadSafetyParams(threads=2, calls_per_thread=1), ThreadSafetyGate(max_cosine_deviation=0.0, max_abs_diff=0.0)
    )
    findings = _run(strict, LastBitJitterTarget())
    assert {f.verdict for f in findings} == {Verdict.ERROR}  # two sequential runs already differ
    assert all("inconclusive" in f.title for f in findings)


def test_thread_safety_shared_buffer_fails_with_the_deviation_reported() -> None:
    findings = {f.evidence["method"]: f for f in _run(ThreadSafety(), bt.SharedBufferNumpyTarget())}
    bad = findings["embed_images"]
    assert bad.verdict == Verdict.FAIL
    assert bad.metrics["max_deviation"] > 1e-4 and bad.metrics["mismatches"] > 0


def test_thread_safety_reports_exceptions_with_their_trace() -> None:
    class NotReentrant(bt.ContractSafeTarget):
        """Like the tokenizers library: a second concurrent caller finds the state borrowed."""

        def __init__(self) -> None:
            super().__init__()
            import threading

            self._busy = threading.Lock()

        def embed_texts(self, texts: Any) -> Any:
            import time

            if not self._busy.acquire(blocking=False):
                raise RuntimeError("Already borrowed")
            try:
                time.sleep(0.002)
                return super().embed_texts(texts)
            finally:
                self._busy.release()

    findings = {f.evidence["method"]: f for f in _run(ThreadSafety(ThreadSafetyParams(encoded=False)), NotReentrant())}
    bad = findings["embed_texts"]
    assert bad.verdict == Verdict.FAIL and "RuntimeError: Already borrowed" in bad.title
    assert "Traceback" in bad.evidence["first_exception"]["traceback"]
    assert "embed_texts" in bad.evidence["first_exception"]["traceback"]


def test_worker_spec_overlays_the_targets_load_options() -> None:
    from mmchaos.executors.jobs import worker_spec

    target = bt.ContractSafeTarget()
    target.load_options = {"device": "cpu", "dtype": "float32"}
    spec = worker_spec(target, {"dtype": "float16"}, threads=None)
    assert (spec.uri, spec.options, spec.threads) == (target.uri, {"device": "cpu", "dtype": "float16"}, None)


@pytest.mark.check_contract("determinism", "broken")
def test_determinism_catches_process_salted_hashing_only_across_processes() -> None:
    findings = _run(Determinism(), bt.ProcessSaltedTarget())
    assert [f.verdict for f in findings] == [Verdict.PASS, Verdict.FAIL]
    assert "in two worker processes: outputs differ" in findings[1].title
    assert findings[1].evidence["worst"]["method"] == "embed_texts"
