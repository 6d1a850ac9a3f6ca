"""A FAKE vLLM-style chat endpoint in front of an in-process generative target, on a loopback port.

vLLM cannot run here (no GPU). This speaks real HTTP on 127.0.0.1 (``http.server``), so the
``openai:`` target's real client and JSON code run: ``GET /v1/models`` lists one model with vLLM's
``max_model_len`` (or none, ``max_model_len=None``: an endpoint that states no limit), and
``POST /v1/chat/completions`` answers text-only chats with the target's ``generate``, its
``prompt_tokens`` in ``usage``; a typed refusal of the target is a 400 with its code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from typing import Any

from mmchaos.errors import TargetCallError
from mmchaos.targets.base import Target
from mmchaos.targets.generation import GenerationParams, Message
from tests.fakes.loopback import serving
from tests.fakes.openai_server import JSONHandler

__all__ = ["target_chat_server"]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, target: Target, model: str, max_model_len: int | None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.target, self.model, self.max_model_len = target, model, max_model_len


class _Handler(JSONHandler):
    server: _Server

    def do_GET(self) -> None:
        if self.path != "/v1/models":
            return self._send(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
        card: dict[str, Any] = {"id": self.server.model, "object": "model", "created": 0, "owned_by": "vllm"}
        if self.server.max_model_len is not None:
            card["max_model_len"] = self.server.max_model_len
        self._send(200, {"object": "list", "data": [card]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if self.path != "/v1/chat/completions":
            return self._send(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
        messages = []
        for m in body["messages"]:
            content = m["content"]
            text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)
            messages.append(Message(m["role"], (text,)))
        params = GenerationParams(max_new_tokens=int(body.get("max_tokens") or 16), logprobs=False)
        try:
            result = self.server.target.generate(messages, params=params)
        except TargetCallError as exc:
            return self._send(400, {"error": {"message": exc.message, "type": "invalid_request_error",
                                              "code": exc.code}})  # fmt: skip
        choice = {"index": 0, "message": {"role": "assistant", "content": result.text},
                  "finish_reason": result.completions[0].finish_reason}  # fmt: skip
        usage = {"prompt_tokens": result.prompt_tokens, "completion_tokens": len(result.text.split())}
        self._send(200, {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0,
                         "model": self.server.model, "choices": [choice], "usage": usage})  # fmt: skip


@contextmanager
def target_chat_server(target: Target, *, model: str = "fake-llm", max_model_len: int | None = None) -> Iterator[str]:
    """Serve ``target`` on a loopback port; yields the base URL (``http://127.0.0.1:P/v1``)."""
    server = _Server(target, model, max_model_len)
    with serving(server) as url:
        yield url
