"""The fault proxy: an asyncio TCP proxy with toxiproxy's toxics and mmchaos's HTTP faults.

    async with FaultProxy("127.0.0.1:8000", toxics=[...]) as proxy:   # in a running loop
        proxy.add_toxic({"type": "latency", "attributes": {"latency": 200}})

    with ProxyThread("127.0.0.1:8000") as proxy:                        # from sync code
        proxy.add_toxic(...)

With no toxic on a direction, the data path is a plain pump: each chunk the kernel hands over
(up to 256 KiB) is written to the other socket in the same callback, with flow control by
pausing the reader, and ``TCP_NODELAY`` on both sockets. Toxics switch a direction onto a queue
worked by one task per direction, which runs each chunk through the toxics in the order they
were added. Toxics added, changed or removed at run time take effect on live connections at once.

Determinism: the toxicity draw of (connection n, toxic) and the random stream a toxic uses on a
connection (jitter, slice sizes, flipped bytes) derive from ``seed``, the connection's accept
order and the toxic's name only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
from collections import deque
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from mmchaos.errors import ConfigError, UnknownNameError
from mmchaos.proxy.config import HTTP_TOXIC_TYPES, ProxyConfig, Toxic, merge_toxic, parse_hostport, parse_toxic
from mmchaos.proxy.http_faults import CloseItem, HttpSession, StallItem, looks_like_request
from mmchaos.proxy.toxics import Chunk, ToxicStub, make_stub

__all__ = ["FaultProxy", "ProxyStats"]

log = logging.getLogger(__name__)

_HIGH_WATER = 1 << 20  # bytes queued in a slow direction before its source stops being read
_LOW_WATER = 1 << 18
_EOF = object()
_T = TypeVar("_T")


@dataclass
class ProxyStats:
    """Counters of one proxy since it was created."""

    connections_total: int = 0
    connections_active: int = 0
    upstream_errors: int = 0
    received: dict[str, int] = field(default_factory=lambda: {"upstream": 0, "downstream": 0})
    sent: dict[str, int] = field(default_factory=lambda: {"upstream": 0, "downstream": 0})
    faults: dict[tuple[str, str], int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "connections_total": self.connections_total,
            "connections_active": self.connections_active,
            "upstream_errors": self.upstream_errors,
            "received_bytes": dict(self.received),
            "sent_bytes": dict(self.sent),
            "faults": {name: n for (name, _), n in sorted(self.faults.items())},
        }


class _Side(asyncio.Protocol):
    """One socket of a proxied connection."""

    def __init__(self, conn: _Connection, *, client: bool) -> None:
        self.conn = conn
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.write_paused = False
        self.lost = False
        self._drain: list[asyncio.Future[None]] = []

    @property
    def reads_into(self) -> _Direction:
        return self.conn.up if self.client else self.conn.down

    @property
    def writes_from(self) -> _Direction:
        return self.conn.down if self.client else self.conn.up

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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


class _Direction:
    """Data flowing one way: ``upstream`` (client to server) or ``downstream`` (server to client)."""

    def __init__(self, conn: _Connection, name: str) -> None:
        self.conn = conn
        self.name = name
        self.src: _Side | None = None
        self.dst: _Side | None = None
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
        if http is None and conn.proxy._http_toxics and self.name == "upstream" and looks_like_request(data):
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
            if dst.transport is not None and not dst.lost and not self.conn.closed:
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

    def connected(self, dst: _Side) -> None:
        self.dst = dst
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
            if dst is None or dst.transport is None or dst.lost:
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
        if dst is not None and dst.transport is not None and not dst.lost and not dst.transport.is_closing():
            with contextlib.suppress(OSError, RuntimeError):
                if dst.transport.can_write_eof():
                    dst.transport.write_eof()
        self.conn.direction_done()


class _Connection:
    """A client connection and its upstream connection, with the stubs of the toxics that hold it."""

    def __init__(self, proxy: FaultProxy, index: int) -> None:
        self.proxy = proxy
        self.index = index
        self.client = _Side(self, client=True)
        self.server: _Side | None = None
        self.up = _Direction(self, "upstream")
        self.down = _Direction(self, "downstream")
        self.up.src = self.down.dst = self.client
        self.closed = False
        self.stubs: dict[str, ToxicStub] = {}
        self.http: HttpSession | None = None
        self._draws: dict[str, float] = {}
        self._open_task: asyncio.Task[None] | None = None
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # lifecycle

    def client_made(self) -> None:
        self.up.pause_source("connecting", True)
        self.proxy._connections.add(self)
        self._open_task = asyncio.get_running_loop().create_task(self._open())

    async def _open(self) -> None:
        proxy = self.proxy
        self.refresh()
        if self.closed:
            return
        if proxy._http_toxics:
            self.http = HttpSession(self)
        host, port = proxy._upstream
        loop = asyncio.get_running_loop()
        server = _Side(self, client=False)
        try:
            async with asyncio.timeout(proxy.connect_timeout):
                transport, _ = await loop.create_connection(lambda: server, host, port)
        except (OSError, TimeoutError) as exc:
            proxy.stats.upstream_errors += 1
            log.info("proxy %s: upstream %s:%s unreachable: %s", proxy.name, host, port, exc)
            self.close(reason="upstream_unreachable")
            return
        if self.closed:
            transport.abort()
            return
        self.server = self.down.src = server
        self.up.connected(server)
        self.up.pause_source("connecting", False)

    def side_lost(self, side: _Side, exc: Exception | None) -> None:
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
        self.proxy._connection_closed(self)
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
        for toxic in proxy._tcp_toxics:
            if not self.drawn(toxic, toxic.name):
                continue
            stub = self.stubs.get(toxic.name)
            if stub is None or stub.toxic is not toxic:
                rng = random.Random(f"{proxy.seed}:{self.index}:{toxic.name}")
                stub = make_stub(toxic, self, rng)
                started.append(stub)
                proxy._count_fault(toxic)
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
        return self.proxy._http_toxics

    def toxic_live(self, toxic: Toxic) -> bool:
        return self.proxy._toxics.get(toxic.name) is toxic

    def draw(self, toxic: Toxic, request_index: int) -> bool:
        if toxic.toxicity >= 1.0:
            return True
        key = f"{toxic.name}:{request_index}"
        return self.drawn(toxic, key)

    def request_rng(self, toxic: Toxic, request_index: int) -> random.Random:
        return random.Random(f"{self.proxy.seed}:{self.index}:{toxic.name}:{request_index}")

    def count_fault(self, toxic: Toxic) -> None:
        self.proxy._count_fault(toxic)

    def detach_http(self, rest: bytes) -> None:
        self.http = None
        self.up.emit(rest)

    def wait_removed(self, toxic: Toxic, seconds: float | None) -> Awaitable[None]:
        return self.proxy.wait_removed(toxic, seconds)


class FaultProxy:
    """One listening address forwarding to one upstream, with toxics switchable at run time.

    Create it anywhere; it binds in :meth:`start` (or ``async with``). Every method but ``start``,
    ``stop`` and ``set_enabled`` is synchronous and must run on the proxy's event loop; from
    other threads use :class:`ProxyThread`.
    """

    def __init__(
        self,
        upstream: str,
        *,
        listen: str = "127.0.0.1:0",
        name: str = "mmchaos",
        toxics: Iterable[Toxic | Mapping[str, Any]] = (),
        enabled: bool = True,
        seed: int = 0,
        connect_timeout: float = 5.0,
    ) -> None:
        config = ProxyConfig.parse(
            {"name": name, "listen": listen, "upstream": upstream, "enabled": enabled, "seed": seed}
        )
        self.name = config.name
        self.seed = config.seed
        self.connect_timeout = connect_timeout
        self._listen = parse_hostport(config.listen, what="listen")
        self._upstream = parse_hostport(config.upstream, what="upstream")
        self._upstream_text = config.upstream
        self._enabled = config.enabled
        self._toxics: dict[str, Toxic] = {}
        for toxic in toxics:
            parsed = parse_toxic(toxic)
            if parsed.name in self._toxics:
                raise ConfigError(f"proxy {self.name}: two toxics named {parsed.name!r}", code="config_invalid")
            self._toxics[parsed.name] = parsed
        self._tcp_toxics: tuple[Toxic, ...] = ()
        self._http_toxics: tuple[Toxic, ...] = ()
        self._index_toxics()
        self.stats = ProxyStats()
        self._connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._bound: tuple[str, int] | None = None
        self._next_index = 0
        self._waiters: list[tuple[Toxic, asyncio.Future[None]]] = []
        self._running = False

    @classmethod
    def from_config(cls, config: ProxyConfig, **kwargs: Any) -> FaultProxy:
        return cls(
            config.upstream,
            listen=config.listen,
            name=config.name,
            toxics=config.toxics,
            enabled=config.enabled,
            seed=config.seed,
            **kwargs,
        )

    # lifecycle

    async def start(self) -> FaultProxy:
        if self._running:
            return self
        self._running = True
        if self._enabled:
            try:
                await self._bind()
            except BaseException:
                self._running = False
                raise
        return self

    async def stop(self) -> None:
        """Close the listener and every connection; returns when their sockets are closed."""
        self._running = False
        await self._shut()
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _bind(self) -> None:
        host, port = self._listen
        if self._bound is not None:
            port = self._bound[1]  # re-enabling keeps the port an ephemeral listen picked
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(self._accept, host, port, reuse_address=True)
        except OSError as exc:
            raise ConfigError(
                f"proxy {self.name}: cannot listen on {host}:{port}: {exc.strerror or exc}", code="proxy_listen_failed"
            ) from None
        sockname = self._server.sockets[0].getsockname()
        self._bound = (host, int(sockname[1]))

    async def _shut(self) -> None:
        """Stop listening and close every connection (in that order: 3.12+ waits for them)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self._close_connections()
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 2.0)

    async def _close_connections(self) -> None:
        conns = list(self._connections)
        for conn in conns:
            conn.close(reason="proxy_stopped")
        pending = [c.finished for c in conns if not c.finished.done()]
        if pending:
            await asyncio.wait(pending, timeout=2.0)
        for conn in conns:
            for side in (conn.client, conn.server):
                if side is not None and side.transport is not None and not side.lost:
                    side.transport.abort()
        tasks = [t for c in conns for t in (c.up.task, c.down.task, c._open_task) if t is not None and not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)

    def _accept(self) -> asyncio.Protocol:
        conn = _Connection(self, self._next_index)
        self._next_index += 1
        self.stats.connections_total += 1
        self.stats.connections_active += 1
        return conn.client

    def _connection_closed(self, conn: _Connection) -> None:
        if conn in self._connections:
            self._connections.discard(conn)
        self.stats.connections_active -= 1
        for d in (conn.up, conn.down):
            self.stats.received[d.name] += d.received
            self.stats.sent[d.name] += d.sent
            d.received = d.sent = 0

    # addresses

    @property
    def address(self) -> tuple[str, int]:
        """Where the proxy listens (the real port once started, also while disabled)."""
        if self._bound is None:
            raise RuntimeError(f"proxy {self.name} is not started")
        return self._bound

    @property
    def listen(self) -> str:
        host, port = self._bound or self._listen
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def url(self) -> str:
        return f"http://{self.listen}"

    @property
    def upstream(self) -> str:
        return self._upstream_text

    @property
    def enabled(self) -> bool:
        return self._enabled

    async def set_enabled(self, enabled: bool) -> None:
        """Disabled: the port refuses connections and live ones are closed (toxiproxy's ``enabled``)."""
        if enabled == self._enabled:
            return
        self._enabled = enabled
        if not self._running:
            return
        if enabled:
            await self._bind()
        else:
            await self._shut()

    def config(self) -> ProxyConfig:
        return ProxyConfig(
            name=self.name,
            listen=self.listen,
            upstream=self._upstream_text,
            enabled=self._enabled,
            toxics=list(self._toxics.values()),
            seed=self.seed,
        )

    def to_json(self) -> dict[str, Any]:
        """The proxy as toxiproxy's API shows it."""
        data = self.config().model_dump(mode="json")
        data.pop("seed")
        return data

    # toxics

    @property
    def toxics(self) -> list[Toxic]:
        return list(self._toxics.values())

    def get_toxic(self, name: str) -> Toxic:
        try:
            return self._toxics[name]
        except KeyError:
            raise UnknownNameError(f"proxy {self.name} has no toxic {name!r}", code="toxic_not_found") from None

    def add_toxic(self, toxic: Toxic | Mapping[str, Any]) -> Toxic:
        parsed = parse_toxic(toxic)
        if parsed.name in self._toxics:
            raise ConfigError(f"proxy {self.name} already has a toxic {parsed.name!r}", code="toxic_exists")
        self._toxics[parsed.name] = parsed
        self._changed()
        return parsed

    def update_toxic(self, name: str, changes: Mapping[str, Any]) -> Toxic:
        updated = merge_toxic(self.get_toxic(name), changes)
        self._toxics[name] = updated
        self._changed()
        return updated

    def remove_toxic(self, name: str) -> None:
        self.get_toxic(name)
        del self._toxics[name]
        self._changed()

    def clear_toxics(self) -> None:
        if self._toxics:
            self._toxics.clear()
            self._changed()

    async def reset(self) -> None:
        """Remove every toxic and enable the proxy (toxiproxy's ``POST /reset``)."""
        self.clear_toxics()
        await self.set_enabled(True)

    def _index_toxics(self) -> None:
        self._tcp_toxics = tuple(t for t in self._toxics.values() if t.type not in HTTP_TOXIC_TYPES)
        self._http_toxics = tuple(t for t in self._toxics.values() if t.type in HTTP_TOXIC_TYPES)

    def _changed(self) -> None:
        self._index_toxics()
        for conn in list(self._connections):
            conn.refresh()
        live = set(map(id, self._toxics.values()))
        keep: list[tuple[Toxic, asyncio.Future[None]]] = []
        for toxic, fut in self._waiters:
            if id(toxic) in live and not fut.done():
                keep.append((toxic, fut))
            elif not fut.done():
                fut.set_result(None)
        self._waiters = keep

    async def wait_removed(self, toxic: Toxic, seconds: float | None) -> None:
        """Wait until ``toxic`` is removed or replaced, or ``seconds`` pass (None: no limit)."""
        if self._toxics.get(toxic.name) is not toxic or not self._running:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (toxic, fut)
        self._waiters.append(entry)
        try:
            if seconds is None:
                await fut
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(fut), seconds)
        finally:
            if not fut.done():
                fut.cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(entry)

    def _count_fault(self, toxic: Toxic) -> None:
        key = (toxic.name, toxic.type)
        self.stats.faults[key] = self.stats.faults.get(key, 0) + 1

    def snapshot(self) -> ProxyStats:
        """Counters including live connections' bytes."""
        s = self.stats
        snap = ProxyStats(
            s.connections_total, s.connections_active, s.upstream_errors, dict(s.received), dict(s.sent), dict(s.faults)
        )
        for conn in self._connections:
            for d in (conn.up, conn.down):
                snap.received[d.name] += d.received
                snap.sent[d.name] += d.sent
        return snap
