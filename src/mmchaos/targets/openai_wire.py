"""The OpenAI wire format as mmchaos speaks it: data URLs, chat content parts, chat choices and
server-sent events, and the error an endpoint failure becomes.

Pure functions over JSON and bytes, apart from the target in ``openai_http.py``, so the format can be
read and tested on its own (and reused by a server or a fake).
"""

from __future__ import annotations

import base64
import email.utils
import io
import json
import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from mmchaos.targets.generation import Completion, FinishReason, Message
from mmchaos.targets.openai_forms import image_part

__all__ = [
    "EndpointError",
    "chat_content",
    "choices_of",
    "completion_of",
    "data_url",
    "mime_of",
    "parse_retry_after",
    "png_bytes",
    "sse_deltas",
]


_MAGIC = (
    (b"\x89PNG", "image/png"),
    (b"\xff\xd8", "image/jpeg"),
    (b"GIF8", "image/gif"),
    (b"RIFF", "image/webp"),
    (b"BM", "image/bmp"),
    (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"),
)


class EndpointError(RuntimeError):
    """The endpoint failed: a 5xx answer (after retries), a timeout, a reset, an unreadable body.

    Not an :class:`~mmchaos.errors.MMChaosError` on purpose: for the checks it is the deployment
    crashing, not a typed refusal of the input.
    """

    def __init__(self, message: str, *, code: str, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None if absent or invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds or seconds == float("inf"):  # NaN, inf
        return None
    return max(0.0, seconds)


def mime_of(blob: bytes) -> str:
    for magic, mime in _MAGIC:
        if blob.startswith(magic):
            return mime
    return "application/octet-stream"


def data_url(blob: bytes) -> str:
    """``data:<mime>;base64,...`` of encoded image bytes, sent exactly as given."""
    return f"data:{mime_of(blob)};base64,{base64.b64encode(blob).decode('ascii')}"


def png_bytes(image: Any, index: int = 0, *, variant: bool = False) -> bytes:
    """An RGB uint8 array as lossless PNG (the server decodes exactly the same pixels).

    ``variant`` gives other bytes for the same pixels (another compression level and a text
    chunk): the probe's way of telling a server that decodes images from one that reads strings.
    """
    from PIL import Image, PngImagePlugin

    from mmchaos.targets.decode import check_image_array

    check_image_array(image, index, max_pixels=None)
    buf = io.BytesIO()
    picture = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8), "RGB")
    if variant:
        info = PngImagePlugin.PngInfo()
        info.add_text("Comment", "mmchaos probe")
        picture.save(buf, format="PNG", compress_level=9, pnginfo=info)
    else:
        picture.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def chat_content(message: Message) -> str | list[dict[str, Any]]:
    if isinstance(message.content, str):
        return message.content
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(message.parts()):
        if isinstance(part, str):
            parts.append({"type": "text", "text": part})
        else:
            parts.append(image_part(data_url(png_bytes(part, i))))
    return parts


_TOKEN_ID = re.compile(r"token_id:(\d+)")


def completion_of(choice: dict[str, Any]) -> Completion:
    """One OpenAI chat choice as a Completion; token ids only where the server sends them (vLLM's
    ``return_tokens_as_token_ids`` gives tokens as ``token_id:N``, SGLang a ``token_id`` field)."""
    content = choice["message"].get("content")
    finish: FinishReason = "length" if choice.get("finish_reason") == "length" else "stop"
    logprobs = ids = tops = None
    entries = (choice.get("logprobs") or {}).get("content")
    if isinstance(entries, list):
        logprobs = tuple(float(e["logprob"]) for e in entries)
        ids = _token_ids(entries)
        alternatives = [e.get("top_logprobs") for e in entries]
        if ids is not None and entries and all(isinstance(a, list) and a for a in alternatives):
            top_ids = [_token_ids(a) for a in alternatives]
            if all(t is not None for t in top_ids):
                tops = tuple({i: float(x["logprob"]) for i, x in zip(t or (), a, strict=True)}
                             for t, a in zip(top_ids, alternatives, strict=True))  # fmt: skip
    return Completion(text="" if content is None else str(content), finish_reason=finish, token_ids=ids,
                      logprobs=logprobs, top_logprobs=tops)  # fmt: skip


def _token_ids(entries: list[dict[str, Any]]) -> tuple[int, ...] | None:
    """The token ids of logprob entries, where the server names them (vLLM's ``token_id:N``
    tokens, SGLang's ``token_id`` field); None where it gives only token texts."""
    matches = [_TOKEN_ID.fullmatch(str(e.get("token", ""))) for e in entries]
    if entries and all(matches):
        return tuple(int(m.group(1)) for m in matches if m)
    if entries and all(isinstance(e.get("token_id"), int) for e in entries):
        return tuple(int(e["token_id"]) for e in entries)
    return None


def choices_of(body: dict[str, Any]) -> tuple[list[dict[str, Any]], int | None]:
    """The choices of a chat answer in index order, and its prompt token count if given."""
    try:
        choices = sorted(body["choices"], key=lambda c: int(c.get("index", 0)))
        for choice in choices:
            completion_of(choice)  # validates the shape now, not later
        usage = body.get("usage")
        prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise EndpointError(f"POST /chat/completions: malformed answer ({exc!r})", code="bad_response") from None
    if not choices:
        raise EndpointError("POST /chat/completions: no choices in the answer", code="bad_response")
    return choices, prompt_tokens if isinstance(prompt_tokens, int) else None


def sse_deltas(lines: Iterable[str], path: str) -> Iterator[str]:
    """Content deltas of choice 0 from server-sent event lines.

    A stream is complete at ``data: [DONE]`` or, when the connection closes without it, once choice 0
    has sent its ``finish_reason``: transformers serve ends its streams that way and the openai SDK
    accepts them. A stream that closes before either was cut (``stream_truncated``).
    """
    finished = False
    for line in lines:
        if not line.startswith("data:"):
            continue  # comments, event names, keep-alives, blank separators
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
            if "error" in chunk:
                raise EndpointError(f"POST {path}: error in stream: {chunk['error']}", code="stream_error")
            for choice in chunk.get("choices") or []:
                if int(choice.get("index", 0)) != 0:
                    continue
                delta = (choice.get("delta") or {}).get("content")
                if delta:
                    yield str(delta)
                finished = finished or bool(choice.get("finish_reason"))
        except (ValueError, TypeError, AttributeError) as exc:
            raise EndpointError(f"POST {path}: malformed stream event ({exc})", code="bad_response") from None
    if not finished:
        raise EndpointError(f"POST {path}: the stream ended without a finish_reason or [DONE]", code="stream_truncated")
