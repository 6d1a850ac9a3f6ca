"""Step 5 on generative targets: thread safety and determinism of ``generate``.

Honest fakes (tests/fakes/generative.py) pass; broken twins fail: request state shared between
threads (thread_safety), sampling that ignores the seed and greedy answers that change once a
request was seen (determinism). The built-in tiny VLM passes both (integration tier).
"""

from __future__ import annotations

from typing import Any

from mmchaos.checks.integration.determinism import Determinism, DeterminismParams
from mmchaos.checks.integration.thread_safety import ThreadSafety, ThreadSafetyParams
from mmchaos.findings import Finding, Verdict
from tests.fakes import generative as gf
from tests.support import run_check
from tests.support.generation_integration import DATA, _by


def test_thread_safety_generate_passes_a_stateless_vlm() -> None:
    found = _by(
        run_check(ThreadSafety(ThreadSafetyParams(threads=6, calls_per_thread=4)), gf.WordsTarget(), DATA), "method"
    )
    assert {m: f.verdict for m, f in found.items()} == {"generate": Verdict.PASS, "generate_sampled": Verdict.PASS}
    assert found["generate"].metrics["calls"] == 24 and found["generate"].metrics["mismatches"] == 0


def test_thread_safety_generate_fails_request_state_shared_between_threads() -> None:
    target = gf.SharedRequestStateTarget()
    found = _by(run_check(ThreadSafety(ThreadSafetyParams(threads=6, calls_per_thread=4)), target, DATA), "method")
    bad = found["generate"]
    assert bad.verdict == Verdict.FAIL and "results differ from sequential" in bad.title
    assert bad.evidence["deviation_unit"] == "character error rate" and bad.evidence["worst_mismatch"]["batch"]
    assert bad.artifacts[0].name.endswith("-generate-batch.npz")


def _determinism(target: Any, **params: Any) -> dict[str, Finding]:
    return _by(run_check(Determinism(DeterminismParams(**params)), target, DATA), "mode")


def test_determinism_generate_passes_greedy_and_seeded_sampling() -> None:
    found = _determinism(gf.WordsTarget(), generate_requests=4)
    assert {m: f.verdict for m, f in found.items()} == {
        "generate_greedy": Verdict.PASS,
        "generate_seeded": Verdict.PASS,
    }, "a generate-only target gets no 'no inputs' skip"
    assert found["generate_seeded"].metrics["mean_distinct_over_seeds"] > 1, "the seeds really sample"
    assert found["generate_greedy"].metrics["max_logprob_diff"] == 0.0


def test_determinism_generate_fails_sampling_that_ignores_the_seed() -> None:
    found = _determinism(gf.UnseededSamplingTarget(), generate_requests=4)
    assert found["generate_greedy"].verdict == Verdict.PASS
    bad = found["generate_seeded"]
    assert bad.verdict == Verdict.FAIL and "seeded sampling twice per seed: completions differ" in bad.title
    assert bad.evidence["differing"][0]["seed"] in (0, 1, 2) and "seed the sampler" in bad.suggestion


def test_determinism_generate_fails_a_greedy_answer_that_changes_once_seen() -> None:
    found = _determinism(gf.WarmCacheTarget(), generate_requests=3, seeds=[])
    assert list(found) == ["generate_greedy"]
    bad = found["generate_greedy"]
    assert bad.verdict == Verdict.FAIL and bad.metrics["differing_requests"] == 3
