"""Issue 26: the checks judge a chat VLM server that exposes nothing (no logprobs, no gauges).

Against the servers of ``tests/fakes/chat_vlm_server.py`` reached through ``openai:``: the clean
one passes ``image_cache_isolation``, ``multi_turn_consistency`` and ``serving_streaming`` with no
warning, and each broken one fails the check its bug belongs to, on black-box evidence (known-answer
images, cache-busting reorders, disconnecting more streams than the server holds), which each
finding names as its method.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from mmchaos.checks.integration.image_cache_isolation import ImageCacheIsolation
from mmchaos.checks.integration.multi_turn_consistency import MultiTurnConsistency
from mmchaos.checks.serving.streaming import ServingStreaming
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Finding, Verdict
from mmchaos.targets import load_target
from mmchaos.targets.base import Target
from tests.fakes.chat_vlm_server import ChatServerConfig, chat_vlm_server
from tests.support import run_check_class

pytestmark = pytest.mark.integration

DATA = make_shapes(6, seed=5)
STREAMING: dict[str, Any] = {"requests": 2, "max_tokens": 8, "load_requests": 4, "concurrency": 2,
                             "disconnect_max_tokens": 2000, "release_timeout_s": 1.5,
                             "max_probe_streams": 8}  # fmt: skip
EASY = {"ttft_slo_ms": 2_000.0, "tpot_slo_ms": 2_000.0}


@contextmanager
def served(config: ChatServerConfig) -> Iterator[Target]:
    with chat_vlm_server(config) as url:
        target = load_target(f"openai:{url}")
        try:
            yield target
        finally:
            target.close()


def cache_isolation(target: Target) -> Finding:
    [finding] = run_check_class(ImageCacheIsolation, target, {}, data=DATA)
    return finding


def multi_turn(target: Target) -> Finding:
    [finding] = run_check_class(MultiTurnConsistency, target, {}, data=DATA)
    return finding


def disconnect(target: Target, params: dict[str, Any] | None = None) -> Finding:
    found = run_check_class(ServingStreaming, target, {**STREAMING, **(params or {})}, EASY, data=DATA)
    return next(f for f in found if f.title.startswith("disconnect mid-stream"))


@pytest.mark.check_contract("image_cache_isolation", "clean")
@pytest.mark.check_contract("multi_turn_consistency", "clean")
@pytest.mark.check_contract("serving_streaming", "clean")
def test_the_clean_server_without_logprobs_or_gauges_passes_all_three_with_no_warning() -> None:
    config = ChatServerConfig()
    with served(config) as target:
        found = [cache_isolation(target), multi_turn(target), disconnect(target)]
    assert [f.verdict for f in found] == [Verdict.PASS] * 3, [(f.title, f.message) for f in found]
    assert all(f.evidence["method"] == "black-box probe" for f in found), [f.evidence.get("method") for f in found]
    assert found[0].metrics["with_logprobs"] == 0.0
    assert found[2].title.startswith("disconnect mid-stream: the slot was given back")
    assert found[2].metrics["capacity"] == config.slots


@pytest.mark.check_contract("image_cache_isolation", "broken")
def test_a_response_cache_keyed_on_the_prompt_text_fails_cache_isolation() -> None:
    with served(ChatServerConfig(cache="prompt_text")) as target:
        finding = cache_isolation(target)
    assert finding.verdict == Verdict.FAIL, (finding.title, finding.message)
    assert finding.evidence["method"] == "black-box probe"
    assert finding.metrics["echo_passes_same_text"] >= 2 and finding.metrics["echoes_same_image"] == 0
    assert "prompt text" in (finding.message or "")
    echo = finding.evidence["echoes"][0]
    assert echo["answer"] == echo["earlier_answer"] and echo["answer"] != echo["right_answer"]


def test_a_response_cache_keyed_on_the_prompt_text_fails_multi_turn_too() -> None:
    # Chats that differ only in their last image share their text: the cache answers about chat 1's image.
    with served(ChatServerConfig(cache="prompt_text")) as target:
        finding = multi_turn(target)
    assert finding.verdict == Verdict.FAIL, (finding.title, finding.message)
    assert finding.metrics["stale_last_answers"] >= 1


@pytest.mark.check_contract("serving_streaming", "broken")
def test_a_server_that_leaks_the_slot_of_every_disconnected_stream_fails() -> None:
    with served(ChatServerConfig(leak_slots=True)) as target:
        finding = disconnect(target)
    assert finding.verdict == Verdict.FAIL, (finding.title, finding.message)
    assert finding.title == "disconnect mid-stream: the slot was not given back"
    assert finding.evidence["method"] == "black-box probe"
    assert finding.metrics["capacity"] == 4 and finding.metrics["admitted_after"] < 4


@pytest.mark.check_contract("multi_turn_consistency", "broken")
def test_a_server_answering_about_the_first_image_of_the_chat_fails_multi_turn() -> None:
    with served(ChatServerConfig(stale_image="first")) as target:
        finding = multi_turn(target)
        isolation = cache_isolation(target)
    assert finding.verdict == Verdict.FAIL, (finding.title, finding.message)
    assert finding.evidence["method"] == "black-box probe"
    assert finding.metrics["stale_last_answers"] == finding.metrics["chats"]
    assert isolation.verdict == Verdict.PASS, isolation.title  # one image a request: nothing stale there


def test_the_leaking_and_stale_servers_are_clean_for_the_other_checks() -> None:
    with served(ChatServerConfig(leak_slots=True)) as target:
        assert [cache_isolation(target).verdict, multi_turn(target).verdict] == [Verdict.PASS] * 2
    with served(ChatServerConfig(stale_image="first")) as target:
        assert disconnect(target).verdict == Verdict.PASS


def test_a_model_that_answers_two_open_questions_alike_is_not_a_cache() -> None:
    # "What is in this image?" and "Describe the picture" get the same description from the clean
    # server: without logprobs that used to warn; the known-answer probe does not count it.
    with served(ChatServerConfig()) as target:
        finding = cache_isolation(target)
    assert finding.verdict == Verdict.PASS and finding.metrics["echoes_same_image"] == 0


def test_a_capacity_above_the_probe_bound_is_not_called_released() -> None:
    with served(ChatServerConfig(slots=6)) as target:
        finding = disconnect(target, {"max_probe_streams": 3})
    assert finding.verdict == Verdict.WARN, (finding.title, finding.message)
    assert "given back" not in finding.title and finding.evidence["method"] == "black-box probe"
