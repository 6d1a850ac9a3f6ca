"""``context_boundary`` when the endpoint states no context limit (issue 20: behind a gateway that
strips the ``mmchaos`` block of ``/v1/models`` the check became a skip with no reason, and the
warning that fails ``--strict`` was lost). The limit is probed by doubling and bisection within a
bounded request count, and the evidence says where it came from.

The endpoints are FAKE OpenAI-compatible embedding servers on loopback (tests/fakes/openai_server.py)
with a word-counted text limit: one that cuts longer texts silently, one that refuses them.
"""

from __future__ import annotations

from typing import Any

import pytest

from mmchaos.checks.engine.context_boundary import ContextBoundary
from mmchaos.checks.engine.context_probe import probe_limit
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Finding, Verdict
from mmchaos.targets.openai_http import OpenAITarget
from tests.fakes.openai_server import FakeConfig, fake_openai_server
from tests.support import run_check_class

DATA = make_shapes(8, seed=1)


@pytest.mark.parametrize("limit", [3, 16, 32, 64, 77, 512, 1024, 8192])
def test_the_probe_finds_common_limits_within_twelve_requests(limit: int) -> None:
    found = probe_limit(lambda n: (n <= limit, ""), floor=3, max_requests=12)
    assert found.limit == limit and found.outcome == "found"
    assert found.requests <= 12 and len(found.tried) == found.requests


def test_the_probe_stops_at_its_budget_and_says_what_it_reached() -> None:
    calls: list[int] = []

    def fits(n: int) -> tuple[bool, str]:
        calls.append(n)
        return n <= 1000, ""

    found = probe_limit(fits, floor=3, max_requests=9)
    assert len(calls) == found.requests == 9 and found.outcome == "budget" and found.limit is None
    assert found.fits is not None and found.cut is not None and found.fits <= 1000 < found.cut
    early = probe_limit(lambda n: (n <= 1000, ""), floor=3, max_requests=3)  # still doubling
    assert early.requests == 3 and early.fits == 64 and early.cut is None
    assert probe_limit(lambda n: (True, ""), floor=3, ceiling=4096).outcome == "no_limit"
    assert probe_limit(lambda n: (False, ""), floor=3).outcome == "never_fits"


def run_against(config: FakeConfig, params: dict[str, Any] | None = None) -> dict[str, Finding]:
    with fake_openai_server(config) as url:
        target = OpenAITarget.connect(url, capabilities=["embed_text"])  # a gateway's listing: no metadata
        try:
            assert target.max_text_tokens == (config.max_model_len or None)
            findings = run_check_class(ContextBoundary, target, params or {}, data=DATA)
        finally:
            target.close()
    return {f.evidence["part"]: f for f in findings}


@pytest.mark.check_contract("context_boundary", "broken")
def test_silent_truncation_behind_a_gateway_is_still_a_warning_with_the_probed_limit() -> None:
    parts = run_against(FakeConfig(image_forms=(), chat=False, text_limit=40))
    beyond = parts["beyond"]
    assert beyond.verdict == Verdict.WARN  # what fails a --strict run
    assert "probed limit of 40 tokens" in beyond.title
    assert beyond.evidence["limit_source"] == "probed" and beyond.evidence["limit"] == 40
    probe = beyond.evidence["limit_probe"]
    assert probe["outcome"] == "found" and probe["requests"] <= 12
    assert parts["within"].verdict == Verdict.PASS and parts["within"].evidence["limit_source"] == "probed"


@pytest.mark.check_contract("context_boundary", "clean")
def test_an_endpoint_that_refuses_over_long_texts_passes_at_its_probed_limit() -> None:
    parts = run_against(FakeConfig(image_forms=(), chat=False, text_limit=40, over_limit="refuse"))
    assert all(f.verdict == Verdict.PASS for f in parts.values()), [f.title for f in parts.values()]
    beyond = parts["beyond"]
    assert "rejected with a typed error" in beyond.title and beyond.evidence["limit_source"] == "probed"
    assert any("maximum context length" in t["outcome"] for t in beyond.evidence["limit_probe"]["tried"])


def test_a_limit_the_probe_cannot_find_is_a_warning_that_says_so() -> None:
    parts = run_against(FakeConfig(image_forms=(), chat=False, text_limit=1000), {"probe_requests": 8})
    [unknown] = parts.values()
    assert unknown.verdict == Verdict.WARN and unknown.evidence["limit_source"] == "unknown"
    assert "between 513 and 1024 tokens when its 8 probe requests ran out" in unknown.title
    assert "probe_requests" in unknown.suggestion
    no_limit = run_against(FakeConfig(image_forms=(), chat=False), {"probe_max_tokens": 256})
    [read] = no_limit.values()
    assert read.verdict == Verdict.PASS and "read in full" in read.title


def test_a_vllm_cards_max_model_len_is_the_stated_limit() -> None:
    parts = run_against(FakeConfig(image_forms=(), chat=False, text_limit=40, max_model_len=40))
    beyond = parts["beyond"]
    assert beyond.verdict == Verdict.WARN and "the model's own limit of 40 tokens" in beyond.title
    assert beyond.evidence["limit_source"] == "metadata" and beyond.evidence["limit_probe"] is None
