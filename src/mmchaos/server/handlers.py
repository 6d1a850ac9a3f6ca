"""The endpoints: OpenAI's embeddings, chat completions and models, and the operations probes.

Each handler finds the :class:`GuardedServer` on ``request.app.state.mmchaos`` (one per app), so
the router itself holds no state.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Sequence
from functools import partial
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from mmchaos import __version__
from mmchaos.guard.preflight import estimate_tokens
from mmchaos.server.chat import generative_chat
from mmchaos.server.engine import GuardedServer
from mmchaos.server.errors import ERROR_RESPONSES, HTTPError
from mmchaos.server.inputs import Item, embedding_items, message_parts, part_item, truncate_to_tokens
from mmchaos.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    ErrorBody,
    ModelList,
)
from mmchaos.server.respond import disconnected, guarded, json_response
from mmchaos.targets.base import Capability

__all__ = ["json_response", "router"]

T = TypeVar("T")
FloatArray = npt.NDArray[np.float32]

router = APIRouter()


def _server(request: Request) -> GuardedServer:
    server: GuardedServer = request.app.state.mmchaos
    return server


def _encode(vector: FloatArray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    out: list[float] = vector.tolist()
    return out


def _check_model(server: GuardedServer, model: str | None) -> None:
    """As vLLM: any served name (the first is the one answers carry) or the target URI; else 404."""
    if model is not None and model not in server.model_names:
        raise HTTPError(
            404, "model_not_found", f"the model {model!r} does not exist (this server has {server.model_name!r})",
            param="model",
        )  # fmt: skip


def _check_capability(server: GuardedServer, items: Sequence[Item], text_cap: Capability) -> None:
    for item in items:
        cap = text_cap if item.modality == "text" else Capability.EMBED_IMAGE
        if not server.target.has(cap):
            raise HTTPError(
                400, "capability_missing", f"{server.model_name} cannot embed {item.modality} inputs",
                param=item.param,
            )  # fmt: skip


@router.post("/v1/embeddings", response_model=EmbeddingResponse, responses=ERROR_RESPONSES, tags=["openai"])
async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
    """Embed texts and images (``image_url`` parts with ``data:`` URLs); one vector per input."""
    server = _server(request)
    _check_model(server, body.model)
    items = embedding_items(body, server.config.max_items, server.detokenize)
    _check_capability(server, items, Capability.EMBED_TEXT)
    if body.dimensions is not None and body.dimensions < 1:
        raise HTTPError(400, "dimensions_unsupported", "dimensions must be a positive integer", param="dimensions")
    pixels = server.declared_pixels(items)
    vectors = await guarded(
        lambda: server.run(partial(server.embed_job, items), pixels=pixels, gone=disconnected(request))
    )
    if body.dimensions is not None and body.dimensions != vectors.shape[1]:
        raise HTTPError(
            400, "dimensions_unsupported", f"this model's embeddings have {vectors.shape[1]} dimensions",
            param="dimensions",
        )  # fmt: skip
    tokens = sum(estimate_tokens(i.value) if i.modality == "text" else 1 for i in items)
    return json_response(
        {
            "id": f"embd-{request.state.request_id}",
            "object": "list",
            "created": int(time.time()),
            "data": [
                {"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
                for i, v in enumerate(vectors)
            ],
            "model": server.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=ERROR_RESPONSES, tags=["openai"])
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    """Answer a chat: generative targets generate (``stream: true`` for server-sent events); targets
    that read text (OCR) answer the text in the ``image_url`` parts."""
    server = _server(request)
    _check_model(server, body.model)
    if server.target.has(Capability.GENERATE):
        return await generative_chat(server, body, request)
    if not server.target.has(Capability.READ_TEXT):
        raise HTTPError(
            400, "capability_missing",
            f"{server.model_name} neither reads text nor generates; use /v1/embeddings",
        )  # fmt: skip
    if body.stream:
        raise HTTPError(400, "stream_unsupported", "streaming is not supported", param="stream")
    if body.n != 1:
        raise HTTPError(400, "n_unsupported", "only n=1 is supported", param="n")
    items = [
        part_item(p, where)
        for i, m in enumerate(body.messages)
        for p, where in message_parts(m.content, f"messages[{i}]")
    ]
    if not any(i.modality == "image" for i in items):
        raise HTTPError(400, "empty_input", "the messages hold no image_url content part", param="messages")
    if len(items) > server.config.max_items:
        raise HTTPError(413, "too_many_inputs", f"{len(items)} content parts; the limit is {server.config.max_items}")
    pixels = server.declared_pixels(items, param="messages")
    text = await guarded(lambda: server.run(partial(server.read_job, items), pixels=pixels, gone=disconnected(request)))
    limit = body.max_completion_tokens or body.max_tokens
    finish = "stop"
    if limit is not None:
        text, cut = truncate_to_tokens(text, limit)
        finish = "length" if cut else "stop"
    rid = request.state.request_id
    return json_response(
        {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": server.model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": {"prompt_tokens": len(items), "completion_tokens": estimate_tokens(text) if text else 0,
                      "total_tokens": len(items) + (estimate_tokens(text) if text else 0)},
        }
    )  # fmt: skip


@router.get("/v1/models", response_model=ModelList, tags=["openai"])
async def models(request: Request) -> Response:
    """The one served model, with the target's URI, capabilities and fingerprint under ``mmchaos``."""
    server = _server(request)
    card = await asyncio.get_running_loop().run_in_executor(None, server.model_card)
    return json_response({"object": "list", "data": [card]})


@router.head("/healthz", include_in_schema=False)
@router.get("/healthz", tags=["operations"])  # registered first: a 405 here says Allow: GET
async def healthz() -> Response:
    """Liveness: 200 while the event loop answers (also to HEAD)."""
    return json_response({"status": "ok"})


_EMPTY_200: dict[int | str, dict[str, Any]] = {200: {"description": "healthy (no body)", "content": {}}}


@router.get(
    "/health", tags=["operations"], response_class=Response, responses={**_EMPTY_200, 503: {"model": ErrorBody}}
)
async def health(request: Request) -> Response:
    """vLLM's health probe: 200 with no body while the server runs a model that passed its load
    check, else 503."""
    server = _server(request)
    ok, why, code = server.readiness()
    if (not ok and code == "model_load_mismatch") or not server.running:
        raise HTTPError(503, code, why)
    return Response(status_code=200)


@router.get("/version", tags=["operations"])
async def version() -> Response:
    """vLLM's version endpoint: the mmchaos version serving."""
    return json_response({"version": __version__})


@router.head("/readyz", include_in_schema=False)
@router.get("/readyz", tags=["operations"], responses={503: {"model": ErrorBody}})
async def readyz(request: Request) -> Response:
    """Readiness: 503 while starting, draining for shutdown, with the breaker open (``not_ready``),
    or for good when the model failed its load check (``model_load_mismatch``)."""
    server = _server(request)
    ok, why, code = server.readiness()
    server.metrics.ready.set(1.0 if ok else 0.0)
    if ok:
        return json_response({"status": "ready", "model": server.model_name})
    raise HTTPError(503, code, why)


_METRICS_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Prometheus text exposition format 0.0.4",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}


@router.get("/metrics", tags=["operations"], response_class=PlainTextResponse, responses=_METRICS_DOC)
async def metrics(request: Request) -> Response:
    """Prometheus text format: requests, per-modality stage latencies and every guard's metrics."""
    return Response(generate_latest(_server(request).registry), media_type=CONTENT_TYPE_LATEST)
