"""The serving suite's image traffic speaks the image form the ``openai:`` probe found.

Against FAKES of correct OpenAI-compatible embeddings servers on loopback (tests/fakes/openai_server.py),
one per form: vLLM's ``messages``, ``input`` content parts, and data-URL strings in ``input`` (LiteLLM-
and infinity-style; these answer the ``messages`` form with a typed 400).
"""

from __future__ import annotations

from typing import Any

import pytest

from mmchaos.checks.serving.poison import ServingPoison
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Verdict
from mmchaos.targets.openai_http import OpenAITarget
from tests.fakes.openai_server import FakeConfig, fake_openai_server
from tests.support import run_check_class

pytestmark = pytest.mark.integration

DATA = make_shapes(8, seed=3)
FAST: dict[str, Any] = {
    "baseline_s": 0.6,
    "warmup_requests": 4,
    "concurrency": 2,
    "max_recovery_s": 2.0,
    "slo": {"window_s": 0.2, "p99_ms": 1000, "min_window_requests": 2},
    "budget": {"max_requests": 3000, "max_rate": 150, "max_duration_s": 40},
    "payload": {"large_side": 128},
}


def test_poison_on_a_data_url_server_holds_its_steady_state() -> None:
    config = FakeConfig(image_forms=("data_url",), chat=False)
    with fake_openai_server(config) as url:
        target = OpenAITarget.connect(url)
        try:
            assert target.image_input == "data_url"
            findings = run_check_class(
                ServingPoison,
                target,
                {**FAST, "poisons": ["truncated_png", "invalid_json"], "poison_s": 1.0},
                data=DATA,
            )
        finally:
            target.close()
    bad = [f.title for f in findings if f.verdict != Verdict.PASS]
    assert not bad, bad
