"""One proxied connection: its two sockets, its two directions and the toxic stubs that hold it.

With no toxic on a direction, the data path is a plain pump: each chunk the kernel hands over
is written to the other socket in the same callback, with flow control by pausing the reader
(``TCP_NODELAY`` is on: asyncio and uvloop set it on every TCP transport). Toxics switch a
direction onto a queue worked by one task per direction, which runs each chunk through the toxics
in the order they were added.

Connection set-up is on the path of every request of a client that does not keep connections
alive, so it does little: the client is read from at once (what arrives before the upstream is
connected waits in the queue and is written, in order, the moment it is), and no socket option
is set that the loop has set already.

A connection knows its proxy only through :class:`ProxyHost`, so this module does not import
:mod:`mmchaos.proxy.proxy` (which imports it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
from collections import deque
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol, cast

from mmchaos.proxy.config import Toxic
from mmchaos.proxy.http_faults import CloseItem, HttpSession, StallItem, looks_like_request
from mmchaos.proxy.toxics import Chunk, ToxicStub, make_stub

__all__ = ["Connection", "Direction", "ProxyHost", "Side"]

log = logging.getLogger(__name__)

_HIGH_WATER = 1 << 20  # bytes queued in a slow direction before its source stops being read
_LOW_WATER = 1 << 18
_EOF = object()


class ProxyHost(Protocol):
    """What a connection needs from the proxy that accepted it."""

    name: str
    seed: int
    connect_timeout: float
    upstream_address: tuple[str, int]
    tcp_toxics: tuple[Toxic, ...]
    http_toxics: tuple[Toxic, ...]

    def toxic_live(self, toxic: Toxic) -> bool: ...
    def connection_opened(self, conn: Connection) -> None: ...
    def connection_closed(self, conn: Connection) -> None: ...
    def count_upstream_error(self) -> None: ...
    def count_fault(self, toxic: Toxic) -> None: ...
    def wait_removed(self, toxic: Toxic, seconds: float | None) -> Awaitable[None]: ...


class Side(asyncio.Protocol):
    """One socket of a proxied connection."""

    def __init__(self, conn: Connection, *, client: bool) -> None:
        self.conn = conn
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.write_paused = False
        self.lost = False
        self._drain: list[asyncio.Future[None]] = []

    @property
    def writable(self) -> bool:
        """Whether a write can still reach the socket. A failed send closes the transport at once
        but reports the loss (``connection_lost``) only on the loop's next turn; writes in between
        are dropped, and asyncio logs a warning from the fifth on."""
        return self.transport is not None and not self.lost and not self.transport.is_closing()

    @property
    def reads_into(self) -> Direction:
        return self.conn.up if self.client else self.conn.down

    @property
    def writes_from(self) -> Direction:
        return self.conn.down if self.client else self.conn.up

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        if self.client:
            self.conn.client_made()

    def data_received(self, data: bytes) -> None:
        self.reads_into.feed(data)

    def eof_received(self) -> bool:
        self.reads_into.feed_eof()
        return True  # keep the write half open: the other direction may still be sending

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._wake()
        self.conn.side_lost(self, exc)

    def pause_writing(self) -> None:
        self.write_paused = True
        self.writes_from.pause_source("writer", True)

    def resume_writing(self) -> None:
        self.write_paused = False
        self.writes_from.pause_source("writer", False)
        self._wake()

    def _wake(self) -> None:
        for fut in self._drain:
            if not fut.done():
                fut.set_result(None)
        self._drain.clear()

    async def drain(self) -> None:
        if self.write_paused and not self.lost:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._drain.append(fut)
            await fut


class Direction:
    """Data flowing one way: ``upstream`` (client to server) or ``downstream`` (server to client)."""

    def __init__(self, conn: Connection, name: str) -> None:
        self.conn = conn
        self.name = name
        self.src: Side | None = None
        self.dst: Side | None = None
        self.chain: tuple[ToxicStub, ...] = ()
        self.queue: deque[Any] = deque()
        self.queued = 0
        self.task: asyncio.Task[None] | None = None
        self.received = 0
        self.sent = 0
        self.done = False
        self.eof_seen = False
        self._pauses: set[str] = set()

    # flow control of the source

    def pause_source(self, reason: str, on: bool) -> None:
        before = bool(self._pauses)
        if on:
            self._pauses.add(reason)
        else:
            self._pauses.discard(reason)
        after = bool(self._pauses)
        src = self.src
        if before != after and src is not None and src.transport is not None and not src.lost:
            with contextlib.suppress(RuntimeError):
                if after:
                    src.transport.pause_reading()
                else:
                    src.transport.resume_reading()

    # input

    def feed(self, data: bytes) -> None:
        self.received += len(data)
        conn = self.conn
        http = conn.http
        if http is None and conn.proxy.http_toxics and self.name == "upstream" and looks_like_request(data):
            http = conn.start_http()
        if http is None:
            self.emit(data)
        elif self.name == "upstream":
            http.feed_request(data)
        else:
            http.feed_response(data)

    def feed_eof(self) -> None:
        if self.eof_seen:
            return
        self.eof_seen = True
        http = self.conn.http
        if http is not None and self.name == "downstream":
            http.feed_response_eof()
        self.emit_item(_EOF)

    # output

    def emit(self, data: bytes) -> None:
        if not data:
            return
        dst = self.dst
        if not self.chain and self.task is None and dst is not None:
            if dst.transport is not None and dst.writable and not self.conn.closed:
                dst.transport.write(data)
                self.sent += len(data)
            return
        self.emit_item(Chunk(data, asyncio.get_running_loop().time()))

    def emit_item(self, item: Any) -> None:
        if self.conn.closed or self.done:
            return
        if item is _EOF and not self.chain and self.task is None and self.dst is not None:
            self._finish()
            return
        self.queue.append(item)
        if isinstance(item, Chunk):
            self.queued += len(item.data)
            if self.queued > _HIGH_WATER:
                self.pause_source("queue", True)
        if self.task is None and self.dst is not None:  # before the upstream is connected, data waits
            self.task = asyncio.get_running_loop().create_task(self._pump())

    def connected(self, dst: Side) -> None:
        self.dst = dst
        if not self.chain and self.task is None and dst.transport is not None:
            # What the client sent while the upstream connected: written now, not by a task.
            queue = self.queue
            while queue and isinstance(queue[0], Chunk) and dst.writable:
                data = queue.popleft().data
                self.queued -= len(data)
                dst.transport.write(data)
                self.sent += len(data)
            if self.queued < _LOW_WATER:
                self.pause_source("queue", False)
        if self.queue and self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        try:
            while self.queue and not self.conn.closed:
                item = self.queue.popleft()
                if isinstance(item, Chunk):
                    self.queued -= len(item.data)
                    if self.queued < _LOW_WATER:
                        self.pause_source("queue", False)
                    await self._through(self.chain, 0, item)
                elif item is _EOF:
                    for stub in self.chain:
                        if not stub.stopped:
                            await stub.on_eof()
                    self._finish()
                elif isinstance(item, StallItem):
                    await self.conn.proxy.wait_removed(item.toxic, item.seconds)
                elif isinstance(item, CloseItem):
                    self.conn.close(reset=item.reset, reason=item.reason)
        except asyncio.CancelledError:
            raise
        except Exception:  # a toxic failing must not leave the connection hanging
            log.exception("proxy %s: %s pump failed", self.conn.proxy.name, self.name)
            self.conn.close(reset=True, reason="internal_error")
        finally:
            self.task = None

    async def _through(self, chain: tuple[ToxicStub, ...], i: int, chunk: Chunk) -> None:
        if self.conn.closed:
            return
        while i < len(chain) and chain[i].stopped:
            i += 1
        if i == len(chain):
            dst = self.dst
            if dst is None or dst.transport is None or not dst.writable:
                return
            dst.transport.write(chunk.data)
            self.sent += len(chunk.data)
            await dst.drain()
            return
        await chain[i].process(chunk, lambda c: self._through(chain, i + 1, c))

    def _finish(self) -> None:
        """The source closed and everything before the close went out: half-close the destination."""
        self.done = True
        dst = self.dst
        if dst is not None and dst.transport is not None and dst.writable:
            with contextlib.suppress(OSError, RuntimeError):
                if dst.transport.can_write_eof():
                    dst.transport.write_eof()
        self.conn.direction_done()


class Connection:
    """A client connection and its upstream connection, with the stubs of the toxics that hold it."""

    def __init__(self, proxy: ProxyHost, index: int) -> None:
        self.proxy = proxy
        self.index = index
        self.client = Side(self, client=True)
        self.server: Side | None = None
        self.up = Direction(self, "upstream")
        self.down = Direction(self, "downstream")
        self.up.src = self.down.dst = self.client
        self.closed = False
        self.stubs: dict[str, ToxicStub] = {}
        self.http: HttpSession | None = None
        self._draws: dict[str, float] = {}
        self._open_task: asyncio.Task[None] | None = None
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # lifecycle

    def client_made(self) -> None:
        self.proxy.connection_opened(self)
        self._open_task = asyncio.get_running_loop().create_task(self._open())

    async def _open(self) -> None:
        proxy = self.proxy
        self.refresh()
        if self.closed:
            return
        if proxy.http_toxics and self.http is None:
            # Not when the client's first bytes came before this task ran (uvloop may deliver data
            # before pause_reading takes effect): Direction.feed started a session for them already,
            # and a second one would not know the requests in flight (it dropped their response heads).
            self.http = HttpSession(self)
        host, port = proxy.upstream_address
        loop = asyncio.get_running_loop()
        server = Side(self, client=False)
        try:
            async with asyncio.timeout(proxy.connect_timeout):
                transport, _ = await loop.create_connection(lambda: server, host, port)
        except (OSError, TimeoutError) as exc:
            proxy.count_upstream_error()
            log.info("proxy %s: upstream %s:%s unreachable: %s", proxy.name, host, port, exc)
            self.close(reason="upstream_unreachable")
            return
        if self.closed:
            transport.abort()
            return
        self.server = self.down.src = server
        self.up.connected(server)

    def side_lost(self, side: Side, exc: Exception | None) -> None:
        if self.closed:
            self._check_finished()
            return
        if isinstance(exc, ConnectionResetError):
            self.close(reset=True, reason="peer_reset")  # pass a reset on as a reset
            return
        side.writes_from.done = True  # nothing more can be written to it
        side.writes_from.queue.clear()
        side.reads_into.feed_eof()
        self.direction_done()

    def direction_done(self) -> None:
        if self.up.done and self.down.done:
            self.close(reason="closed")

    def close(self, *, reset: bool = False, reason: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        for stub in self.stubs.values():
            stub.stop()
        for task in (self.up.task, self.down.task, self._open_task):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        for side in (self.client, self.server):
            if side is None or side.transport is None or side.lost:
                continue
            if reset:
                sock = side.transport.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                side.transport.abort()
            else:
                side.transport.close()
        self.proxy.connection_closed(self)
        self._check_finished()

    def _check_finished(self) -> None:
        sides = [s for s in (self.client, self.server) if s is not None and s.transport is not None]
        if self.closed and all(s.lost for s in sides) and not self.finished.done():
            self.finished.set_result(None)

    # toxics

    def drawn(self, toxic: Toxic, key: str) -> bool:
        u = self._draws.get(key)
        if u is None:
            u = self._draws[key] = random.Random(f"{self.proxy.seed}:{self.index}:{key}:toxicity").random()
        return u < toxic.toxicity

    def refresh(self) -> None:
        """Bring the stubs in line with the proxy's toxics (at accept and on every change)."""
        if self.closed:
            return
        proxy = self.proxy
        current: dict[str, ToxicStub] = {}
        started: list[ToxicStub] = []
        for toxic in proxy.tcp_toxics:
            if not self.drawn(toxic, toxic.name):
                continue
            stub = self.stubs.get(toxic.name)
            if stub is None or stub.toxic is not toxic:
                rng = random.Random(f"{proxy.seed}:{self.index}:{toxic.name}")
                stub = make_stub(toxic, self, rng)
                started.append(stub)
                proxy.count_fault(toxic)
            current[toxic.name] = stub
        for name, stub in self.stubs.items():
            if current.get(name) is not stub:
                stub.stop()
        self.stubs = current
        self.up.chain = tuple(s for s in current.values() if s.in_path and s.toxic.stream == "upstream")
        self.down.chain = tuple(s for s in current.values() if s.in_path and s.toxic.stream == "downstream")
        for stub in started:
            if not self.closed:
                stub.start()

    # the HttpHost interface of HttpSession

    def start_http(self) -> HttpSession:
        self.http = HttpSession(self)
        return self.http

    def forward_request(self, data: bytes) -> None:
        self.up.emit(data)

    def forward_response(self, data: bytes) -> None:
        self.down.emit(data)

    def response_control(self, item: StallItem | CloseItem) -> None:
        self.down.emit_item(item)

    def http_toxics(self) -> Sequence[Toxic]:
        return self.proxy.http_toxics

    def toxic_live(self, toxic: Toxic) -> bool:
        return self.proxy.toxic_live(toxic)

    def draw(self, toxic: Toxic, request_index: int) -> bool:
        if toxic.toxicity >= 1.0:
            return True
        key = f"{toxic.name}:{request_index}"
        return self.drawn(toxic, key)

    def request_rng(self, toxic: Toxic, request_index: int) -> random.Random:
        return random.Random(f"{self.proxy.seed}:{self.index}:{toxic.name}:{request_index}")

    def count_fault(self, toxic: Toxic) -> None:
        self.proxy.count_fault(toxic)

    def detach_http(self, rest: bytes) -> None:
        self.http = None
        self.up.emit(rest)

    def wait_removed(self, toxic: Toxic, seconds: float | None) -> Awaitable[None]:
        return self.proxy.wait_removed(toxic, seconds)
