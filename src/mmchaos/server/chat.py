"""Chat completions of generative targets: OpenAI's request in, OpenAI's answer or its stream out.

The request's images go through the same guards as every other input (declared pixels before
admission, Preflight in the worker), the model call through the model lock and the breaker. A
stream answers its first delta before any byte is sent, so a refusal (bad image, open breaker, a
model that cannot take the request) is an ordinary error answer; an error after that is an
``{"error": ...}`` event, and every stream that was not abandoned ends with ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from mmchaos.errors import TargetCallError
from mmchaos.guard.preflight import estimate_tokens
from mmchaos.server.engine import GenerationStream, GuardedServer, _ClientGone, _unless_gone
from mmchaos.server.errors import CLIENT_CLOSED, HTTPError, to_http_error
from mmchaos.server.inputs import Turn, chat_turns
from mmchaos.server.metrics import GenerationMetrics
from mmchaos.server.protocol import ChatCompletionRequest
from mmchaos.server.respond import disconnected, guarded, json_response
from mmchaos.targets.generation import GenerationParams, GenerationResult

__all__ = ["SSEResponse", "generation_params", "generative_chat"]

#: vLLM's stand-in for a logprob of -inf (JSON has no infinity).
_NEG_INF_LOGPROB = -9999.0


def generation_params(body: ChatCompletionRequest, server: GuardedServer) -> GenerationParams:
    """The request's sampling fields as GenerationParams; 400 with the field named when one is bad."""
    cfg = server.config
    limit = body.max_completion_tokens or body.max_tokens or cfg.default_max_tokens
    if limit > cfg.max_tokens_limit:
        field = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        raise HTTPError(
            400, "max_tokens_too_large", f"{field} is {limit}; this server generates at most {cfg.max_tokens_limit}",
            param=field,
        )  # fmt: skip
    if body.stream and body.n != 1:
        raise HTTPError(400, "n_unsupported", "a stream carries one completion: use n=1 with stream", param="n")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    try:
        return GenerationParams(
            max_new_tokens=limit,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            seed=body.seed,
            stop=stop,
            n=body.n,
            logprobs=body.logprobs,
        )
    except TargetCallError as err:
        raise HTTPError(400, err.code, err.message) from None


def _logprobs(completion: Any, tokens: Sequence[str]) -> dict[str, Any] | None:
    if completion.logprobs is None:
        return None
    names = list(tokens) if len(tokens) == len(completion.logprobs) else [""] * len(completion.logprobs)
    entries = []
    for token, lp in zip(names, completion.logprobs, strict=True):
        value = float(lp) if math.isfinite(lp) else _NEG_INF_LOGPROB
        entries.append({"token": token, "logprob": value, "bytes": list(token.encode()), "top_logprobs": []})
    return {"content": entries}


def _prompt_tokens(result: GenerationResult | None, turns: Sequence[Turn]) -> int:
    """The target's own count where it gives one, else an estimate (texts' tokens, one per image)."""
    if result is not None and isinstance(result.prompt_tokens, int):
        return result.prompt_tokens
    return sum(estimate_tokens(i.value) if i.modality == "text" else 1 for t in turns for i in t.items)


def _completion_tokens(completions: Sequence[Any]) -> int:
    if all(c.token_ids is not None for c in completions):
        return sum(len(c.token_ids) for c in completions)
    return sum(estimate_tokens(c.text) if c.text else 0 for c in completions)


def _metrics(server: GuardedServer) -> GenerationMetrics:
    if server.generation is None:  # only a target without GENERATE has none, and it never gets here
        raise HTTPError(400, "capability_missing", f"{server.model_name} does not generate")
    return server.generation


async def generative_chat(server: GuardedServer, body: ChatCompletionRequest, request: Request) -> Response:
    """``/v1/chat/completions`` for a target with the ``generate`` capability."""
    arrived = time.perf_counter()
    params = generation_params(body, server)
    turns = chat_turns(body.messages, server.config.max_items)
    pixels = server.declared_pixels([i for t in turns for i in t.items], param="messages")
    rid = request.state.request_id
    if body.stream:
        return await _stream(server, body, request, turns, params, pixels, arrived)
    job = partial(server.generate_job, turns, params, body.return_tokens_as_token_ids)
    result, tokens = await guarded(lambda: server.run(job, pixels=pixels, gone=disconnected(request)))
    completions = result.completions[: params.n]
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": c.text},
            "logprobs": _logprobs(c, tokens[i]) if tokens is not None else None,
            "finish_reason": c.finish_reason,
        }
        for i, c in enumerate(completions)
    ]
    prompt_tokens = _prompt_tokens(result, turns)
    completion_tokens = _completion_tokens(completions)
    metrics = _metrics(server)
    for c in completions:
        metrics.success.labels(server.model_name, c.finish_reason).inc()
    metrics.finished_tokens(prompt_tokens, completion_tokens, time.perf_counter() - arrived)
    return json_response(
        {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": server.model_name,
            "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }
    )  # fmt: skip


async def _stream(
    server: GuardedServer,
    body: ChatCompletionRequest,
    request: Request,
    turns: list[Turn],
    params: GenerationParams,
    pixels: int,
    arrived: float,
) -> Response:
    job = partial(server.stream_job, turns, params)
    stream = await guarded(lambda: server.open_stream(job, pixels=pixels, gone=disconnected(request)))
    # The first delta (or the end, or the failure) before any byte: refusals stay ordinary answers.
    gone = asyncio.ensure_future(disconnected(request))
    try:
        first = await _unless_gone(stream.next(server.config.request_timeout), gone)
    except _ClientGone as exc:
        stream.cancel()
        raise HTTPError(CLIENT_CLOSED, "client_disconnected", "the client closed the connection") from exc
    except TimeoutError as exc:
        stream.cancel()
        raise HTTPError(
            504, "request_timeout", f"no token within the {server.config.request_timeout:g}s request timeout"
        ) from exc
    except Exception as exc:
        stream.cancel()
        raise to_http_error(exc) from exc
    finally:
        gone.cancel()
    usage = body.stream_options is not None and body.stream_options.include_usage
    return SSEResponse(server, stream, first, request.state.request_id, params, turns, arrived, usage)


class SSEResponse(Response):
    """Server-sent events in OpenAI's ``chat.completion.chunk`` format, ending with ``data: [DONE]``.

    It watches the connection while it streams: when the client leaves, the job is cancelled (it
    stops at its next delta and gives its slot back) and the request is recorded as 499.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        server: GuardedServer,
        stream: GenerationStream,
        first: tuple[float, str] | None,
        request_id: str,
        params: GenerationParams,
        turns: list[Turn],
        arrived: float,
        include_usage: bool,
    ) -> None:
        self.server, self.stream, self.first = server, stream, first
        self.params, self.turns, self.arrived, self.include_usage = params, turns, arrived, include_usage
        self.id = f"chatcmpl-{request_id}"
        self.created = int(time.time())
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
        choices = [] if usage is not None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        chunk: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                                 "model": self.server.model_name, "choices": choices}  # fmt: skip
        if usage is not None:
            chunk["usage"] = usage
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await self._run(scope, watcher, send)
        finally:
            watcher.cancel()
            if not self.stream.finished:
                self.stream.cancel()

    async def _run(self, scope: Scope, watcher: asyncio.Future[None], send: Send) -> None:
        metrics = _metrics(self.server)
        timeout = self.server.config.request_timeout
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})

        async def emit(data: bytes) -> bool:
            """Send; False when the client is gone."""
            if watcher.done():
                return False
            try:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            except Exception:  # the connection broke under the write
                return False
            return True

        def gone() -> None:
            scope.setdefault("state", {})["client_closed"] = True
            self.stream.cancel()

        if not await emit(self._chunk({"role": "assistant", "content": ""})):
            return gone()
        text: list[str] = []
        first_at = last_at = None
        event = self.first
        error: HTTPError | None = None
        while event is not None:
            stamp, delta = event
            if first_at is None:
                first_at = stamp
                metrics.ttft.observe(max(0.0, stamp - self.arrived))
            else:
                metrics.itl.observe(max(0.0, stamp - (last_at or stamp)))
            last_at = stamp
            text.append(delta)
            if not await emit(self._chunk({"content": delta})):
                return gone()
            nxt = asyncio.ensure_future(self.stream.next(timeout))
            waiting: set[asyncio.Future[Any]] = {nxt, watcher}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if not nxt.done():
                nxt.cancel()
                return gone()
            try:
                event = nxt.result()
            except TimeoutError:
                error = HTTPError(504, "request_timeout", f"no token for {timeout:g}s")
                break
            except Exception as exc:
                error = to_http_error(exc)
                break
        if error is not None:
            self.stream.cancel()
            self.server.metrics.errors.labels(error.code, str(error.status)).inc()
            payload = {"error": {"message": error.message, "type": error.type, "param": error.param,
                                 "code": error.code}}  # fmt: skip
            body = b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
            if await emit(body):
                await emit(b"data: [DONE]\n\n")
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return None
        full = "".join(text)
        counted = self.stream.result
        # Re-encoding the text can count more tokens than were generated (a byte-level model's broken
        # UTF-8 comes back as U+FFFD); a completion never has more than max_new_tokens.
        counted_tokens = counted if isinstance(counted, int) else (estimate_tokens(full) if full else 0)
        completion_tokens = min(counted_tokens, self.params.max_new_tokens)
        finish = "length" if completion_tokens >= self.params.max_new_tokens else "stop"
        prompt_tokens = _prompt_tokens(None, self.turns)
        if not await emit(self._chunk({}, finish)):
            return gone()
        if self.include_usage:
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                     "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip
            if not await emit(self._chunk({}, usage=usage)):
                return gone()
        if not await emit(b"data: [DONE]\n\n"):
            return gone()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        end = time.perf_counter()
        if first_at is not None and last_at is not None and completion_tokens > 1:
            metrics.tpot.observe((last_at - first_at) / (completion_tokens - 1))
        metrics.success.labels(self.server.model_name, finish).inc()
        metrics.finished_tokens(prompt_tokens, completion_tokens, end - self.arrived)
        return None


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
