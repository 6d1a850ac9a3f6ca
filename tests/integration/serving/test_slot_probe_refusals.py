"""The raw-socket stream probe (:mod:`mmchaos.chaos.slot_probe`) reads a refusal to its end and
returns, on a server that keeps the connection open after it.

The disconnect probe of ``serving_streaming`` asks for a long stream, is refused as too long by a
server with a short context and asks again with fewer tokens. The probe used to read on until the
server closed the connection: uvicorn keeps an idle one 20 s, so each refusal cost 20 s (41 s of
the check's 41 s on builtin:tiny-vlm) and, with a request timeout under the keep-alive, it read as
``slow``. The server here is a loopback socket that answers one canned response and never closes.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from mmchaos.chaos.slot_probe import leave_mid_stream, open_stream

pytestmark = pytest.mark.integration

BODY = b'{"error": {"message": "max_tokens is past the context", "code": "context_exceeded"}}'
BY_LENGTH = b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)
CHUNKED = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY))  # fmt: skip


@dataclass
class _Endpoint:
    root: str
    prefix: str = "/v1"
    auth: dict[str, str] | None = None

    def __post_init__(self) -> None:
        self.auth = self.auth or {}


@contextmanager
def kept_open(answer: bytes) -> Iterator[tuple[_Endpoint, list[bytes]]]:
    """A server that reads one request, writes ``answer`` and holds the connection until the end."""
    listener = socket.create_server(("127.0.0.1", 0))
    requests: list[bytes] = []
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            held.append(conn)
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            requests.append(data)
            conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield _Endpoint(f"http://127.0.0.1:{listener.getsockname()[1]}"), requests
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


@pytest.mark.parametrize("answer", [BY_LENGTH, CHUNKED], ids=["content-length", "chunked"])
def test_a_refusal_on_a_connection_kept_open_is_refused_not_slow(answer: bytes) -> None:
    body = {"messages": [{"role": "user", "content": "go"}], "stream": True, "max_tokens": 512}
    with kept_open(answer) as (ep, requests):
        opened = open_stream(ep, body, timeout=8.0)  # before the fix: "slow" once the 8 s ran out
        assert (opened.outcome, opened.detail) == ("refused", "HTTP/1.1 400 Bad Request")
        assert leave_mid_stream(ep, body, timeout=8.0) == ("refused", "HTTP/1.1 400 Bad Request")
    assert all(b"\r\nConnection: close\r\n" in r for r in requests)


def test_a_refusal_cut_before_its_body_ends_waits_for_the_rest() -> None:
    """A partial refusal is not taken as whole: with its last bytes never sent, the time runs out."""
    with kept_open(BY_LENGTH[:-5]) as (ep, _):
        opened = open_stream(ep, {"messages": [], "stream": True}, timeout=1.0)
    assert opened.outcome == "slow"
