"""The TCP toxics at run time: one stub per (connection, toxic), as in toxiproxy.

A stub sees the chunks of one direction of one connection in order and passes them on through
``emit``; it may delay, slice, drop or stop them, and it may close the connection. Every wait is
cut short when the toxic is removed, so a removal reaches data already in flight at once.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from mmchaos.proxy.config import (
    BandwidthToxic,
    DownToxic,
    LatencyToxic,
    LimitDataToxic,
    ResetPeerToxic,
    SlicerToxic,
    SlowCloseToxic,
    TimeoutToxic,
    Toxic,
)

__all__ = ["Chunk", "ConnectionHandle", "Emit", "ToxicStub", "make_stub"]


@dataclass(slots=True)
class Chunk:
    """Bytes read from one side, stamped with the loop time they arrived at."""

    data: bytes
    arrived: float


Emit = Callable[[Chunk], Awaitable[None]]


class ConnectionHandle(Protocol):
    """What a stub may do to the connection it belongs to."""

    @property
    def closed(self) -> bool: ...

    def close(self, *, reset: bool = False, reason: str = "") -> None: ...


class ToxicStub:
    """Passes data through unchanged; subclasses override ``process``, ``start`` or ``on_eof``."""

    #: Whether the stub sits in the data path (timer-only toxics do not, keeping the fast path).
    in_path = True

    def __init__(self, toxic: Toxic, conn: ConnectionHandle, rng: random.Random) -> None:
        self.toxic = toxic
        self.conn = conn
        self.rng = rng
        self.stopped = False
        self._timer: asyncio.TimerHandle | None = None
        self._sleepers: set[asyncio.Future[bool]] = set()

    def start(self) -> None:
        """The toxic took hold of the connection (at accept, or when added at run time)."""

    def stop(self) -> None:
        """The toxic was removed or replaced: cancel timers and release every wait."""
        self.stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for fut in self._sleepers:
            if not fut.done():
                fut.set_result(False)
        self._sleepers.clear()

    async def process(self, chunk: Chunk, emit: Emit) -> None:
        await emit(chunk)

    async def on_eof(self) -> None:
        """The source closed; return when the close may go on."""

    async def sleep(self, seconds: float) -> bool:
        """Sleep unless the toxic is removed first; True when the whole time passed."""
        if self.stopped:
            return False
        if seconds <= 0:
            return True
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        handle = loop.call_later(seconds, _resolve, fut, True)
        self._sleepers.add(fut)
        try:
            return await fut
        finally:
            handle.cancel()
            self._sleepers.discard(fut)

    def _later(self, seconds: float, action: Callable[[], None]) -> None:
        self._timer = asyncio.get_running_loop().call_later(max(0.0, seconds), action)


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)


class LatencyStub(ToxicStub):
    toxic: LatencyToxic

    async def process(self, chunk: Chunk, emit: Emit) -> None:
        attrs = self.toxic.attributes
        delay = attrs.latency + (self.rng.uniform(-attrs.jitter, attrs.jitter) if attrs.jitter else 0.0)
        # Measured from the chunk's arrival, so back-to-back chunks are not delayed cumulatively.
        wait = chunk.arrived + max(0.0, delay) / 1000.0 - asyncio.get_running_loop().time()
        if wait > 0:
            await self.sleep(wait)
        await emit(chunk)


class BandwidthStub(ToxicStub):
    toxic: BandwidthToxic
    _next = 0.0

    async def process(self, chunk: Chunk, emit: Emit) -> None:
        rate = self.toxic.attributes.rate * 1000.0
        if rate <= 0 or self.stopped:
            await emit(chunk)
            return
        loop = asyncio.get_running_loop()
        data = chunk.data
        piece = max(1, int(rate / 20))  # 50 ms worth of data at a time keeps the rate smooth
        for off in range(0, len(data), piece):
            now = loop.time()
            if self._next > now and not await self.sleep(self._next - now):
                await emit(Chunk(data[off:], chunk.arrived))  # removed: the rest goes unthrottled
                return
            part = data[off : off + piece]
            await emit(Chunk(part, chunk.arrived))
            self._next = max(self._next, loop.time()) + len(part) / rate


class SlicerStub(ToxicStub):
    toxic: SlicerToxic

    async def process(self, chunk: Chunk, emit: Emit) -> None:
        attrs = self.toxic.attributes
        data, off, n = chunk.data, 0, len(chunk.data)
        while off < n:
            if self.stopped:
                await emit(Chunk(data[off:], chunk.arrived))
                return
            size = attrs.average_size
            if attrs.size_variation:
                size += self.rng.randint(-attrs.size_variation, attrs.size_variation)
            size = max(1, size)
            await emit(Chunk(data[off : off + size], chunk.arrived))
            off += size
            if off < n and attrs.delay:
                await self.sleep(attrs.delay / 1e6)


class LimitDataStub(ToxicStub):
    toxic: LimitDataToxic
    sent = 0

    async def process(self, chunk: Chunk, emit: Emit) -> None:
        remaining = self.toxic.attributes.bytes - self.sent
        if len(chunk.data) < remaining:
            self.sent += len(chunk.data)
            await emit(chunk)
            return
        if remaining > 0:
            self.sent += remaining
            await emit(Chunk(chunk.data[:remaining], chunk.arrived))
        self.conn.close(reason="limit_data")


class TimeoutStub(ToxicStub):
    toxic: TimeoutToxic

    def start(self) -> None:
        timeout = self.toxic.attributes.timeout
        if timeout > 0:
            self._later(timeout / 1000.0, lambda: self.conn.close(reason="timeout"))

    async def process(self, chunk: Chunk, emit: Emit) -> None:
        return  # dropped, as toxiproxy does


class SlowCloseStub(ToxicStub):
    toxic: SlowCloseToxic

    async def on_eof(self) -> None:
        await self.sleep(self.toxic.attributes.delay / 1000.0)


class ResetPeerStub(ToxicStub):
    toxic: ResetPeerToxic
    in_path = False

    def start(self) -> None:
        self._later(self.toxic.attributes.timeout / 1000.0, lambda: self.conn.close(reset=True, reason="reset_peer"))


class DownStub(ToxicStub):
    toxic: DownToxic
    in_path = False

    def start(self) -> None:
        self.conn.close(reason="down")


_STUBS: dict[str, type[ToxicStub]] = {
    "latency": LatencyStub,
    "bandwidth": BandwidthStub,
    "slicer": SlicerStub,
    "limit_data": LimitDataStub,
    "timeout": TimeoutStub,
    "slow_close": SlowCloseStub,
    "reset_peer": ResetPeerStub,
    "down": DownStub,
}


def make_stub(toxic: Toxic, conn: ConnectionHandle, rng: random.Random) -> ToxicStub:
    """The run-time stub of a TCP toxic for one connection."""
    return _STUBS[toxic.type](toxic, conn, rng)
