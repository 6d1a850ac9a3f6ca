"""``metrics_exposure`` on a chat-only endpoint (issue 20: it was skipped on every generative target).

Against a FAKE vLLM-style chat server on loopback (tests/fakes/openai_server.py; vLLM cannot run
here): plain and streamed chat traffic must move vLLM's chat series, the token counters by at
least the tokens the answers' usage counted. A server that exports no latency histogram fails, and
so does one whose token counters stand still while it answers.
"""

from __future__ import annotations

from typing import Any

import pytest

from mmchaos.checks.observability.metrics_exposure import MetricsExposure
from mmchaos.findings import Finding, Verdict
from mmchaos.targets.openai_http import OpenAITarget
from tests.fakes.openai_server import FakeConfig, fake_openai_server
from tests.support.observability_checks import run


def run_chat(metrics: str, params: dict[str, Any] | None = None) -> tuple[list[Finding], FakeConfig]:
    config = FakeConfig(image_forms=(), metrics=metrics, stream_usage=True)
    with fake_openai_server(config) as url:
        target = OpenAITarget.connect(url, capabilities=["generate"])
        try:
            return run(MetricsExposure, target, {"requests_per_modality": 2, **(params or {})}), config
        finally:
            target.close()


def by_group(findings: list[Finding]) -> dict[str, Finding]:
    return {f.title.split(" ")[0]: f for f in findings}


@pytest.mark.check_contract("metrics_exposure", "clean")
@pytest.mark.parametrize("family", ["vllm", "sglang"])
def test_a_vllm_or_sglang_style_chat_server_passes_with_its_chat_series(family: str) -> None:
    findings, config = run_chat(family)
    assert all(f.verdict == Verdict.PASS for f in findings), [(f.title, f.message) for f in findings]
    groups = by_group(findings)
    assert {"latency", "queue", "tokens"} <= set(groups)
    tokens = groups["tokens"]
    assert tokens.evidence["traffic_kind"] == "chat" and tokens.evidence["conventions"] == [family]
    amounts = tokens.evidence["amounts"]
    assert amounts["answered"] == 4 and amounts["streamed"] == 2 and amounts["without_usage"] == 0
    grew = {r["series"]: r["after"] - (r["before"] or 0) for r in tokens.evidence["series"]}
    assert grew[f"{family}:prompt_tokens_total"] == amounts["prompt_tokens"] > 0  # the answers' usage, summed
    assert grew[f"{family}:generation_tokens_total"] == amounts["completion_tokens"] > 0
    latency = {r["series"] for r in groups["latency"].evidence["series"]}
    assert {f"{family}:e2e_request_latency_seconds_count", f"{family}:time_to_first_token_seconds_count"} <= latency
    assert len(latency) == 3  # and the per-token latency, by the family's own name
    sent = [r["body"] for r in config.requests if r["path"] == "/v1/chat/completions"]
    assert sum(bool(b.get("stream")) for b in sent) == 2 and sum(not b.get("stream") for b in sent) >= 2


@pytest.mark.check_contract("metrics_exposure", "broken")
def test_a_chat_server_without_latency_metrics_fails() -> None:
    findings, _ = run_chat("no_latency")
    latency = by_group(findings)["latency"]
    assert latency.verdict == Verdict.FAIL and "no request-latency metric" in latency.title
    assert "vllm:e2e_request_latency_seconds_count" in latency.evidence["looked_for"]
    assert "vllm:num_requests_running" in latency.evidence["families_seen"]  # it exports something


@pytest.mark.check_contract("metrics_exposure", "broken")
def test_a_chat_server_whose_token_counters_stand_still_fails() -> None:
    findings, _ = run_chat("static_counters")
    groups = by_group(findings)
    assert groups["latency"].verdict == Verdict.PASS  # its histograms count the requests
    tokens = groups["tokens"]
    assert tokens.verdict == Verdict.FAIL
    assert "grew by 0, less than the" in tokens.title and "prompt tokens" in tokens.title
