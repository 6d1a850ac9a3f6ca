"""A small asyncio HTTP/1.1 server for the control API and the echo upstream.

Keep-alive, Content-Length and chunked request bodies, chunked streaming responses. Not a
general web server: it exists so the proxy's control plane and the test upstream need no extra
dependency.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Self
from urllib.parse import parse_qsl, urlsplit

from mmchaos.error_codes import status_of
from mmchaos.errors import ConfigError
from mmchaos.proxy.config import parse_hostport

__all__ = ["HttpServer", "Request", "Response"]

log = logging.getLogger(__name__)


class BadRequest(Exception):
    """A request this server refuses before any handler sees it; ``code`` is stable, and its status
    is the code's (:mod:`mmchaos.error_codes`)."""

    def __init__(self, message: str, code: str = "http_bad_request") -> None:
        super().__init__(message)
        self.code = code

    @property
    def status(self) -> int:
        return status_of(self.code, 400)


_HEX = frozenset(b"0123456789abcdefABCDEF")
_MAX_TRAILER = 8 * 1024


@dataclass
class Request:
    method: str
    target: str
    version: str
    headers: dict[str, str]
    body: bytes = b""

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, str]:
        return dict(parse_qsl(urlsplit(self.target).query))

    @property
    def keep_alive(self) -> bool:
        conn = self.headers.get("connection", "").lower()
        return "close" not in conn and (self.version == "HTTP/1.1" or "keep-alive" in conn)

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str | None = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)
    stream: AsyncIterator[bytes] | None = None

    @classmethod
    def json(cls, obj: Any, status: int = 200, headers: list[tuple[str, str]] | None = None) -> Response:
        return cls(status, json.dumps(obj).encode(), "application/json", headers or [])

    @classmethod
    def error(cls, code: str, message: str, *, fallback: int = 500) -> Response:
        """toxiproxy's error shape, ``{"error": message, "status": http_status}``, plus mmchaos's stable
        ``code``; the status is the code's (:mod:`mmchaos.error_codes`), ``fallback`` for one not there."""
        status = status_of(code, fallback)
        return cls.json({"error": message, "status": status, "code": code}, status)


Handler = Callable[[Request], Awaitable[Response]]


async def read_request(reader: asyncio.StreamReader, max_body: int) -> Request | None:
    """One request from the stream; None on a clean close between requests. Refusals are BadRequest."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise BadRequest("incomplete request head") from None
    except asyncio.LimitOverrunError:
        raise BadRequest("request head too large", "http_head_too_large") from None
    lines = raw.decode("latin-1").rstrip("\r\n").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest("bad request line")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise BadRequest("bad header line")
        key = name.strip().lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    req = Request(parts[0], parts[1], parts[2], headers)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        req.body = await _read_chunked(reader, max_body)
    elif "content-length" in headers:
        text = headers["content-length"]
        if not text.isascii() or not text.isdigit() or len(text) > 18:  # no sign, no list, no overflow
            raise BadRequest(f"bad Content-Length {text[:20]!r}", "http_bad_content_length")
        length = int(text)
        if length > max_body:
            raise BadRequest("request body too large", "http_body_too_large")
        req.body = await reader.readexactly(length)
    return req


async def _read_chunked(reader: asyncio.StreamReader, max_body: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        try:
            size_line = (await reader.readuntil(b"\r\n"))[:-2]
        except asyncio.LimitOverrunError:
            raise BadRequest("chunk size line too long", "http_bad_chunk") from None
        digits = size_line.split(b";", 1)[0].strip()
        if not digits or len(digits) > 15 or not _HEX.issuperset(digits):
            raise BadRequest(f"bad chunk size {bytes(size_line[:20])!r}", "http_bad_chunk")
        size = int(digits, 16)
        if size == 0:
            trailer = 0
            while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                trailer += len(line)
                if trailer > _MAX_TRAILER:
                    raise BadRequest("request trailers too large", "http_head_too_large")
            return b"".join(chunks)
        total += size
        if total > max_body:
            raise BadRequest("request body too large", "http_body_too_large")
        chunks.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise BadRequest("chunk data not followed by CRLF", "http_bad_chunk")


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def write_response(writer: asyncio.StreamWriter, resp: Response, *, keep_alive: bool, head_only: bool) -> None:
    headers = list(resp.headers)
    if resp.status in (204, 304) or 100 <= resp.status < 200:
        writer.write(_head(resp.status, [*headers, ("Connection", "keep-alive" if keep_alive else "close")]))
        await writer.drain()  # no body and no body headers (RFC 9110 6.4.1)
        return
    if resp.content_type is not None:
        headers.append(("Content-Type", resp.content_type))
    headers.append(("Connection", "keep-alive" if keep_alive else "close"))
    if resp.stream is None:
        headers.append(("Content-Length", str(len(resp.body))))
        writer.write(_head(resp.status, headers) + (b"" if head_only else resp.body))
        await writer.drain()
        return
    headers.append(("Transfer-Encoding", "chunked"))
    writer.write(_head(resp.status, headers))
    await writer.drain()
    if head_only:
        return
    async for piece in resp.stream:
        if piece:
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


class HttpServer:
    """Serves ``handler`` on ``listen`` until stopped; ``stop`` closes every connection."""

    def __init__(self, handler: Handler, *, listen: str = "127.0.0.1:0", max_body: int = 64 << 20) -> None:
        self._handler = handler
        self._listen = parse_hostport(listen, what="listen")
        self._max_body = max_body
        self._server: asyncio.Server | None = None
        self._bound: tuple[str, int] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        host, port = self._listen
        try:
            self._server = await asyncio.start_server(self._serve, host, port, reuse_address=True)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", code="listen_failed") from None
        self._bound = (host, int(self._server.sockets[0].getsockname()[1]))

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()  # stop listening; connections are closed below (3.12+ waits for them)
        for writer in list(self._writers):
            writer.close()  # idle connections end on their own once their reader sees the close
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=0.2)
        for task in list(self._tasks):
            task.cancel()  # handlers still busy (a delay, a stream)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2.0)
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 2.0)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def address(self) -> tuple[str, int]:
        if self._bound is None:
            raise RuntimeError("server not started")
        return self._bound

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            while True:
                try:
                    req = await read_request(reader, self._max_body)
                except BadRequest as exc:
                    await write_response(writer, Response.error(exc.code, str(exc)), keep_alive=False, head_only=False)
                    return
                if req is None:
                    return
                try:
                    resp = await self._handler(req)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.exception("handler failed for %s %s", req.method, req.target)
                    resp = Response.error("http_internal_error", f"internal error: {type(exc).__name__}")
                keep = req.keep_alive
                await write_response(writer, resp, keep_alive=keep, head_only=req.method == "HEAD")
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            pass  # stop() cancels busy handlers; nobody awaits this task but stop() itself
        finally:
            self._writers.discard(writer)
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
