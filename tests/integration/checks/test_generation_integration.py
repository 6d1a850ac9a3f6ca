"""Step 5 on generative targets: thread safety and determinism of ``generate``.

Honest fakes (tests/fakes/generative.py) pass; broken twins fail: request state shared between
threads (thread_safety), sampling that ignores the seed and greedy answers that change once a
request was seen (determinism). The built-in tiny VLM passes both (integration tier).
"""

from __future__ import annotations

import pytest

from mmchaos.checks.integration.determinism import Determinism, DeterminismParams
from mmchaos.checks.integration.thread_safety import ThreadSafety, ThreadSafetyParams
from mmchaos.findings import Verdict
from tests.support import run_check
from tests.support.generation_integration import DATA, _by


@pytest.mark.integration
def test_thread_safety_and_determinism_pass_on_the_builtin_vlm() -> None:
    from mmchaos.targets import load_target

    vlm = load_target("builtin:tiny-vlm")
    ts = _by(
        run_check(ThreadSafety(ThreadSafetyParams(threads=4, calls_per_thread=2, max_new_tokens=4)), vlm, DATA),
        "method",
    )
    assert {m: f.verdict for m, f in ts.items()} == {"generate": Verdict.PASS, "generate_sampled": Verdict.PASS}
    det = _by(
        run_check(Determinism(DeterminismParams(generate_requests=3, max_new_tokens=6, seeds=[0, 1])), vlm, DATA),
        "mode",
    )
    assert {m: f.verdict for m, f in det.items()} == {"generate_greedy": Verdict.PASS, "generate_seeded": Verdict.PASS}
