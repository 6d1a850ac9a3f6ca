"""The chat traffic ``metrics_exposure`` sends between its scrapes, and what it amounted to.

Plain and streamed ``/chat/completions`` requests (an image part where the data has images and
the endpoint takes them), then requests that must be refused (an undecodable image, no messages).
Streams ask for ``stream_options.include_usage``; the answers' ``usage`` is summed, so the token
counters can be held to what the server itself said it spent. A stream is answered when it ends
with ``data: [DONE]`` or its ``finish_reason`` (transformers serve sends no ``[DONE]``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mmchaos.chaos.payloads import png_data_url
from mmchaos.checks.evidence import png_bytes
from mmchaos.targets.openai_forms import chat_body, chat_image_content

if TYPE_CHECKING:
    import httpx

    from mmchaos.data.base import Dataset

__all__ = ["ChatTally", "chat_requests", "send_chat"]

_UNDECODABLE = png_data_url(b"\x89PNG\r\n\x1a\nnot really")


@dataclass
class ChatTally:
    """What the chat traffic amounted to (the ``at_least`` quantities of :mod:`.metric_series`)."""

    sent: int = 0
    answered: int = 0
    streamed: int = 0
    streamed_multi_token: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    without_usage: int = 0
    """Answered requests whose answer carried no ``usage`` (their tokens are not in the sums)."""
    statuses: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "statuses"}

    def count(self, kind: str, status: int | str) -> None:
        key = f"{kind}:{status}"
        self.statuses[key] = self.statuses.get(key, 0) + 1


def chat_requests(
    model: str, data: Dataset, n: int, malformed: int, max_tokens: int, images: bool
) -> list[tuple[str, dict[str, Any]]]:
    """``n`` plain and ``n`` streamed chats from ``data``, then ``malformed`` that must be refused."""
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(n):
        s = data[i % len(data)] if len(data) else None
        question = (s.question or "What is in the picture?") if s is not None else "Say hello."
        if images and s is not None and s.has_image:
            url = png_data_url(png_bytes(s.load_image()))
            content: str | list[dict[str, Any]] = chat_image_content([url], question)
        else:
            content = (s.question or s.caption or "Say hello.") if s is not None else "Say hello."
        options = {"max_tokens": max_tokens, "temperature": 0}
        out.append(("chat", chat_body(model, content, **options)))
        usage = {"include_usage": True}
        out.append(("stream", chat_body(model, content, stream=True, stream_options=usage, **options)))
    for i in range(malformed):
        if i % 2 == 0 and images:
            bad = chat_image_content([_UNDECODABLE], "What is this?")
            out.append(("malformed", chat_body(model, bad, max_tokens=1)))
        else:
            out.append(("malformed", {"model": model, "messages": [], "max_tokens": 1}))
    return out


def _usage(tally: ChatTally, usage: object) -> bool:
    if not isinstance(usage, dict):
        return False
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return False
    tally.prompt_tokens += prompt
    tally.completion_tokens += completion
    return True


def _read_stream(lines: Iterable[str]) -> tuple[bool, object, int]:
    """(whether the stream ended as a complete one, its usage chunk's ``usage`` or None, its
    content deltas)."""
    finished, usage, deltas = False, None, 0
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return True, usage, deltas
        try:
            chunk = json.loads(data)
        except ValueError:
            return False, usage, deltas
        if not isinstance(chunk, dict) or "error" in chunk:
            return False, usage, deltas
        usage = chunk.get("usage") or usage
        choices = [c for c in chunk.get("choices") or [] if isinstance(c, dict)]
        deltas += sum(bool((c.get("delta") or {}).get("content")) for c in choices)
        finished = finished or any(c.get("finish_reason") for c in choices)
    return finished, usage, deltas


def send_chat(client: httpx.Client, path: str, requests: list[tuple[str, dict[str, Any]]]) -> ChatTally:
    """Send ``requests`` one after another; what was answered and what the answers' usage counted."""
    import httpx

    tally = ChatTally()
    headers = {"Content-Type": "application/json"}
    for kind, body in requests:
        content = json.dumps(body).encode()
        tally.sent += 1
        try:
            if kind != "stream":
                resp = client.post(path, content=content, headers=headers)
                tally.count(kind, resp.status_code)
                if kind == "chat" and resp.status_code == 200:
                    tally.answered += 1
                    tally.without_usage += not _usage(tally, _json(resp).get("usage"))
                continue
            with client.stream("POST", path, content=content, headers=headers) as resp:
                if resp.status_code != 200:
                    resp.read()
                    tally.count(kind, resp.status_code)
                    continue
                complete, usage, deltas = _read_stream(resp.iter_lines())
        except httpx.HTTPError as exc:
            tally.count(kind, type(exc).__name__)
            continue
        tally.count(kind, "200" if complete else "200:cut")
        if complete:
            tally.answered += 1
            tally.streamed += 1
            counted = _usage(tally, usage)
            tally.without_usage += not counted
            tokens = usage["completion_tokens"] if counted and isinstance(usage, dict) else deltas
            tally.streamed_multi_token += int(tokens) > 1
    return tally


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
