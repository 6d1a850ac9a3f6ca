"""``serving_streaming`` passes an honest generative target served by the reference server (and the
same server reached through ``openai:``, and a tiny transformers VLM), and fails one broken thing
at a time: a stream that drops its last delta, a model call that cannot be stopped when the client
leaves (the slot stays taken), a first token far slower than its objective."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from mmchaos.checks import REGISTRY
from mmchaos.checks.serving.streaming import ServingStreaming, StreamRecord, parse_sse
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Finding, Verdict
from mmchaos.server import ServerConfig, ServerThread
from mmchaos.targets import load_target
from mmchaos.targets.base import Target
from mmchaos.targets.generation import GenerationParams
from tests.fakes.generative import DropLastDeltaTarget, SlowStreamTarget, UninterruptibleStreamTarget
from tests.fakes.openai_server import FakeConfig, fake_openai_server
from tests.fakes.targets import HashEmbedTarget
from tests.support import run_check_class

pytestmark = pytest.mark.integration

DATA = make_shapes(8, seed=5)
SMALL: dict[str, Any] = {"requests": 2, "max_tokens": 8, "load_requests": 6, "concurrency": 2,
                         "disconnect_max_tokens": 2000, "release_timeout_s": 5.0}  # fmt: skip
#: Objectives far above what these targets need: the latency finding is not a timing test here.
EASY = {"ttft_slo_ms": 10_000.0, "tpot_slo_ms": 5_000.0}


def run(target: Target, params: dict[str, Any] | None = None, gate: dict[str, Any] | None = None) -> list[Finding]:
    return run_check_class(ServingStreaming, target, {**SMALL, **(params or {})}, {**EASY, **(gate or {})}, data=DATA)


def by_title(findings: list[Finding]) -> dict[str, Finding]:
    return {f.title.split(":")[0]: f for f in findings}


def test_registered_and_needs_generate() -> None:
    assert REGISTRY.get("serving_streaming") is ServingStreaming
    assert ServingStreaming().missing_capabilities(HashEmbedTarget()) is not None


@pytest.mark.check_contract("serving_streaming", "clean")
def test_an_honest_streaming_target_passes() -> None:
    found = by_title(run(SlowStreamTarget(delay=0.005)))
    assert set(found) == {"streaming equivalence", "stream latency under load (6 streams, concurrency 2)",
                          "disconnect mid-stream"}  # fmt: skip
    assert all(f.verdict == Verdict.PASS for f in found.values()), [(f.title, f.message) for f in found.values()]
    latency = found["stream latency under load (6 streams, concurrency 2)"].metrics
    assert latency["requests"] == 6 and latency["errors"] == 0 and latency["goodput_ratio"] == 1.0
    assert 0 < latency["ttft_p50_ms"] <= latency["ttft_p95_ms"] and latency["tpot_p50_ms"] > 0
    disconnect = found["disconnect mid-stream"]
    assert disconnect.metrics["released"] == 1.0 and disconnect.evidence["method"] == "gauge"
    assert disconnect.title.endswith("(gauge)")


@pytest.mark.check_contract("serving_streaming", "broken")
def test_a_stream_that_drops_its_last_delta_fails_equivalence() -> None:
    found = by_title(run(DropLastDeltaTarget(), {"load_requests": 0, "disconnect": False}))
    eq = found["streaming equivalence"]
    assert eq.verdict == Verdict.FAIL and eq.metrics["mismatches"] == 2
    first = eq.evidence["requests"][0]
    assert first["streamed_chars"] < first["non_streamed_chars"]


@pytest.mark.check_contract("serving_streaming", "broken")
def test_a_model_call_that_outlives_its_client_fails_the_disconnect_probe() -> None:
    target = UninterruptibleStreamTarget(delay=0.005, hold_s=3.0)
    found = by_title(run(target, {"load_requests": 0, "release_timeout_s": 0.5}))
    assert found["streaming equivalence"].verdict == Verdict.PASS
    probe = found["disconnect mid-stream"]
    assert probe.verdict == Verdict.FAIL, probe.message
    assert probe.metrics["released"] == 0.0 and "holds the slot" in probe.message
    assert probe.evidence["method"] == "gauge"  # the reference server exports vllm:num_requests_running
    assert probe.metrics["next_request_ok"] == 1.0  # it is answered once the model call ends


class SlowFirstTokenTarget(SlowStreamTarget):
    """Broken for latency: half a second before its first delta (a prefill stall)."""

    def generate_stream(
        self, prompt: Any, images: Sequence[Any] = (), params: GenerationParams | None = None
    ) -> Iterator[str]:
        time.sleep(0.5)
        yield from super().generate_stream(prompt, images, params)


def test_a_slow_first_token_fails_the_latency_objective() -> None:
    found = by_title(run(SlowFirstTokenTarget(delay=0.001), {"disconnect": False, "requests": 1},
                         {"ttft_slo_ms": 50.0}))  # fmt: skip
    latency = next(f for t, f in found.items() if t.startswith("stream latency"))
    assert latency.verdict == Verdict.FAIL
    assert latency.metrics["goodput_ratio"] == 0.0 and latency.metrics["ttft_p50_ms"] >= 500


def test_through_openai_against_the_reference_server() -> None:
    with ServerThread(SlowStreamTarget(delay=0.005), ServerConfig()) as srv:
        client = load_target(f"openai:{srv.base_url}")
        try:
            found = run(client)
        finally:
            client.close()
    assert [f.verdict for f in found] == [Verdict.PASS] * 3, [(f.title, f.message) for f in found]


def test_a_stream_without_done_is_not_ok() -> None:
    rec = StreamRecord(status=200)
    parse_sse(iter(['data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}', ""]), rec, time.perf_counter())
    assert rec.text == "hi" and not rec.done and not rec.ok


def test_a_stream_ending_with_its_finish_reason_and_no_done_is_measured() -> None:
    """transformers serve's stream shape: every measurement is real, none a placeholder."""
    with fake_openai_server(FakeConfig(stream_fault="no_done")) as url:
        client = load_target(f"openai:{url}")
        try:
            # the disconnect probe is left out here: on this gauge-less fake the black-box slot probe
            # sometimes reports "not given back" (a false positive, open on issue 26)
            equivalence, latency = run(client, {"requests": 3, "disconnect": False})
        finally:
            client.close()
    assert equivalence.verdict == Verdict.PASS, equivalence.message
    assert equivalence.title.startswith("streaming equivalence: 3/3 greedy streams")
    assert equivalence.metrics == {"requests": 3.0, "mismatches": 0.0, "failures": 0.0}
    assert latency.verdict == Verdict.PASS, latency.message
    assert latency.metrics["errors"] == 0 and latency.metrics["goodput_ratio"] == 1.0
    assert all(v >= 0 for v in latency.metrics.values()) and latency.metrics["ttft_p95_ms"] > 0
    assert "not measured" not in latency.title


def test_a_cut_stream_fails_and_nothing_unmeasured_is_reported_as_a_number() -> None:
    with fake_openai_server(FakeConfig(stream_fault="truncate")) as url:
        client = load_target(f"openai:{url}")
        try:
            equivalence, latency = run(client, {"disconnect": False})
        finally:
            client.close()
    assert equivalence.verdict == Verdict.FAIL
    assert equivalence.metrics == {"requests": 2.0, "mismatches": 0.0, "failures": 2.0}
    assert "2 could not be compared" in equivalence.title
    assert latency.verdict == Verdict.FAIL and "none of the 6 streams completed" in latency.message
    assert "TTFT p95 not measured" in latency.title and "goodput not measured" in latency.title
    assert not [k for k in latency.metrics if k.endswith("_ms")] and "goodput_ratio" in latency.metrics


def test_a_tiny_transformers_vlm_passes(tmp_path_factory: pytest.TempPathFactory) -> None:
    pytest.importorskip("transformers")
    from mmchaos.targets.tiny_vlms import build_tiny_vlm

    vlm = load_target("hf:" + str(build_tiny_vlm("llava", tmp_path_factory.mktemp("llava"))))
    try:
        found = run(vlm, {"load_requests": 4, "disconnect_max_tokens": 400})
    finally:
        vlm.close()
    equivalence, latency, disconnect = found
    assert [equivalence.verdict, latency.verdict] == [Verdict.PASS] * 2, [(f.title, f.message) for f in found]
    # On an idle machine this 2-layer model can stream all its tokens before the probe's first read
    # returns (the whole stream lands in one recv), so the probe may honestly say it could not leave
    # mid-stream; it must never fail. Leaving mid-stream itself is tested on the slow-stream fakes above.
    assert disconnect.verdict == Verdict.PASS or (
        disconnect.verdict == Verdict.WARN and "finished before the client left" in disconnect.title
    ), (disconnect.title, disconnect.message)
