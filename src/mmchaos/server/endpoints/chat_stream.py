"""Streamed chat completions (``stream: true``): OpenAI's ``chat.completion.chunk`` server-sent events.

A stream answers its first delta before any byte is sent, so a refusal (bad image, open breaker, a
model that cannot take the request) is an ordinary error answer; an error after that is an
``{"error": ...}`` event, and every stream that was not abandoned ends with ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from mmchaos.guard.preflight import estimate_tokens
from mmchaos.server.core import GuardedServer
from mmchaos.server.endpoints.chat_generate import (
    GenerativeRequest,
    chat_messages,
    generation_metrics,
    prompt_tokens,
)
from mmchaos.server.errors import BadModelOutput, RequestCancelled, ServerError, as_domain
from mmchaos.server.http_errors import ErrorAnswer, to_answer
from mmchaos.server.inputs import Turn
from mmchaos.server.model import as_is
from mmchaos.server.respond import disconnected, guarded
from mmchaos.server.work import ClientGone, GenerationStream, client_gone, unless_gone
from mmchaos.targets.generation import GenerationParams, Message, StreamUsage

__all__ = ["SSEResponse", "stream_chat", "stream_job"]


def stream_job(
    server: GuardedServer,
    turns: Sequence[Turn],
    params: GenerationParams,
    cancel: threading.Event,
    emit: Callable[[str], None],
) -> StreamUsage:
    """Decode, then stream the target's deltas through ``emit`` under the model lock and breaker.

    A cancelled request (its client left) stops at its next delta and closes the target's
    stream, so the model and the slot go to the next request. Where the continuous-batching
    engine takes the request, it streams from there, decoded with the running rows. Returns the stream's usage: the
    target's own counts where its stream returns them (:class:`StreamUsage`), else the text's
    tokens by the target's tokenizer.
    """
    messages = chat_messages(server, turns, cancel)
    engine = server.continuous
    if engine is not None and engine.takes(params):  # decoded with the running rows
        result = engine.submit(messages, params, cancel, on_delta=emit)
        spent = result.completions[0].token_ids
        return StreamUsage(prompt_tokens=result.prompt_tokens, completion_tokens=None if spent is None else len(spent))

    def run(msgs: list[Message]) -> StreamUsage:
        deltas = iter(server.target.generate_stream(msgs, (), params))
        sent: list[str] = []
        given: object = None
        try:
            while True:
                try:
                    delta = next(deltas)
                except StopIteration as end:  # a generator's return value: the target's own counts
                    given = end.value
                    break
                if cancel.is_set():
                    raise RequestCancelled()
                if not isinstance(delta, str):
                    raise BadModelOutput(
                        f"the model streamed {type(delta).__name__}, not text", code="bad_model_output"
                    )
                if delta:
                    emit(delta)
                    sent.append(delta)
        finally:
            close = getattr(deltas, "close", None)
            if callable(close):
                close()
        own = given if isinstance(given, StreamUsage) else StreamUsage()
        if own.completion_tokens is None:
            own = replace(own, completion_tokens=server.model.count_tokens("".join(sent)))
        return own

    usage: StreamUsage = server.model.call("chat", run, messages, as_is, cancel)
    return usage


async def stream_chat(server: GuardedServer, chat: GenerativeRequest, request: Request) -> Response:
    """Admit the stream and wait for its first delta (or its end, or its failure) before any byte."""
    job = partial(stream_job, server, chat.turns, chat.params)
    stream = await guarded(lambda: server.work.open_stream(job, pixels=chat.pixels, gone=disconnected(request)))
    gone = asyncio.ensure_future(disconnected(request))
    try:
        first = await unless_gone(stream.next(server.config.request_timeout), gone)
    except ClientGone as exc:
        stream.cancel()
        raise client_gone() from exc
    except TimeoutError as exc:
        stream.cancel()
        raise ServerError(
            f"no token within the {server.config.request_timeout:g}s request timeout", code="request_timeout"
        ) from exc
    except Exception as exc:
        stream.cancel()
        err = as_domain(exc)
        if err is exc:
            raise
        raise err from exc
    finally:
        gone.cancel()
    body = chat.body
    usage = body.stream_options is not None and body.stream_options.include_usage
    return SSEResponse(server, stream, first, request.state.request_id, chat, usage)


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
        chat: GenerativeRequest,
        include_usage: bool,
    ) -> None:
        self.server, self.stream, self.first = server, stream, first
        self.params, self.turns, self.arrived, self.include_usage = chat.params, chat.turns, chat.arrived, include_usage
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
        metrics = generation_metrics(self.server)
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
        error: ErrorAnswer | None = None
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
                error = to_answer(ServerError(f"no token for {timeout:g}s", code="request_timeout"))
                break
            except Exception as exc:
                error = to_answer(exc)
                break
        if error is not None:
            self.stream.cancel()
            if await emit(error.count(self.server.metrics).event()):
                await emit(b"data: [DONE]\n\n")
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return None
        full = "".join(text)
        given = self.stream.result
        own = given if isinstance(given, StreamUsage) else StreamUsage()
        counted = own.completion_tokens
        # Re-encoding the text can count more tokens than were generated (a byte-level model's broken
        # UTF-8 comes back as U+FFFD); a completion never has more than max_new_tokens.
        counted_tokens = counted if isinstance(counted, int) else (estimate_tokens(full) if full else 0)
        completion_tokens = min(counted_tokens, self.params.max_new_tokens)
        finish = "length" if completion_tokens >= self.params.max_new_tokens else "stop"
        # The target's own prompt count (image tokens included), as the answer without stream gives.
        prompt = own.prompt_tokens if isinstance(own.prompt_tokens, int) else prompt_tokens(None, self.turns)
        if not await emit(self._chunk({}, finish)):
            return gone()
        if self.include_usage:
            usage = {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                     "total_tokens": prompt + completion_tokens}  # fmt: skip
            if not await emit(self._chunk({}, usage=usage)):
                return gone()
        if not await emit(b"data: [DONE]\n\n"):
            return gone()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        end = time.perf_counter()
        if first_at is not None and last_at is not None and completion_tokens > 1:
            metrics.tpot.observe((last_at - first_at) / (completion_tokens - 1))
        metrics.success.labels(self.server.model_name, finish).inc()
        metrics.finished_tokens(prompt, completion_tokens, end - self.arrived)
        return None


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
