"""Tiny upstreams for tests and benchmarks: a raw TCP echo server and an HTTP echo/JSON server.

The HTTP server answers:

- ``GET /healthz`` - ``{"status": "ok"}``
- ``GET /json?size=N`` - a JSON object about N bytes long (default 64)
- ``POST /echo`` (any method) - the request body back, with its Content-Type
- ``POST /upload`` - ``{"bytes": N}``: the body length only, so big uploads cost nothing
- ``POST /v1/embeddings`` - OpenAI-shaped embeddings, deterministic in the input
- ``GET /stream?events=N&interval_ms=M`` - a chunked ``text/event-stream`` of N events
- ``GET /status/{code}`` - that status, a JSON body
- ``GET /delay/{ms}`` - waits, then ``{"delayed_ms": ms}``

Run one in its own process with ``python -m mmchaos.proxy.echo [--tcp] [--listen HOST:PORT]``;
it prints ``listening HOST:PORT`` and serves until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import signal
import struct
import sys
from collections.abc import AsyncIterator
from typing import Any, cast

from mmchaos.proxy._http import HttpServer, Request, Response
from mmchaos.proxy.config import parse_hostport

__all__ = ["EchoHTTPServer", "TcpEchoServer", "fake_embedding"]


def fake_embedding(item: str, dim: int = 8) -> list[float]:
    """A deterministic unit-ish vector for an input (text or image URL)."""
    digest = hashlib.sha256(item.encode("utf-8", "replace")).digest()
    values = struct.unpack(f"<{dim}h", (digest * ((dim * 2) // len(digest) + 1))[: dim * 2])
    return [round(v / 32768.0, 6) for v in values]


def _inputs(payload: Any) -> list[str]:
    if not isinstance(payload, dict):
        raise ValueError("body must be a JSON object")
    if "input" in payload:
        inp = payload["input"]
        items = inp if isinstance(inp, list) else [inp]
        return [json.dumps(i, sort_keys=True) if not isinstance(i, str) else i for i in items]
    if "messages" in payload:
        return [json.dumps(payload["messages"], sort_keys=True)]
    raise ValueError("expected 'input' or 'messages'")


class EchoHTTPServer(HttpServer):
    """An asyncio HTTP/1.1 upstream with predictable answers (see the module docstring)."""

    def __init__(self, *, listen: str = "127.0.0.1:0", dim: int = 8) -> None:
        super().__init__(self._handle, listen=listen)
        self.dim = dim
        self.requests = 0

    async def _handle(self, req: Request) -> Response:
        self.requests += 1
        path = req.path
        if path == "/healthz":
            return Response.json({"status": "ok"})
        if path == "/json":
            size = int(req.query.get("size", "64"))
            return Response.json({"ok": True, "pad": "x" * max(0, size - 24)})
        if path == "/echo":
            return Response(200, req.body, req.headers.get("content-type", "application/octet-stream"))
        if path == "/upload":
            return Response.json({"bytes": len(req.body)})
        if path == "/v1/embeddings":
            try:
                items = _inputs(req.json())
            except ValueError as exc:
                return Response.json({"error": {"message": str(exc), "type": "invalid_request_error"}}, 400)
            data = [
                {"object": "embedding", "index": i, "embedding": fake_embedding(s, self.dim)}
                for i, s in enumerate(items)
            ]
            return Response.json({"object": "list", "data": data, "model": "echo", "usage": {"prompt_tokens": 0}})
        if path == "/stream":
            events = int(req.query.get("events", "5"))
            interval = float(req.query.get("interval_ms", "10")) / 1000.0
            return Response(200, content_type="text/event-stream", stream=self._events(events, interval))
        if path.startswith("/status/"):
            code = int(path.rsplit("/", 1)[1])
            return Response.json({"status": code}, code)
        if path.startswith("/delay/"):
            ms = float(path.rsplit("/", 1)[1])
            await asyncio.sleep(ms / 1000.0)
            return Response.json({"delayed_ms": ms})
        return Response.error("not_found", f"no route {path}")

    @staticmethod
    async def _events(n: int, interval: float) -> AsyncIterator[bytes]:
        for i in range(n):
            if i:
                await asyncio.sleep(interval)
            yield f"data: {json.dumps({'i': i})}\n\n".encode()
        yield b"data: [DONE]\n\n"


class _EchoProtocol(asyncio.Protocol):
    def __init__(self, server: TcpEchoServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.server._transports.add(transport)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.server.received += len(data)
        self.transport.write(data)

    def eof_received(self) -> bool:
        return False  # close once the peer closed its side

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.server._transports.discard(self.transport)


class TcpEchoServer:
    """Writes back every byte it reads; closes when the client closes its side."""

    def __init__(self, *, listen: str = "127.0.0.1:0") -> None:
        self._listen = parse_hostport(listen, what="listen")
        self._server: asyncio.Server | None = None
        self._transports: set[asyncio.Transport] = set()
        self._bound: tuple[str, int] | None = None
        self.received = 0

    async def start(self) -> None:
        host, port = self._listen
        self._server = await asyncio.get_running_loop().create_server(lambda: _EchoProtocol(self), host, port)
        self._bound = (host, int(self._server.sockets[0].getsockname()[1]))

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for transport in list(self._transports):
            transport.abort()
        await asyncio.sleep(0)
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 2.0)

    async def __aenter__(self) -> TcpEchoServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def address(self) -> tuple[str, int]:
        """Where it listens (still known after ``stop``)."""
        if self._bound is None:
            raise RuntimeError("server not started")
        return self._bound


async def _serve_forever(tcp: bool, listen: str) -> None:
    server: EchoHTTPServer | TcpEchoServer = TcpEchoServer(listen=listen) if tcp else EchoHTTPServer(listen=listen)
    await server.start()
    host, port = server.address
    print(f"listening {host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mmchaos.proxy.echo", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--tcp", action="store_true", help="raw TCP echo instead of HTTP")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_forever(args.tcp, args.listen))
    sys.exit(0)


if __name__ == "__main__":
    main()
