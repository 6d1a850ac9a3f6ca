"""A FAKE chat server that closes a keep-alive connection after answering 500, as uvicorn does.

uvicorn (under ``transformers serve``, and every FastAPI server) answers an exception escaping the
application with ``500 Internal Server Error`` and then closes the connection, without a
``Connection: close`` header. A client that sends its next request on that connection before the
close reaches it gets a reset for a request the server never read. Against the real server that is
a race; this fake makes it deterministic: after its 500 it keeps the connection open until the next
request arrives on it, then resets it without reading an answer (the race lost every time).

Raw sockets, not http.server, because the point is what happens on the wire between two requests.
A chat request whose text contains ``crash``, or (``crash_on_bad_image``) whose image part does not
decode, answers 500, as transformers serve does; any other one ``{"content": "ok"}``. ``reset_all``
resets every chat request instead (a server that really drops them).
"""

from __future__ import annotations

import base64
import io
import json
import socket
import socketserver
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.fakes.loopback import serving

__all__ = ["ClosingConfig", "closing_server"]


@dataclass
class ClosingConfig:
    reset_all: bool = False
    crash_on_bad_image: bool = False
    answered: int = 0
    """Requests answered (200 or 500)."""
    dropped: int = 0
    """Requests that arrived on a connection the server had given up, reset unanswered."""


def _reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST


def _answer(status: str, content_type: str, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode("ascii") + body


def _chat(model: str) -> bytes:
    body = {"id": "fake", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}  # fmt: skip
    return _answer("200 OK", "application/json", json.dumps(body).encode())


def _images_decode(body: bytes) -> bool:
    """Every image part of a chat request is a data URL PIL decodes (a bounded size: no bombs)."""
    from PIL import Image

    try:
        urls = [part["image_url"]["url"] if isinstance(part["image_url"], dict) else part["image_url"]
                for message in json.loads(body)["messages"] if isinstance(message.get("content"), list)
                for part in message["content"] if part.get("type") == "image_url"]  # fmt: skip
        for url in urls:
            head, _, payload = str(url).partition(",")
            with Image.open(io.BytesIO(base64.b64decode(payload, validate=True))) as image:
                if not head.startswith("data:image/") or image.width * image.height > 4096 * 4096:
                    return False
                image.load()
    except Exception:
        return False
    return True


class _Handler(socketserver.StreamRequestHandler):
    config: ClosingConfig

    def handle(self) -> None:
        given_up = False
        while True:
            line = self.rfile.readline()
            if not line:
                return
            length = 0
            while (header := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = header.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = self.rfile.read(length) if length else b""
            if given_up or (self.config.reset_all and line.startswith(b"POST")):
                self.config.dropped += 1
                _reset(self.connection)
                return
            self.config.answered += 1
            if line.startswith(b"GET /v1/models"):
                models = {"object": "list", "data": [{"id": "fake-vlm", "object": "model"}]}
                self.wfile.write(_answer("200 OK", "application/json", json.dumps(models).encode()))
                continue
            if b"crash" in body or (self.config.crash_on_bad_image and not _images_decode(body)):
                self.wfile.write(_answer("500 Internal Server Error", "text/plain; charset=utf-8",
                                         b"Internal Server Error"))  # fmt: skip
                given_up = True  # uvicorn closes here; the client does not know yet
                continue
            request = json.loads(body or b"{}")
            if request.get("stream"):  # transformers serve's shape: a finish_reason chunk, no [DONE]
                chunks = [{"choices": [{"index": 0, "delta": {"content": "ok"}}]},
                          {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]  # fmt: skip
                events = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode()
                self.wfile.write(_answer("200 OK", "text/event-stream", events))
                continue
            self.wfile.write(_chat(request.get("model", "fake-vlm")))


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextmanager
def closing_server(config: ClosingConfig) -> Iterator[str]:
    """Serve on 127.0.0.1 (a free port); yields the base URL ``http://127.0.0.1:P/v1``."""
    handler = type("Handler", (_Handler,), {"config": config})
    server = _Server(("127.0.0.1", 0), handler)
    with serving(server, name="closing-server") as url:
        yield url
