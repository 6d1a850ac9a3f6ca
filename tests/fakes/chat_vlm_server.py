"""FAKE chat VLM servers that expose nothing: no logprobs, no gauges, one bug each (or none).

What many real OpenAI-compatible servers look like from outside (transformers serve, Ollama,
gateways), which cannot run here: ``/v1/chat/completions`` answers from the pixels (the honest
``PixelVQATarget`` reading the latest image of the conversation, with the last user turn's text),
non-streamed or as server-sent events, and ignores ``logprobs``; ``/metrics`` is 404. It has a
fixed number of slots (a request past them is answered 429) and a question it does not recognise
("What is in this image?") gets a description that runs on until ``max_tokens``, so two different
open questions about one picture get the same answer, as a real model's often do.

The bugs, one per :class:`ChatServerConfig` field, each what a real serving stack gets wrong:

- ``cache="prompt_text"``: a response cache keyed on the request's text alone (its images, ``user``,
  ``seed`` and ``max_tokens`` ignored): the second image under one question gets the first's answer;
- ``leak_slots``: a stream whose client leaves keeps its slot forever (generation never aborted);
- ``stale_image="first"``: every turn of a chat is answered about the chat's first image;
- ``dies_on_disconnect``: a stream whose client leaves kills the engine (as vLLM's engine died on an
  abort race, ``AsyncEngineDeadError``): every later request is answered 500, and it never comes back;
- ``stale_after_left=N``: streams whose client left are never freed from its cache; from the N-th
  on, every request is answered about the image of the last one left with an image (its block
  reused), fast and with 200, so only answers checked against the truth show it (vLLM's aborted
  requests once corrupted its prefix cache this way);
- ``drop_every=N``: every N-th stream stops after its first delta, and the server closes the
  connection cleanly, with no ``finish_reason`` and no ``[DONE]`` (a worker dying mid-generation
  behind a server that does not say so): only a client that checks how a stream ends can tell.

Real HTTP on 127.0.0.1 (``http.server``), so the checks' real clients, JSON and SSE code run.

``ignore_max_tokens`` drops the request's ``max_tokens``: every answer runs to the server's own
limit (:data:`OWN_MAX_TOKENS`) and says ``finish_reason: "stop"``. ``stop`` strings end the
(non-streamed) answer before the first one, as OpenAI's API says.
"""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any, Literal

import numpy as np
from PIL import Image

from tests.fakes.loopback import serving
from tests.fakes.openai_server import JSONHandler
from tests.fakes.vlm import PixelVQATarget, question_kind

__all__ = ["OWN_MAX_TOKENS", "ChatServerConfig", "chat_vlm_server"]

OWN_MAX_TOKENS = 64
"""The limit a server that ignores ``max_tokens`` generates to."""

_READER = PixelVQATarget()


@dataclass
class ChatServerConfig:
    """One server's behaviour; the defaults are the clean server."""

    cache: Literal["none", "prompt_text"] = "none"
    leak_slots: bool = False
    stale_image: Literal["none", "first"] = "none"
    dies_on_disconnect: bool = False
    drop_every: int = 0
    stale_after_left: int = 0
    slots: int = 4
    ignore_max_tokens: bool = False
    token_delay_s: float = 0.002
    """Seconds between two streamed deltas (the model's decode time per token)."""
    model: str = "blackbox-vlm"
    requests: list[dict[str, Any]] = field(default_factory=list)
    """Every request body received, in order (for the tests to read)."""
    dead: bool = False
    """``dies_on_disconnect``: the engine died (every request is a 500 from then on)."""
    streams: int = 0
    """Streams started (``drop_every`` counts them)."""
    left: int = 0
    """Streams whose client left mid-way."""


def _image(url: str) -> np.ndarray:
    head, _, payload = url.partition(",")
    if not head.startswith("data:image/") or ";base64" not in head:
        raise ValueError("not an image data URL")
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(payload))).convert("RGB"), dtype=np.uint8)


def _turns(body: dict[str, Any]) -> tuple[list[np.ndarray], str, str]:
    """(every image of the chat in order, the last user turn's text, all the chat's text)."""
    images: list[np.ndarray] = []
    last_text, all_text = "", []
    for message in body["messages"]:
        content = message["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        texts = []
        for part in parts:
            if part["type"] == "image_url":
                url = part["image_url"] if isinstance(part["image_url"], str) else part["image_url"]["url"]
                images.append(_image(url))
            elif part["type"] == "text":
                texts.append(part["text"])
        all_text.append(f"{message['role']}:{''.join(texts)}")
        if message["role"] == "user":
            last_text = " ".join(texts)
    return images, last_text, "\x00".join(all_text)


def _words(image: np.ndarray | None, question: str, max_tokens: int) -> tuple[list[str], str]:
    """The answer's words (one token each) and its finish reason."""
    if question_kind(question) is not None or image is None:
        words = _READER.answer(image, question).split()
    else:  # an open question: a description that goes on until it is cut off
        colour = _READER.answer(image, "What colour is the shape?")
        shape = _READER.answer(image, "What shape is it?")
        where = _READER.answer(image, "Where is the shape?")
        sentence = f"a {colour} {shape} at the {where} of the picture,".split()
        words = (sentence * (max_tokens // len(sentence) + 1))[: max_tokens + 1]
    if len(words) > max_tokens:
        return words[:max_tokens], "length"
    return words, "stop"


class _Handler(JSONHandler):
    server: _Server
    image: np.ndarray | None = None
    """The image the request in hand is answered about."""

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": {"message": message, "type": "invalid_request_error", "code": status}})

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": self.server.config.model, "object": "model"}]})
        else:
            self._error(404, "not found")  # /metrics too: this server exports no gauges

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        config = self.server.config
        with self.server.lock:
            config.requests.append(body)
        if self.path != "/v1/chat/completions":
            return self._error(404, "not found")
        if config.dead:
            return self._send(500, {"error": {"message": "AsyncEngineDeadError: background loop has errored",
                                              "type": "server_error", "code": 500}})  # fmt: skip
        if not self.server.slots.acquire(blocking=False):
            return self._error(429, "all slots are busy")
        keep_slot = False
        try:
            words, finish = self._answer(body)
            if body.get("stream"):
                keep_slot = self._stream(words, finish)
            else:
                text = " ".join(words)
                stops = [body["stop"]] if isinstance(body.get("stop"), str) else body.get("stop") or []
                cuts = [i for i in (text.find(stop) for stop in stops) if i >= 0]
                if cuts:
                    text, finish = text[: min(cuts)], "stop"
                self._send(200, {"id": "chatcmpl-bb", "object": "chat.completion", "model": config.model,
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                              "finish_reason": finish}],
                                 "usage": {"prompt_tokens": 9, "completion_tokens": len(text.split())}})  # fmt: skip
        except (ValueError, KeyError, TypeError) as exc:
            self._error(400, f"bad request: {exc}")
        finally:
            if not keep_slot:
                self.server.slots.release()

    def _answer(self, body: dict[str, Any]) -> tuple[list[str], str]:
        config = self.server.config
        images, question, all_text = _turns(body)
        max_tokens = OWN_MAX_TOKENS if config.ignore_max_tokens else int(body.get("max_tokens") or 16)
        if config.cache == "prompt_text":
            with self.server.lock:
                hit = self.server.cache.get(all_text)
            if hit is not None:
                return hit
        image = (images[0] if config.stale_image == "first" else images[-1]) if images else None
        self.image = image
        if self.server.stale is not None:
            image = self.server.stale
        answer = _words(image, question, max_tokens)
        if config.ignore_max_tokens:
            answer = (answer[0], "stop")
        if config.cache == "prompt_text":
            with self.server.lock:
                self.server.cache.setdefault(all_text, answer)
        return answer

    def _stream(self, words: list[str], finish: str) -> bool:
        """Stream the answer; True when the client left and the slot is (wrongly) kept."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.close_connection = True
        deltas = [{"role": "assistant"}] + [{"content": w if i == 0 else " " + w} for i, w in enumerate(words)]
        events = [{"index": 0, "delta": d} for d in deltas] + [{"index": 0, "delta": {}, "finish_reason": finish}]
        config = self.server.config
        with self.server.lock:
            config.streams += 1
            dropped = bool(config.drop_every) and config.streams % config.drop_every == 0
        try:
            for event in events[:2] if dropped else events:
                time.sleep(config.token_delay_s)
                chunk = {"id": "chatcmpl-bb", "object": "chat.completion.chunk", "choices": [event]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            if not dropped:
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
        except OSError:  # the client left mid-stream
            with self.server.lock:
                config.left += 1
                # a text-only stream holds no image block: the one reused stays the last image left
                if config.stale_after_left and config.left >= config.stale_after_left and self.image is not None:
                    self.server.stale = self.image
            if config.dies_on_disconnect:
                config.dead = True
            return config.leak_slots
        return False


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, config: ChatServerConfig) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.config = config
        self.slots = threading.BoundedSemaphore(config.slots)
        self.lock = threading.Lock()
        self.cache: dict[str, tuple[list[str], str]] = {}
        self.stale: np.ndarray | None = None


@contextmanager
def chat_vlm_server(config: ChatServerConfig | None = None) -> Iterator[str]:
    """Serve ``config`` (the clean server by default) on a loopback port; yields ``http://127.0.0.1:P/v1``."""
    server = _Server(config or ChatServerConfig())
    with serving(server) as url:
        yield url
