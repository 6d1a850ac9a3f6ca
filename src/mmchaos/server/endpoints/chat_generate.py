"""Chat completions of a generative target, not streamed: OpenAI's request in, OpenAI's answer out.

The request's images go through the same guards as every other input (declared pixels before
admission, Preflight in the worker), the model call through the model lock and the breaker; with
batching on, requests with the same sampling parameters share one batched ``generate`` (left
padded, as the target pads) when the target batches (:func:`batch_key` says which may).
What a streamed answer shares with this one (the request's sampling fields, its turns, the usage
counts) is here too; :mod:`.chat_stream` streams.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from mmchaos.errors import TargetCallError
from mmchaos.guard.preflight import estimate_tokens
from mmchaos.server.core import GuardedServer
from mmchaos.server.errors import BadModelOutput, ServerError
from mmchaos.server.inputs import Turn, chat_turns
from mmchaos.server.metrics import GenerationMetrics
from mmchaos.server.model import as_is
from mmchaos.server.protocol import MAX_TEMPERATURE, MIN_TEMPERATURE, ChatCompletionRequest
from mmchaos.server.respond import disconnected, guarded, json_response
from mmchaos.targets.generation import GenerationParams, GenerationResult, Message

__all__ = [
    "GenerativeRequest",
    "batch_key",
    "chat_messages",
    "generate_answers",
    "generate_chat",
    "generate_job",
    "generation_metrics",
    "generation_params",
    "generative_request",
    "prompt_tokens",
]

#: vLLM's stand-in for a logprob of -inf (JSON has no infinity).
_NEG_INF_LOGPROB = -9999.0
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass(frozen=True, slots=True)
class GenerativeRequest:
    """A chat request checked before admission: its fields, turns (nothing decoded) and pixels."""

    body: ChatCompletionRequest
    params: GenerationParams
    turns: list[Turn]
    pixels: int
    arrived: float  # perf_counter at arrival


def generation_params(body: ChatCompletionRequest, server: GuardedServer) -> GenerationParams:
    """The request's sampling fields as GenerationParams; 400 with the field named when one is bad."""
    cfg = server.config
    limit = body.max_completion_tokens or body.max_tokens or cfg.default_max_tokens
    if limit > cfg.max_tokens_limit:
        field = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        raise ServerError(
            f"{field} is {limit}; this server generates at most {cfg.max_tokens_limit}",
            code="max_tokens_too_large", param=field,
        )  # fmt: skip
    if body.stream and body.n != 1:
        raise ServerError("a stream carries one completion: use n=1 with stream", code="n_unsupported", param="n")
    temperature = body.temperature
    if (
        temperature is not None
        and math.isfinite(temperature)
        and not (temperature == 0 or MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE)
    ):
        raise ServerError(
            f"temperature must be 0 (greedy) or from {MIN_TEMPERATURE:g} to {MAX_TEMPERATURE:g}, got {temperature!r}",
            code="bad_generation_params", param="temperature",
        )  # fmt: skip
    if body.top_logprobs and not body.logprobs:
        raise ServerError("top_logprobs needs logprobs: true", code="bad_generation_params", param="top_logprobs")
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
            top_logprobs=body.top_logprobs or 0,
        )
    except TargetCallError as err:  # the request's sampling fields, refused by their own check
        raise ServerError(err.message, code=err.code, origin="request") from None


def generative_request(server: GuardedServer, body: ChatCompletionRequest) -> GenerativeRequest:
    """Everything checked before admission: sampling fields, roles, content parts, declared pixels."""
    arrived = time.perf_counter()
    params = generation_params(body, server)
    turns = chat_turns(body.messages, server.config.max_items)
    pixels = server.declared_pixels([i for t in turns for i in t.items], param="messages")
    return GenerativeRequest(body, params, turns, pixels, arrived)


def generation_metrics(server: GuardedServer) -> GenerationMetrics:
    if server.generation is None:  # only a target without GENERATE has none, and it never gets here
        raise ServerError(f"{server.model_name} does not generate", code="capability_missing")
    return server.generation


def chat_messages(server: GuardedServer, turns: Sequence[Turn], cancel: threading.Event) -> list[Message]:
    """The turns' inputs checked and decoded (Preflight), as the target's messages."""
    flat = [item for turn in turns for item in turn.items]
    values = iter(server.model.decode(flat, cancel))
    messages = []
    for turn in turns:
        parts = tuple(next(values) for _ in turn.items)
        role = _ROLES[turn.role]
        content: str | tuple[Any, ...] = (parts[0] if parts else "") if turn.plain else parts
        messages.append(Message(role, content))  # type: ignore[arg-type]
    return messages


def _check_generation(out: Any, n: int) -> GenerationResult:
    if not isinstance(out, GenerationResult) or len(out.completions) < n:
        got = len(out.completions) if isinstance(out, GenerationResult) else type(out).__name__
        raise BadModelOutput(f"the model returned {got} completions for n={n}", code="bad_model_output")
    for c in out.completions[:n]:
        if not isinstance(c.text, str):
            raise BadModelOutput(f"the model returned {type(c.text).__name__} as text", code="bad_model_output")
        if c.logprobs is not None and any(math.isnan(x) or x == math.inf for x in c.logprobs):
            raise BadModelOutput("the model returned NaN or +inf token logprobs", code="non_finite_output")
    return out


_Answer = tuple[GenerationResult, list[list[str]] | None]


def batch_key(server: GuardedServer, params: GenerationParams) -> GenerationParams | None:
    """What requests must share to be one batched ``generate``: their sampling parameters (less the
    seed of a greedy request, which draws nothing, and the end-user id); None: run alone.

    Seeded sampling runs alone: a seed promises the same answer as the request alone, and a batch
    draws every row's tokens from one generator."""
    if not server.batch_generation or (params.seed is not None and not params.greedy):
        return None
    return dataclasses.replace(params, seed=None if params.greedy else params.seed, user=None)


def generate_answers(
    server: GuardedServer,
    params: GenerationParams,
    requests: Sequence[tuple[list[Message], GenerationParams, bool]],
    cancel: threading.Event,
) -> list[_Answer]:
    """The answers of several requests (their messages, own params and ``token_ids`` flag) in one
    model call: ``generate`` alone for one, ``generate_batch`` with ``params`` for several, and with
    logprobs each completion's tokens as text (decoded under the model lock)."""

    def call(batch: Sequence[tuple[list[Message], GenerationParams, bool]]) -> list[_Answer]:
        if len(batch) == 1:
            messages, own, _ = batch[0]
            results = [server.target.generate(messages, (), own)]
        else:
            results = list(server.target.generate_batch([m for m, _, _ in batch], params))
            if len(results) != len(batch):
                raise BadModelOutput(
                    f"the model returned {len(results)} answers for a batch of {len(batch)}", code="bad_model_output"
                )
        answers: list[_Answer] = []
        for (_, own, token_ids), result in zip(batch, results, strict=True):
            result = _check_generation(result, own.n)
            texts = None
            if own.logprobs:
                texts = [_token_texts(server, c, own, token_ids) for c in result.completions[: own.n]]
            answers.append((result, texts))
        return answers

    answers: list[_Answer] = server.model.call("chat", call, requests, as_is, cancel, tentative=len(requests) > 1)
    return answers


def generate_job(
    server: GuardedServer, turns: Sequence[Turn], params: GenerationParams, token_ids: bool, cancel: threading.Event
) -> _Answer:
    """The answer, and with ``params.logprobs`` each completion's tokens as text (decoded under the
    model lock, as ``token_id:N`` with ``token_ids``); batched with other requests' when it may be:
    decoded with the running rows by the continuous-batching engine where it takes the request,
    else in one ``generate_batch`` with requests of the same sampling parameters."""
    engine = server.continuous
    if engine is not None and engine.takes(params):
        messages = chat_messages(server, turns, cancel)
        result = _check_generation(engine.submit(messages, params, cancel), params.n)
        texts = None
        if params.logprobs:
            with server.model.lock:  # fast tokenizers are not thread-safe
                texts = [_token_texts(server, c, params, token_ids) for c in result.completions[: params.n]]
        return result, texts
    shared = batch_key(server, params)
    if shared is None or server.batcher is None:
        request = (chat_messages(server, turns, cancel), params, token_ids)
        return generate_answers(server, params, [request], cancel)[0]
    with server.batcher.joining() as submit:
        request = (chat_messages(server, turns, cancel), params, token_ids)
        answer: _Answer = submit(("chat", shared), request, partial(generate_answers, server, shared), cancel)
    return answer


class _TokenTexts(list[str]):
    """A completion's tokens as text, and ``top``: at each step its most likely tokens (text,
    logprob), best first, where ``top_logprobs`` asked for them."""

    top: list[list[tuple[str, float]]]


def _token_texts(server: GuardedServer, completion: Any, params: GenerationParams, as_ids: bool) -> list[str]:
    """``completion``'s tokens, and with ``params.top_logprobs`` its top tokens, as text by the
    target's tokenizer (``token_id:N`` with ``as_ids``); called under the model lock."""
    texts = _TokenTexts(server.model.token_texts(completion.token_ids or (), as_ids))
    texts.top = []
    if params.top_logprobs:
        for step in (completion.top_logprobs or ())[: len(completion.token_ids or ())]:
            ranked = sorted(step.items(), key=lambda kv: -kv[1])[: params.top_logprobs]
            names = server.model.token_texts([i for i, _ in ranked], as_ids)
            texts.top.append([(name, float(v)) for name, (_, v) in zip(names, ranked, strict=True)])
    return texts


def _finite(lp: float) -> float:
    return float(lp) if math.isfinite(lp) else _NEG_INF_LOGPROB


def _logprobs(completion: Any, tokens: Sequence[str]) -> dict[str, Any] | None:
    if completion.logprobs is None:
        return None
    n = len(completion.logprobs)
    names = list(tokens) if len(tokens) == n else [""] * n
    top = getattr(tokens, "top", None) or []
    tops = top if len(top) == n else [[] for _ in range(n)]
    entries = []
    for token, lp, ranked in zip(names, completion.logprobs, tops, strict=True):
        alternatives = [{"token": t, "logprob": _finite(v), "bytes": list(t.encode())} for t, v in ranked]
        entries.append({"token": token, "logprob": _finite(lp), "bytes": list(token.encode()),
                        "top_logprobs": alternatives})  # fmt: skip
    return {"content": entries}


def prompt_tokens(result: GenerationResult | None, turns: Sequence[Turn]) -> int:
    """The target's own count where it gives one, else an estimate (texts' tokens, one per image)."""
    if result is not None and isinstance(result.prompt_tokens, int):
        return result.prompt_tokens
    return sum(estimate_tokens(i.value) if i.modality == "text" else 1 for t in turns for i in t.items)


def _completion_tokens(completions: Sequence[Any]) -> int:
    if all(c.token_ids is not None for c in completions):
        return sum(len(c.token_ids) for c in completions)
    return sum(estimate_tokens(c.text) if c.text else 0 for c in completions)


async def generate_chat(server: GuardedServer, chat: GenerativeRequest, request: Request) -> Response:
    """``/v1/chat/completions`` for a target with the ``generate`` capability, not streamed."""
    params, turns = chat.params, chat.turns
    job = partial(generate_job, server, turns, params, chat.body.return_tokens_as_token_ids)
    result, tokens = await guarded(lambda: server.work.run(job, pixels=chat.pixels, gone=disconnected(request)))
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
    prompt = prompt_tokens(result, turns)
    completion = _completion_tokens(completions)
    metrics = generation_metrics(server)
    for c in completions:
        metrics.success.labels(server.model_name, c.finish_reason).inc()
    metrics.finished_tokens(prompt, completion, time.perf_counter() - chat.arrived)
    return json_response(
        {
            "id": f"chatcmpl-{request.state.request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": server.model_name,
            "choices": choices,
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }
    )
