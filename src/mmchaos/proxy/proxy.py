"""The fault proxy: an asyncio TCP proxy with toxiproxy's toxics and mmchaos's HTTP faults.

    async with FaultProxy("127.0.0.1:8000", toxics=[...]) as proxy:   # in a running loop
        proxy.add_toxic({"type": "latency", "attributes": {"latency": 200}})

    with ProxyThread("127.0.0.1:8000") as proxy:                        # from sync code
        proxy.add_toxic(...)

The connection machinery (the plain pump, the per-direction toxic queues, the HTTP sessions)
lives in :mod:`mmchaos.proxy.connection`; this module owns the listener, the toxics and the
counters. Toxics added, changed or removed at run time take effect on live connections at once.

Determinism: the toxicity draw of (connection n, toxic) and the random stream a toxic uses on a
connection (jitter, slice sizes, flipped bytes) derive from ``seed``, the connection's accept
order and the toxic's name only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mmchaos.errors import ConfigError, UnknownNameError
from mmchaos.net import literal_ip, require_loopback, require_loopback_async
from mmchaos.proxy.config import HTTP_TOXIC_TYPES, ProxyConfig, Toxic, merge_toxic, parse_hostport, parse_toxic
from mmchaos.proxy.connection import Connection

__all__ = ["FaultProxy", "ProxyStats"]


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


class FaultProxy:
    """One listening address forwarding to one upstream, with toxics switchable at run time.

    Create it anywhere; it binds in :meth:`start` (or ``async with``). Every method but ``start``,
    ``stop`` and ``set_enabled`` is synchronous and must run on the proxy's event loop; from
    other threads use :class:`ProxyThread`.

    The listen and upstream addresses must be loopback (:mod:`mmchaos.net`'s one rule, error code
    ``remote_not_allowed``) unless ``allow_remote``.
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
        allow_remote: bool = False,
    ) -> None:
        config = ProxyConfig.parse(
            {"name": name, "listen": listen, "upstream": upstream, "enabled": enabled, "seed": seed}
        )
        self.name = config.name
        self.seed = config.seed
        self.connect_timeout = connect_timeout
        self._listen = parse_hostport(config.listen, what="listen")
        self.upstream_address = parse_hostport(config.upstream, what="upstream")
        self._upstream_text = config.upstream
        self.allow_remote = allow_remote
        if not allow_remote:  # literal addresses now, in the caller; host names in start()
            for what, (host, _) in (("listen", self._listen), ("upstream", self.upstream_address)):
                if literal_ip(host):
                    require_loopback(host, what=what)
        self._enabled = config.enabled
        self._toxics: dict[str, Toxic] = {}
        for toxic in toxics:
            parsed = parse_toxic(toxic)
            if parsed.name in self._toxics:
                raise ConfigError(f"proxy {self.name}: two toxics named {parsed.name!r}", code="config_invalid")
            self._toxics[parsed.name] = parsed
        self.tcp_toxics: tuple[Toxic, ...] = ()
        self.http_toxics: tuple[Toxic, ...] = ()
        self._index_toxics()
        self.stats = ProxyStats()
        self._connections: set[Connection] = set()
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
        if not self.allow_remote:
            await require_loopback_async(self._listen[0], what="listen")
            await require_loopback_async(self.upstream_address[0], what="upstream")
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
                f"proxy {self.name}: cannot listen on {host}:{port}: {exc.strerror or exc}", code="listen_failed"
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
        conn = Connection(self, self._next_index)
        self._next_index += 1
        self.stats.connections_total += 1
        self.stats.connections_active += 1
        return conn.client

    # the ProxyHost interface of Connection

    def connection_opened(self, conn: Connection) -> None:
        self._connections.add(conn)

    def count_upstream_error(self) -> None:
        self.stats.upstream_errors += 1

    def toxic_live(self, toxic: Toxic) -> bool:
        return self._toxics.get(toxic.name) is toxic

    def connection_closed(self, conn: Connection) -> None:
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
        self.tcp_toxics = tuple(t for t in self._toxics.values() if t.type not in HTTP_TOXIC_TYPES)
        self.http_toxics = tuple(t for t in self._toxics.values() if t.type in HTTP_TOXIC_TYPES)

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

    def count_fault(self, toxic: Toxic) -> None:
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
