"""The guards on the generative chat path of the reference server (real uvicorn on loopback), with
small word-generating targets (``tests.fakes.generative``) so each behaviour has an exact answer:
Preflight on images, parameter refusals, admission, the breaker, errors mid-stream, and a client
that disconnects mid-stream giving its slot back."""

from __future__ import annotations

import base64
import io
import json
import socket
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from mmchaos.server import ServerConfig, ServerThread
from mmchaos.targets import load_target
from mmchaos.targets.generation import GenerationParams, Message
from mmchaos.targets.openai_http import EndpointError
from tests.fakes.generative import SlowStreamTarget, WordsTarget

pytestmark = pytest.mark.integration

RED = np.zeros((20, 24, 3), np.uint8)
RED[..., 0] = 200
BLUE = np.zeros((20, 24, 3), np.uint8)
BLUE[..., 2] = 200


def png_url(image: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def chat(url: str, **body: Any) -> httpx.Response:
    body.setdefault("messages", [{"role": "user", "content": "hello there"}])
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)


def metric(url: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.split()[-1])
    return total


def wait_for(condition: Any, seconds: float = 10.0) -> bool:
    """Poll ``condition`` until true or ``seconds`` pass (a bounded wait, not a timing assertion)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return bool(condition())


@pytest.fixture()
def words() -> Iterator[tuple[WordsTarget, str]]:
    target = WordsTarget()
    with ServerThread(target, ServerConfig()) as srv:
        yield target, srv.url


def test_multi_image_multi_turn_messages_reach_the_model_in_order(words: tuple[WordsTarget, str]) -> None:
    _, url = words
    client = load_target(f"openai:{url}/v1")
    conversation = [Message("user", (RED, "first")), Message("assistant", "ok"), Message("user", ("then", BLUE, "x y"))]
    result = client.generate(conversation, params=GenerationParams(max_new_tokens=4))
    assert result.text == "red blue x y" and result.finish_reason == "length"
    # Without a tokenizer to name them, tokens go as vLLM's "token_id:N", which the client reads back.
    assert result.token_ids == tuple(sum(map(ord, w)) for w in ("red", "blue", "x", "y"))
    assert result.logprobs == pytest.approx([-0.1, -0.2, -0.3, -0.4])
    client.close()


def test_a_broken_image_is_refused_by_preflight_before_the_model(words: tuple[WordsTarget, str]) -> None:
    target, url = words
    png = base64.b64decode(png_url(RED).partition(",")[2])
    truncated = "data:image/png;base64," + base64.b64encode(png[: len(png) // 2]).decode()
    content = [{"type": "image_url", "image_url": {"url": truncated}}, {"type": "text", "text": "what?"}]
    for stream in (False, True):
        resp = chat(url, messages=[{"role": "user", "content": content}], stream=stream)
        assert resp.status_code == 400, resp.text
        assert resp.headers["content-type"].startswith("application/json")  # refused before any event
        assert resp.json()["error"]["code"] in ("truncated_image", "bad_image")
        assert resp.json()["error"]["param"] == "messages[0].content[0].image_url.url"
    assert target.calls == 0


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"n": 2, "stream": True}, "n_unsupported"),
        ({"temperature": -1}, "bad_generation_params"),
        ({"top_p": 0}, "bad_generation_params"),
        ({"stop": [""]}, "bad_generation_params"),
        ({"max_tokens": 5000}, "max_tokens_too_large"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "bad_messages"),
        ({"seed": 2**70}, "invalid_request"),
        # A temperature so small that logits / temperature overflow: torch's RuntimeError came back as 422.
        ({"temperature": 1e-300}, "bad_generation_params"),
        ({"temperature": 0.001}, "bad_generation_params"),  # below vLLM's 0.01 floor
        ({"temperature": 2.5}, "bad_generation_params"),  # OpenAI's range is [0, 2]
        # Lax types were taken: "yes" as true, true as 1, "2" as 2. OpenAI's API takes JSON types only.
        ({"stream": "yes"}, "invalid_request"),
        ({"stream": 1}, "invalid_request"),
        ({"max_tokens": True}, "invalid_request"),
        ({"max_completion_tokens": 4.0}, "invalid_request"),
        ({"n": "2"}, "invalid_request"),
        ({"n": 2.0}, "invalid_request"),
        ({"temperature": "0.5"}, "invalid_request"),
        ({"top_p": True}, "invalid_request"),
        ({"seed": "7"}, "invalid_request"),
        ({"logprobs": "true"}, "invalid_request"),
        ({"stop": 5}, "invalid_request"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "invalid_request"),
        ({"messages": [{"role": "function", "content": "x"}]}, "bad_messages"),
    ],
)
def test_bad_sampling_fields_are_400_with_a_code(
    words: tuple[WordsTarget, str], body: dict[str, Any], code: str
) -> None:
    target, url = words
    resp = chat(url, **body)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == code, resp.text
    assert target.calls == 0


def test_json_numbers_still_fill_sampling_fields(words: tuple[WordsTarget, str]) -> None:
    """Strict, not stricter than OpenAI: an integer temperature or top_p is a number, 0 is greedy."""
    _, url = words
    for body in ({"temperature": 1, "top_p": 1}, {"temperature": 0}, {"temperature": 0.01}, {"temperature": 2}):
        resp = chat(url, max_tokens=2, **body)
        assert resp.status_code == 200, (body, resp.text)


def test_the_openapi_schema_says_what_the_server_takes(words: tuple[WordsTarget, str]) -> None:
    """The schema allowed any role string and any number while the server refused them."""
    _, url = words
    schemas = httpx.get(f"{url}/openapi.json", timeout=10).json()["components"]["schemas"]
    assert sorted(schemas["ChatMessage"]["properties"]["role"]["enum"]) == ["assistant", "developer", "system", "user"]
    request = schemas["ChatCompletionRequest"]["properties"]
    temperature = next(s for s in request["temperature"]["anyOf"] if s.get("type") == "number")
    assert temperature["minimum"] == 0 and temperature["maximum"] == 2
    top_p = next(s for s in request["top_p"]["anyOf"] if s.get("type") == "number")
    assert top_p["exclusiveMinimum"] == 0 and top_p["maximum"] == 1
    n = request["n"]
    assert n["type"] == "integer" and n["minimum"] == 1
    assert request["stream"]["type"] == "boolean"


def test_an_embeddings_conversation_takes_the_roles_the_schema_lists() -> None:
    """The shared ChatMessage schema lists four roles; the embeddings ``messages`` form took any."""
    from tests.fakes.targets import HashEmbedTarget

    with ServerThread(HashEmbedTarget(), ServerConfig()) as srv:
        for role, status in (("user", 200), ("tool", 400)):
            body = {"messages": [{"role": role, "content": "a text"}]}
            resp = httpx.post(f"{srv.url}/v1/embeddings", json=body, timeout=30)
            assert resp.status_code == status, resp.text
        assert resp.json()["error"]["code"] == "bad_messages"


class FailingTarget(WordsTarget):
    """Raises inside the model on every call (a crashing model)."""

    def generate(self, prompt: Any, images: Sequence[Any] = (), params: GenerationParams | None = None) -> Any:
        super().generate(prompt, images, params)
        raise RuntimeError("CUDA error: device-side assert triggered")

    def generate_stream(self, prompt: Any, images: Sequence[Any] = (), params: GenerationParams | None = None) -> Any:
        self.calls += 1
        raise RuntimeError("CUDA error: device-side assert triggered")
        yield ""  # pragma: no cover


def test_model_failures_open_the_breaker_for_chat() -> None:
    target = FailingTarget()
    config = ServerConfig.build(breaker={"minimum_number_of_calls": 4, "sliding_window_size": 4,
                                         "wait_duration_in_open_state": 30})  # fmt: skip
    with ServerThread(target, config) as srv:
        codes = [chat(srv.url, stream=i % 2 == 1) for i in range(6)]
    assert [r.status_code for r in codes[:4]] == [500] * 4
    assert {r.json()["error"]["code"] for r in codes[:4]} == {"model_error"}
    assert [r.status_code for r in codes[4:]] == [503, 503]
    assert codes[4].json()["error"]["code"] == "call_not_permitted" and "retry-after" in codes[4].headers
    assert target.calls == 4  # the open breaker kept the model out of it


class FailsMidStreamTarget(WordsTarget):
    def generate_stream(self, prompt: Any, images: Sequence[Any] = (), params: GenerationParams | None = None) -> Any:
        yield "one "
        yield "two "
        raise RuntimeError("lost the device")


def test_an_error_mid_stream_is_an_error_event_then_done() -> None:
    with ServerThread(FailsMidStreamTarget(), ServerConfig()) as srv:
        with httpx.stream("POST", f"{srv.url}/v1/chat/completions", timeout=30,
                          json={"messages": [{"role": "user", "content": "x"}], "stream": True}) as resp:  # fmt: skip
            assert resp.status_code == 200
            events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
        client = load_target(f"openai:{srv.base_url}")
        with pytest.raises(EndpointError) as err:
            list(client.generate_stream("x"))
        client.close()
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "model_error" and "lost the device" in error["message"]
    assert err.value.code == "stream_error"


def _open_stream_and_leave(host: str, port: int, max_tokens: int) -> bytes:
    """Send a streamed chat request on a raw socket, read up to the first content event, close."""
    messages = [{"role": "user", "content": "go"}]
    body = json.dumps({"messages": messages, "stream": True, "max_tokens": max_tokens, "temperature": 0})
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode()  # fmt: skip
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(request)
        seen = b""
        while seen.count(b"data: ") < 2:  # the role chunk, then the first content delta
            chunk = sock.recv(4096)
            if not chunk:
                break
            seen += chunk
    return seen


def test_a_client_leaving_mid_stream_gives_its_slot_back() -> None:
    target = SlowStreamTarget(delay=0.05)
    # One slot and no queue: while a stream holds the slot, any other request is 429.
    with ServerThread(target, ServerConfig(max_concurrency=1, max_queue=0)) as srv:
        seen = _open_stream_and_leave(srv.host, srv.port, max_tokens=2000)  # 100 s if never stopped
        assert b"200 OK" in seen and b'"content":"w0"' in seen
        assert wait_for(target.closed.is_set), "the target's stream was never closed"
        assert wait_for(lambda: metric(srv.url, "vllm:num_requests_running") == 0)
        resp = chat(srv.url, stream=True, max_tokens=3)
        assert resp.status_code == 200 and resp.text.rstrip().endswith("data: [DONE]")
        assert wait_for(lambda: metric(srv.url, "mmchaos_server_requests_total", status="499") == 1)
        assert metric(srv.url, "vllm:num_requests_running") == 0
    assert target.streams_started == 2


def test_a_full_server_refuses_a_second_stream_with_429() -> None:
    target = SlowStreamTarget(delay=0.05)
    with ServerThread(target, ServerConfig(max_concurrency=1, max_queue=0)) as srv:
        body = {"messages": [{"role": "user", "content": "go"}], "stream": True, "max_tokens": 40}
        with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=body, timeout=30) as first:
            lines = first.iter_lines()  # kept: a dropped line iterator closes the connection
            next(lines)  # the first stream holds the slot now
            assert metric(srv.url, "vllm:num_requests_running") == 1
            second = chat(srv.url, stream=True)
            assert second.status_code == 429 and second.json()["error"]["code"] == "queue_full"
            rest = "".join(lines)
        assert rest.endswith("data: [DONE]")


def test_the_bare_baseline_streams_too() -> None:
    """--no-guards (the benchmark's baseline) serves the same chat, streamed or not."""
    target = WordsTarget()
    with ServerThread(target, ServerConfig(guards=False)) as srv:
        client = load_target(f"openai:{srv.base_url}")
        params = GenerationParams(max_new_tokens=5)
        whole = client.generate("a b", [RED], params)
        streamed = "".join(client.generate_stream("a b", [RED], params))
        client.close()
    assert whole.text == streamed == "red a b w0 w1"
