"""``top_logprobs`` over ``openai:``: asked for where the params want them, read back (keyed by token
id) where the server names ids, as vLLM does with ``--return-tokens-as-token-ids``, and dropped
with ``logprobs`` from a server that refuses them. Against httpx MockTransport."""

from __future__ import annotations

import json
from typing import Any

import httpx

from mmchaos.targets.generation import GenerationParams
from mmchaos.targets.openai_http import OpenAITarget
from mmchaos.targets.openai_wire import completion_of

URL = "http://127.0.0.1:9/v1"  # never contacted: the MockTransport answers
VLLM_CHOICE = {
    "index": 0,
    "message": {"role": "assistant", "content": "ab"},
    "finish_reason": "stop",
    "logprobs": {"content": [
        {"token": "token_id:5", "logprob": -0.1,
         "top_logprobs": [{"token": "token_id:5", "logprob": -0.1}, {"token": "token_id:9", "logprob": -2.5}]},
        {"token": "token_id:7", "logprob": -0.3,
         "top_logprobs": [{"token": "token_id:7", "logprob": -0.3}, {"token": "token_id:1", "logprob": -1.6}]},
    ]},
}  # fmt: skip


def _target(bodies: list[dict[str, Any]], refuse_logprobs: bool = False) -> OpenAITarget:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m", "object": "model"}]})
        body = json.loads(request.content)
        bodies.append(body)
        if refuse_logprobs and "logprobs" in body:
            return httpx.Response(400, json={"error": {"message": "logprobs are not supported", "code": "x"}})
        return httpx.Response(200, json={"choices": [VLLM_CHOICE], "usage": {"prompt_tokens": 3}})

    return OpenAITarget.connect(URL, transport=httpx.MockTransport(answer), sleep=lambda _: None, seed=0,
                                model="m", capabilities=["generate"])  # fmt: skip


def test_top_logprobs_are_asked_for_and_read_by_token_id() -> None:
    bodies: list[dict[str, Any]] = []
    got = _target(bodies).generate("Hi", params=GenerationParams(max_new_tokens=2, top_logprobs=2))
    assert bodies[-1]["logprobs"] is True and bodies[-1]["top_logprobs"] == 2
    assert got.token_ids == (5, 7)
    assert got.completions[0].top_logprobs == ({5: -0.1, 9: -2.5}, {7: -0.3, 1: -1.6})


def test_not_asked_without_top_logprobs_and_dropped_with_refused_logprobs() -> None:
    bodies: list[dict[str, Any]] = []
    _target(bodies).generate("Hi", params=GenerationParams(max_new_tokens=2))
    assert "top_logprobs" not in bodies[-1]
    bodies.clear()
    _target(bodies, refuse_logprobs=True).generate("Hi", params=GenerationParams(max_new_tokens=2, top_logprobs=3))
    assert "top_logprobs" in bodies[0] and not ({"logprobs", "top_logprobs"} & set(bodies[1]))


def test_tokens_given_as_text_keep_no_top_logprobs() -> None:
    """Without ids a top token's text cannot be matched to the other side's ids: none are kept."""
    entries = [{"token": "a", "logprob": -0.1, "top_logprobs": [{"token": "a", "logprob": -0.1}]}]
    plain = completion_of({"message": {"content": "a"}, "logprobs": {"content": entries}})
    assert plain.logprobs == (-0.1,) and plain.token_ids is None and plain.top_logprobs is None
