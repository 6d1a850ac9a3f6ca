"""``mmchaos serve`` over a generative VLM: a tiny LLaVA built from config here (no downloads), served
on a real loopback port and read through mmchaos's own ``openai:`` target, must answer exactly
what the model answers in-process: the same greedy text, the same text streamed, the same token
counts, cuts and seeds."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from mmchaos.server import ServerConfig, ServerThread
from mmchaos.targets import load_target
from mmchaos.targets.generation import GenerationParams, Message
from mmchaos.targets.hf_vlm import HFVisionLanguageTarget
from mmchaos.targets.openai_http import OpenAITarget
from mmchaos.targets.tiny_vlms import build_tiny_vlm

pytestmark = pytest.mark.integration

RNG = np.random.default_rng(11)
IMG = RNG.integers(0, 255, (40, 50, 3), dtype=np.uint8)
OTHER = RNG.integers(0, 255, (36, 44, 3), dtype=np.uint8)
GREEDY = GenerationParams(max_new_tokens=10)
CHAT = [
    Message("user", (IMG, "What is in the first picture?")),
    Message("assistant", "A square."),
    Message("user", ("And here?", OTHER, "Compare.")),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HFVisionLanguageTarget, OpenAITarget, str]]:
    pytest.importorskip("transformers")
    path = build_tiny_vlm("llava", tmp_path_factory.mktemp("llava"))
    vlm = load_target(f"hf:{path}")
    assert isinstance(vlm, HFVisionLanguageTarget)
    with ServerThread(vlm, ServerConfig(model_name="tiny-llava")) as srv:
        client = load_target(f"openai:{srv.base_url}")
        assert isinstance(client, OpenAITarget)
        yield vlm, client, srv.url
        client.close()
    vlm.close()


def _png_url(image: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny-llava", **body}, timeout=60)


def test_the_served_model_says_it_generates(served: tuple[HFVisionLanguageTarget, OpenAITarget, str]) -> None:
    _, client, _ = served
    assert client.capabilities == {"generate"}


def test_greedy_text_over_http_equals_in_process(served: tuple[HFVisionLanguageTarget, OpenAITarget, str]) -> None:
    vlm, client, _ = served
    for request in ("Describe the picture.", CHAT):
        images = [IMG] if isinstance(request, str) else []
        local = vlm.generate(request, images, GREEDY)
        remote = client.generate(request, images, GREEDY)
        assert remote.text == local.text and remote.finish_reason == local.finish_reason
        assert remote.prompt_tokens == local.prompt_tokens  # usage counts the model's own tokens
        assert remote.logprobs == pytest.approx(local.logprobs, abs=1e-6)


def test_streamed_deltas_concatenate_to_the_same_text(served: tuple[HFVisionLanguageTarget, OpenAITarget, str]) -> None:
    vlm, client, _ = served
    for request in ("Describe the picture.", CHAT):
        images = [IMG] if isinstance(request, str) else []
        local = vlm.generate(request, images, GREEDY).text
        deltas = list(client.generate_stream(request, images, GREEDY))
        assert "".join(deltas) == local


def test_max_tokens_cut_gives_finish_reason_length(served: tuple[HFVisionLanguageTarget, OpenAITarget, str]) -> None:
    vlm, client, url = served
    long = client.generate("Describe the picture.", [IMG], GenerationParams(max_new_tokens=12))
    short = client.generate("Describe the picture.", [IMG], GenerationParams(max_new_tokens=3))
    assert short.finish_reason == "length"
    local = vlm.generate("Describe the picture.", [IMG], GenerationParams(max_new_tokens=3))
    assert short.text == local.text and long.text.startswith(short.text)
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _png_url(IMG)}},
                                                       {"type": "text", "text": "Describe the picture."}]}],
            "max_tokens": 3, "temperature": 0}  # fmt: skip
    answer = _post(url, body).json()
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 3
    assert answer["usage"]["total_tokens"] == answer["usage"]["prompt_tokens"] + 3


def test_seeded_sampling_and_n_over_http_replay_in_process(
    served: tuple[HFVisionLanguageTarget, OpenAITarget, str],
) -> None:
    vlm, client, _ = served
    params = GenerationParams(max_new_tokens=8, temperature=0.9, seed=5, n=3)
    local = vlm.generate("Describe.", [IMG], params)
    remote = client.generate("Describe.", [IMG], params)
    assert [c.text for c in remote.completions] == [c.text for c in local.completions]
    assert len({c.text for c in remote.completions}) > 1  # n samples, not n copies


def test_stop_strings_cut_the_text(served: tuple[HFVisionLanguageTarget, OpenAITarget, str]) -> None:
    vlm, client, _ = served
    full = vlm.generate("Describe.", [IMG], GenerationParams(max_new_tokens=12)).text
    stop = full[3:5]
    params = GenerationParams(max_new_tokens=12, stop=(stop,))
    local = vlm.generate("Describe.", [IMG], params)
    remote = client.generate("Describe.", [IMG], params)
    assert remote.text == local.text == full[: full.find(stop)]
    assert remote.finish_reason == "stop"
    assert "".join(client.generate_stream("Describe.", [IMG], params)) == local.text


def test_token_ids_as_vllm_sends_them(served: tuple[HFVisionLanguageTarget, OpenAITarget, str]) -> None:
    vlm, _, url = served
    local = vlm.generate("Describe.", [IMG], GREEDY)
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _png_url(IMG)}},
                                                       {"type": "text", "text": "Describe."}]}],
            "max_tokens": 10, "temperature": 0, "logprobs": True, "return_tokens_as_token_ids": True}  # fmt: skip
    entries = _post(url, body).json()["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in entries] == [f"token_id:{i}" for i in local.token_ids or ()]


def test_the_stream_is_openai_sse_ending_with_done(served: tuple[HFVisionLanguageTarget, OpenAITarget, str]) -> None:
    vlm, _, url = served
    local = vlm.generate("Describe.", [IMG], GREEDY)
    content = [{"type": "image_url", "image_url": {"url": _png_url(IMG)}}, {"type": "text", "text": "Describe."}]
    body = {"model": "tiny-llava", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 10,
            "temperature": 0, "messages": [{"role": "user", "content": content}]}  # fmt: skip
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: ") :] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is not None]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == local.finish_reason == "length"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == local.text
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] == 10


def test_vllm_generation_metrics_count_the_requests(served: tuple[HFVisionLanguageTarget, OpenAITarget, str]) -> None:
    _, client, url = served

    def sample(name: str) -> float:
        text = httpx.get(f"{url}/metrics").text
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))

    names = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:e2e_request_latency_seconds_count",
             "vllm:time_to_first_token_seconds_count", "vllm:time_per_output_token_seconds_count",
             "vllm:inter_token_latency_seconds_count")  # fmt: skip
    before = {n: sample(n) for n in names}
    result = client.generate("Describe.", [IMG], GREEDY)
    generated = sample("vllm:generation_tokens_total") - before["vllm:generation_tokens_total"]
    assert generated == len(result.logprobs or ()) == 10  # the model's own token count
    list(client.generate_stream("Describe.", [IMG], GREEDY))
    after = {n: sample(n) for n in names}
    assert after["vllm:e2e_request_latency_seconds_count"] - before["vllm:e2e_request_latency_seconds_count"] == 2
    assert after["vllm:time_to_first_token_seconds_count"] - before["vllm:time_to_first_token_seconds_count"] == 1
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] >= (result.prompt_tokens or 0)
    # A stream's tokens are its text re-counted by the tokenizer, at most max_tokens.
    assert 11 <= after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] <= 20
    assert sample("vllm:num_requests_running") == 0


def test_a_stream_reports_the_same_usage_as_the_answer_without_stream(
    served: tuple[HFVisionLanguageTarget, OpenAITarget, str],
) -> None:
    # LiteLLM forwards a stream's usage for spend tracking: the image tokens count there too.
    vlm, _, url = served
    content = [{"type": "image_url", "image_url": {"url": _png_url(IMG)}}, {"type": "text", "text": "Describe."}]
    body = {"max_tokens": 10, "temperature": 0, "messages": [{"role": "user", "content": content}]}
    plain = _post(url, body).json()["usage"]
    streamed = {**body, "model": "tiny-llava", "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=streamed, timeout=60) as resp:
        events = [line[len("data: ") :] for line in resp.iter_lines() if line.startswith("data: ")]
    usage = json.loads(events[-2])["usage"]
    local = vlm.generate("Describe.", [IMG], GREEDY)
    assert plain["prompt_tokens"] == local.prompt_tokens  # the model's own count, image tokens included
    assert usage == plain
