"""A FAKE OpenAI-compatible server on a loopback port, for the ``openai:`` target's tests.

It is a fake because the servers it imitates (vLLM, LiteLLM, an infinity-style embeddings server)
cannot run here: no GPU, no network. It speaks real HTTP on 127.0.0.1 (http.server), so the
target's real client, JSON and SSE code run. What it accepts is configurable per test:

- ``image_forms``: which ways of sending an image to ``/v1/embeddings`` it understands:
  ``"messages"`` (vLLM's chat-embeddings), ``"input_parts"`` (``input`` items with ``image_url``),
  ``"data_url"`` (``input`` strings that are ``data:image/...`` URLs, as LiteLLM and infinity-style
  servers take them), ``"modality"`` (infinity's: ``input`` strings are images only when the body
  says ``"modality": "image"``; without it, a data URL is embedded as text, as infinity does).
  Anything else in ``input`` is embedded as text, data URLs included, as a text-only server would do.
- ``chat_images``: whether ``/v1/chat/completions`` takes ``image_url`` parts (else 400).
- ``flavour``: the response shapes of one server family, from their sources and docs:
  ``"openai"`` (and vLLM >= 0.8) nests errors as ``{"error": {"message", "type", "code"}}``;
  ``"sglang"`` (and older vLLM) answers errors at the top level, ``{"object": "error", "message",
  "type", "param", "code": 400}``, and gives each logprob entry its ``token_id``; ``"tgi"``
  (text-generation-inference) answers ``{"error": "...", "error_type": "validation"}`` with 422,
  finish reasons ``eos_token`` / ``stop_sequence`` and one choice whatever ``n`` is; ``"ollama"``
  lists models with tags (``llava:latest``) and takes a name without its tag as ``:latest``, ignores
  ``n`` and ``logprobs`` (no logprobs in the answer) and nests errors with ``code: null``;
  ``"litellm"`` takes ``image_url`` as an object or as a bare data-URL string and sends the status
  as a string ``code``.
- ``dies_on_side``: a deliberately broken engine: one image with a side larger than this kills it,
  and every later embeddings request answers 500 (0: never).
- ``text_limit``: a text context limit in tokens (a word each, plus two specials); past it a text is
  refused with a typed 400 (``over_limit="refuse"``, correct) or silently cut (``"truncate"``, as a
  CLIP pipeline does). 0: no limit.
- ``metrics``: what ``GET /metrics`` exports for chat traffic: "" nothing (404); "vllm" vLLM's chat
  series, counted as vLLM counts them (end-to-end latency and tokens per finished request, time to
  first token and per-token latency, the running/waiting gauges); "sglang" the same under SGLang's
  names; broken: "no_latency" only the gauges and token counters (no latency histogram at all),
  "static_counters" every series, but the token counters never move.

Images it cannot decode (truncated, garbage, bombs) and bodies that are not JSON objects get a typed
400, as a correct server answers them.

Embeddings: an image is ``[mean R, mean G, mean B, 1]`` of its decoded pixels / 255, a text a
hash-derived vector, so answers depend on pixels (not on the PNG's bytes) and on text exactly.
Chat: the reply names each image's dominant colour, then the words of the last text, one token a
word, cut at ``max_tokens`` (finish_reason "length"); sampling (temperature > 0) shuffles the
words with ``seed`` + choice index; logprobs are ``-0.1 * (position + 1)``; ``stream`` sends SSE.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from PIL import Image

from tests.fakes.loopback import serving

COLOURS = {0: "red", 1: "green", 2: "blue"}


def _pixels(url: str) -> np.ndarray:
    head, _, payload = url.partition(",")
    if not head.startswith("data:image/") or ";base64" not in head:
        raise ValueError("not an image data URL")
    try:
        return np.asarray(Image.open(io.BytesIO(base64.b64decode(payload))).convert("RGB"), dtype=np.float32)
    except Exception as exc:  # a correct server refuses what it cannot decode (bombs included): a 400
        raise ValueError(f"cannot decode the image: {type(exc).__name__}") from None


def image_vector(url: str, config: FakeConfig | None = None) -> list[float]:
    px = _pixels(url)
    if config is not None and config.dies_on_side and max(px.shape[:2]) > config.dies_on_side:
        config.dead = True
        raise _EngineDead
    return [*(px.reshape(-1, 3).mean(0) / 255.0).tolist(), 1.0]


class _EngineDead(Exception):
    """The broken engine's illegal memory access: the request, and every later one, answers 500."""


def text_vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [b / 255.0 for b in digest[:4]]


def colour_of(url: str) -> str:
    return COLOURS[int(np.argmax(_pixels(url).reshape(-1, 3).mean(0)))]


@dataclass
class FakeConfig:
    image_forms: tuple[str, ...] = ("data_url",)
    chat: bool = True
    chat_images: bool = True
    model: str = "fake-vlm"
    ignore_n: bool = False
    """Answer one choice whatever ``n`` asks (Ollama-style)."""
    refuse_logprobs: bool = False
    """Answer 400 to ``logprobs: true`` (servers without logprob support)."""
    stream_fault: str = ""
    """"truncate": cut the SSE stream after its second delta (no finish_reason, no ``[DONE]``);
    "no_done": end it after the finish_reason chunk without ``[DONE]`` (transformers serve's shape, a
    complete stream); "error": send an error event midway."""
    stream_pause_s: float = 0.0
    """A pause before each stream event after the first (an engine decoding token by token): each
    event then reaches the client in a read of its own."""
    flavour: str = "openai"
    dies_on_side: int = 0
    """An image with a side larger than this kills the engine: every later embeddings request is a 500."""
    dead: bool = False
    chat_bad_image: str = ""
    """A chat image it cannot decode: "" a typed 400 (correct); broken: "empty" answers 200 with
    empty content, "crash" a 500 (the engine fell over)."""
    text_limit: int = 0
    over_limit: str = "truncate"
    max_model_len: int = 0
    """Put vLLM's ``max_model_len`` on the model card (0: leave it out)."""
    metrics: str = ""
    stream_usage: bool = False
    """Send a usage chunk at the end of a stream that asks for it (``stream_options.include_usage``)."""
    fail_at: set[int] = field(default_factory=set)
    """POSTs (by their position in ``requests``) answered 500 once, as an upstream hop's failure."""
    requests: list[dict[str, Any]] = field(default_factory=list)


class JSONHandler(BaseHTTPRequestHandler):
    """A quiet request handler that answers JSON bodies (the fake servers' shared base)."""

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Handler(JSONHandler):
    server: _Server

    def _error(self, status: int, message: str) -> None:
        flavour = self.server.config.flavour
        if flavour == "sglang":
            return self._send(status, {"object": "error", "message": message, "type": "BadRequestError",
                                       "param": None, "code": status})  # fmt: skip
        if flavour == "tgi":
            return self._send(422 if status == 400 else status, {"error": message, "error_type": "validation"})
        kind, default = (
            ("server_error", "internal_error") if status >= 500 else ("invalid_request_error", "bad_request")
        )
        code: Any = {"ollama": None, "litellm": str(status)}.get(flavour, default)
        self._send(status, {"error": {"message": message, "type": kind, "param": None, "code": code}})

    def _models(self) -> list[str]:
        model = self.server.config.model
        return [f"{model}:latest", "llama3:8b"] if self.server.config.flavour == "ollama" else [model]

    def do_GET(self) -> None:
        if self.path == "/metrics" and self.server.metrics is not None:
            from prometheus_client import generate_latest

            data = generate_latest(self.server.metrics.registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif self.path == "/v1/models":
            cards = [{"id": m, "object": "model", "created": 1700000000, "owned_by": "library"} for m in self._models()]
            if self.server.config.max_model_len:
                for card in cards:
                    card["max_model_len"] = self.server.config.max_model_len
            self._send(200, {"object": "list", "data": cards})
        else:
            self._error(404, "not found")

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise TypeError("the body is not a JSON object")
            self.server.config.requests.append({"path": self.path, "body": body})
            if len(self.server.config.requests) - 1 in self.server.config.fail_at:
                return self._error(500, "upstream: litellm.APIConnectionError")
            if self.path == "/v1/embeddings":
                self._embeddings(body)
            elif self.path == "/v1/chat/completions" and self.server.config.chat:
                self._chat(body)
            else:
                self._error(404, "not found")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self._error(400, f"bad request: {exc}")

    def _embeddings(self, body: dict[str, Any]) -> None:
        config = self.server.config
        if config.dead:
            return self._error(500, "CUDA error: an illegal memory access was encountered")
        try:
            self._embed(body)
        except _EngineDead:
            self._error(500, "CUDA error: an illegal memory access was encountered")

    def _embed(self, body: dict[str, Any]) -> None:
        config = self.server.config
        forms = config.image_forms
        if "messages" in body:
            if "messages" not in forms:
                return self._error(400, "messages are not supported for embeddings")
            parts = body["messages"][0]["content"]
            vectors = [image_vector(p["image_url"]["url"], config) for p in parts if p.get("type") == "image_url"]
        else:
            items = body["input"] if isinstance(body["input"], list) else [body["input"]]
            vectors = []
            images = "modality" in forms and body.get("modality") == "image"
            for item in items:
                if images:
                    vectors.append(image_vector(item, config))
                elif isinstance(item, dict):
                    if "input_parts" not in forms:
                        return self._error(400, "input must be strings")
                    vectors.append(image_vector(item["image_url"]["url"], config))
                elif "data_url" in forms and item.startswith("data:image/"):
                    vectors.append(image_vector(item, config))
                else:
                    vectors.append(text_vector(self._within_limit(item)))  # a data URL too, as a text server does
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
        self._send(200, {"object": "list", "data": data, "model": config.model})

    def _within_limit(self, text: str) -> str:
        limit = self.server.config.text_limit
        words = text.split(" ")
        if not limit or len(words) + 2 <= limit:
            return text
        if self.server.config.over_limit == "refuse":
            raise ValueError(f"this model's maximum context length is {limit} tokens, the text has {len(words) + 2}")
        return " ".join(words[: limit - 2])

    def _chat(self, body: dict[str, Any]) -> None:
        flavour = self.server.config.flavour
        model = str(body.get("model", ""))
        if flavour == "ollama" and ":" not in model:
            model += ":latest"  # Ollama's implicit tag
        if model not in self._models():
            return self._error(404, f"model {body.get('model')!r} not found")
        if not body["messages"]:
            raise ValueError("messages must not be empty")  # a typed 400, as every server answers it
        colours: list[str] = []
        last_text = ""
        for message in body["messages"]:
            content = message["content"]
            for part in [{"type": "text", "text": content}] if isinstance(content, str) else content:
                if part["type"] == "image_url":
                    if not self.server.config.chat_images:
                        return self._error(400, "this model does not take images")
                    image_url = part["image_url"]
                    if isinstance(image_url, str) and flavour != "litellm":
                        raise TypeError("image_url must be an object with a url")
                    try:
                        colours.append(colour_of(image_url if isinstance(image_url, str) else image_url["url"]))
                    except ValueError:
                        if self.server.config.chat_bad_image == "empty":
                            return self._send(200, {"id": "chatcmpl-1", "object": "chat.completion", "choices": [
                                {"index": 0, "message": {"role": "assistant", "content": ""},
                                 "finish_reason": "stop"}]})  # fmt: skip
                        if self.server.config.chat_bad_image == "crash":
                            return self._error(500, "CUDA error: an illegal memory access was encountered")
                        raise
                elif part["type"] == "text":
                    last_text = part["text"]
        words = colours + last_text.split()
        if body.get("logprobs") and self.server.config.refuse_logprobs:
            return self._error(400, "logprobs are not supported by this server")
        n, max_tokens = int(body.get("n", 1)), int(body.get("max_tokens") or 16)
        if self.server.config.ignore_n or flavour in ("tgi", "ollama"):
            n = 1
        choices = []
        for i in range(n):
            ws = list(words)
            if float(body.get("temperature", 1.0)) > 0:
                random.Random(f"{body.get('seed')}-{i}").shuffle(ws)
            cut = ws[:max_tokens]
            text = " ".join(cut)
            finish = "length" if len(ws) > max_tokens else "eos_token" if flavour == "tgi" else "stop"
            for stop in body.get("stop") or []:
                if stop in text:
                    text, finish = text[: text.index(stop)], "stop_sequence" if flavour == "tgi" else "stop"
            choice: dict[str, Any] = {"index": i, "message": {"role": "assistant", "content": text},
                                      "finish_reason": finish}  # fmt: skip
            if body.get("logprobs") and flavour != "ollama":
                tokens = [w if j == 0 else " " + w for j, w in enumerate(cut)]
                choice["logprobs"] = {"content": [{"token": t, "logprob": -0.1 * (j + 1), "bytes": list(t.encode()),
                                                   "top_logprobs": []} for j, t in enumerate(tokens)]}  # fmt: skip
                if flavour == "sglang":
                    for entry in choice["logprobs"]["content"]:
                        entry["token_id"] = sum(map(ord, entry["token"].strip()))
            choices.append(choice)
        usage = {"prompt_tokens": len(words) + 3, "completion_tokens": len(choices[0]["message"]["content"].split())}
        if self.server.metrics is not None:
            self.server.metrics.finished(usage)
        if body.get("stream"):
            asked = bool((body.get("stream_options") or {}).get("include_usage")) and self.server.config.stream_usage
            return self._stream(choices[0], usage if asked else None)
        self._send(200, {"id": "chatcmpl-1", "object": "chat.completion", "model": self.server.config.model,
                         "choices": choices, "usage": usage})  # fmt: skip

    def _stream(self, choice: dict[str, Any], usage: dict[str, int] | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        text = choice["message"]["content"]
        pieces = [w if j == 0 else " " + w for j, w in enumerate(text.split(" "))] if text else []
        events = [{"delta": {"role": "assistant"}}] + [{"delta": {"content": p}} for p in pieces]
        events.append({"delta": {}, "finish_reason": choice["finish_reason"]})
        fault = self.server.config.stream_fault
        if fault == "truncate":
            events = events[:3]
        for i, event in enumerate(events):
            if i > 1 and self.server.config.stream_pause_s:
                time.sleep(self.server.config.stream_pause_s)
            chunk: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk",
                                     "choices": [{"index": 0, **event}]}  # fmt: skip
            if fault == "error" and i == 2:
                chunk = {"error": {"message": "engine died", "code": 500}}
            try:
                self.wfile.write(f": keep-alive\n\ndata: {json.dumps(chunk)}\n\n".encode())
            except OSError:  # the client left mid-stream
                self.close_connection = True
                return
        if usage is not None and fault != "truncate":
            chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": usage}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if fault not in ("truncate", "no_done"):
            self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


class _ChatMetrics:
    """vLLM's chat series as the fake exports them (``FakeConfig.metrics``); its answers are instant,
    so the latencies observed are nominal: what is judged is that they are counted."""

    def __init__(self, kind: str, model: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.kind = kind
        self.registry = CollectorRegistry()
        labels = ("model_name",)
        r = self.registry
        sglang = kind == "sglang"
        pre = "sglang:" if sglang else "vllm:"
        per_token = "inter_token_latency_seconds" if sglang else "time_per_output_token_seconds"
        self.histograms = {} if kind == "no_latency" else {
            name: Histogram(pre + name, name, labels, registry=r).labels(model)
            for name in ("e2e_request_latency_seconds", "time_to_first_token_seconds", per_token)
        }  # fmt: skip
        self.prompt = Counter(pre + "prompt_tokens", "prompt tokens", labels, registry=r).labels(model)
        self.generated = Counter(pre + "generation_tokens", "generated tokens", labels, registry=r).labels(model)
        self.success = Counter(pre + "request_success", "finished", labels, registry=r).labels(model)
        gauges = ("num_running_reqs", "num_queue_reqs") if sglang else ("num_requests_running", "num_requests_waiting")
        for name in gauges:
            Gauge(pre + name, name, labels, registry=r).labels(model).set(0)

    def finished(self, usage: dict[str, int]) -> None:
        self.success.inc()
        for hist in self.histograms.values():
            hist.observe(0.01)
        if self.kind != "static_counters":
            self.prompt.inc(usage["prompt_tokens"])
            self.generated.inc(usage["completion_tokens"])


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, config: FakeConfig) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.config = config
        self.metrics = _ChatMetrics(config.metrics, config.model) if config.metrics else None


@contextmanager
def fake_openai_server(config: FakeConfig) -> Iterator[str]:
    """Serve ``config`` on a loopback port; yields the base URL (``http://127.0.0.1:P/v1``)."""
    server = _Server(config)
    with serving(server) as url:
        yield url
