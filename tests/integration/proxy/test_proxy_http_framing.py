"""Untouched responses keep their status line while HTTP faults are installed (issue 11).

Thousands of real requests over loopback: the echo upstream and the proxy run on an event loop
in a thread (asyncio, and uvloop as ``mmchaos proxy`` uses it by default), the client is this
thread with blocking sockets, so the proxy sees requests arrive as a separate client's would.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mmchaos.proxy.echo import EchoHTTPServer
from mmchaos.proxy.proxy import FaultProxy

pytestmark = pytest.mark.integration

REQUEST = b"GET /json HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n"
TOXIC = {"type": "http_status", "name": "flaky", "toxicity": 0.05}
KEEP_ALIVE = 1000
NEW_CONNECTIONS = 1000


def _loop_factories() -> list[Any]:
    params: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    if importlib.util.find_spec("uvloop") is not None:
        import uvloop

        params.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    else:
        params.append(pytest.param(None, id="uvloop", marks=pytest.mark.skip(reason="uvloop not installed")))
    return params


@contextlib.contextmanager
def proxy_on_thread(loop_factory: Callable[[], asyncio.AbstractEventLoop]) -> Iterator[tuple[str, int]]:
    """Echo upstream and a proxy with ``TOXIC`` on one loop in a daemon thread; yields the proxy address."""
    ready = threading.Event()
    address: list[tuple[str, int]] = []
    stop: list[Callable[[], None]] = []
    errors: list[BaseException] = []

    async def main() -> None:
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        stop.append(lambda: loop.call_soon_threadsafe(done.set))
        echo = EchoHTTPServer()
        async with echo, FaultProxy(f"127.0.0.1:{echo.address[1]}", toxics=[TOXIC]) as proxy:
            address.append(proxy.address)
            ready.set()
            await done.wait()

    def run() -> None:
        try:
            with asyncio.Runner(loop_factory=loop_factory) as runner:
                runner.run(main())
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(15), "proxy thread did not start"
    assert not errors, errors
    try:
        yield address[0]
    finally:
        stop[0]()
        thread.join(15)
        assert not thread.is_alive()
        assert not errors, errors


class Client:
    """Blocking HTTP/1.1 client for Content-Length responses; one response at a time."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=5)
        self.buf = b""

    def exchange(self) -> tuple[bytes, bool]:
        """Send ``REQUEST``; (the response head, whether the server keeps the connection)."""
        self.sock.sendall(REQUEST)
        while b"\r\n\r\n" not in self.buf:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError(f"closed before a head; got {self.buf[:80]!r}")
            self.buf += data
            if len(self.buf) >= 5 and not self.buf.startswith(b"HTTP/"):
                raise AssertionError(f"a response without its status line: {self.buf[:80]!r}")
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        length, keep = 0, True
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            if name.strip().lower() == b"connection" and b"close" in value.lower():
                keep = False
        while len(rest) < length:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed inside a body")
            rest += data
        self.buf = rest[length:]
        return head, keep

    def close(self) -> None:
        self.sock.close()


def _check(head: bytes, counts: dict[str, int]) -> None:
    status_line = head.split(b"\r\n", 1)[0]
    if b"x-mmchaos-toxic: flaky" in head.lower():
        counts["injected"] += 1
        assert status_line == b"HTTP/1.1 503 Service Unavailable", head
    else:
        counts["untouched"] += 1
        assert status_line == b"HTTP/1.1 200 OK", f"untouched response without its status line: {head[:120]!r}"


@pytest.mark.parametrize("loop_factory", _loop_factories())
def test_untouched_responses_keep_their_status_line_under_http_status(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    counts = {"injected": 0, "untouched": 0}
    with proxy_on_thread(loop_factory) as address:
        client: Client | None = None
        for _ in range(KEEP_ALIVE):  # one keep-alive connection, re-opened only when the proxy closes it
            if client is None:
                client = Client(address)
            head, keep = client.exchange()
            _check(head, counts)
            if not keep:
                client.close()
                client = None
        if client is not None:
            client.close()
        for _ in range(NEW_CONNECTIONS):  # a new connection per request, as curl in a loop
            client = Client(address)
            try:
                head, _ = client.exchange()
            finally:
                client.close()
            _check(head, counts)
    assert counts["injected"] + counts["untouched"] == KEEP_ALIVE + NEW_CONNECTIONS
    # toxicity 0.05 over 2,000 draws: the fault was live, and far from every request
    assert 40 <= counts["injected"] <= 200, counts
