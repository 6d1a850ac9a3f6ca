"""Chat completions of a target that reads text (OCR): the ``image_url`` parts of all messages are
read, and the lines, joined by ``\\n``, are the assistant's reply (cut at ``max_tokens``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from mmchaos.guard.preflight import estimate_tokens
from mmchaos.server.core import GuardedServer
from mmchaos.server.errors import BadModelOutput, ServerError
from mmchaos.server.inputs import Item, message_parts, part_item, truncate_to_tokens
from mmchaos.server.protocol import ChatCompletionRequest
from mmchaos.server.respond import disconnected, guarded, json_response
from mmchaos.targets.base import Capability

__all__ = ["ocr_chat", "read_job"]


def _check_texts(out: Any, n: int) -> list[str]:
    if not isinstance(out, list | tuple) or len(out) != n or not all(isinstance(t, str) for t in out):
        raise BadModelOutput(
            f"the model returned {type(out).__name__} for {n} images, not one string per image",
            code="bad_model_output",
        )
    return list(out)


def read_job(server: GuardedServer, items: Sequence[Item], cancel: threading.Event) -> str:
    """The worker's part: decode every input, read the images in one model call, one line each."""
    values = server.model.decode(items, cancel)
    images = [v for v, item in zip(values, items, strict=True) if item.modality == "image"]
    texts = server.model.call("image", server.target.read_text, images, _check_texts, cancel)
    return "\n".join(texts)


async def ocr_chat(server: GuardedServer, body: ChatCompletionRequest, request: Request) -> Response:
    """``/v1/chat/completions`` for a target without ``generate``: it must read text."""
    if not server.target.has(Capability.READ_TEXT):
        raise ServerError(
            f"{server.model_name} neither reads text nor generates; use /v1/embeddings", code="capability_missing"
        )
    if body.stream:
        raise ServerError("streaming is not supported", code="stream_unsupported", param="stream")
    if body.n != 1:
        raise ServerError("only n=1 is supported", code="n_unsupported", param="n")
    items = [
        part_item(p, where)
        for i, m in enumerate(body.messages)
        for p, where in message_parts(m.content, f"messages[{i}]")
    ]
    if not any(i.modality == "image" for i in items):
        raise ServerError("the messages hold no image_url content part", code="empty_input", param="messages")
    if len(items) > server.config.max_items:
        raise ServerError(f"{len(items)} content parts; the limit is {server.config.max_items}", code="too_many_inputs")
    pixels = server.declared_pixels(items, param="messages")
    job = partial(read_job, server, items)
    text = await guarded(lambda: server.work.run(job, pixels=pixels, gone=disconnected(request)))
    limit = body.max_completion_tokens or body.max_tokens
    finish = "stop"
    if limit is not None:
        text, cut = truncate_to_tokens(text, limit)
        finish = "length" if cut else "stop"
    completion = estimate_tokens(text) if text else 0
    return json_response(
        {
            "id": f"chatcmpl-{request.state.request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": server.model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": {"prompt_tokens": len(items), "completion_tokens": completion,
                      "total_tokens": len(items) + completion},
        }
    )  # fmt: skip
