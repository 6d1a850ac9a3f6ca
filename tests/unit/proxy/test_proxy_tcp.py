"""The proxy's TCP toxics, byte by byte, against a plain echo server on loopback.

Every test runs its own event loop under a hard time limit and ends by checking that nothing is
left: the proxy's port refuses connections and no task is still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from mmchaos.proxy.echo import TcpEchoServer
from mmchaos.proxy.proxy import FaultProxy
from mmchaos.proxy.toxics import Chunk, make_stub
from tests.support import aio


async def assert_refused(port: int) -> None:
    with pytest.raises(ConnectionRefusedError):
        _, w = await asyncio.open_connection("127.0.0.1", port)
        w.close()


@contextlib.asynccontextmanager
async def echo_proxy(*toxics: dict[str, Any], **kwargs: Any) -> AsyncIterator[tuple[FaultProxy, TcpEchoServer]]:
    async with TcpEchoServer() as echo:
        proxy = FaultProxy(f"127.0.0.1:{echo.address[1]}", toxics=toxics, **kwargs)
        async with proxy:
            yield proxy, echo
        port = proxy.address[1]
        assert proxy.stats.connections_active == 0
        await assert_refused(port)
    await assert_refused(echo.address[1])


async def connect(proxy: FaultProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(*proxy.address)


async def read_exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    return await reader.readexactly(n)


async def roundtrip(proxy: FaultProxy, payload: bytes = b"ping") -> float:
    reader, writer = await connect(proxy)
    t0 = time.perf_counter()
    writer.write(payload)
    assert await read_exactly(reader, len(payload)) == payload
    elapsed = time.perf_counter() - t0
    writer.close()
    await writer.wait_closed()
    return elapsed


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.perf_counter() + timeout
    while not check():
        assert time.perf_counter() < end, "condition not reached"
        await asyncio.sleep(0.01)


# --- no toxics -------------------------------------------------------------------------------


@aio
async def test_plain_pump_forwards_every_byte_with_nodelay() -> None:
    async with echo_proxy() as (proxy, _):
        reader, writer = await connect(proxy)
        payload = os.urandom(2_000_000)
        writer.write(payload)
        assert await read_exactly(reader, len(payload)) == payload
        (conn,) = proxy._connections
        assert conn.up.chain == () and conn.down.chain == () and conn.http is None
        for side in (conn.client, conn.server):
            assert side is not None and side.transport is not None
            assert side.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        writer.close()
        await writer.wait_closed()
        await eventually(lambda: proxy.stats.connections_active == 0)
        assert proxy.snapshot().sent == {"upstream": len(payload), "downstream": len(payload)}


@aio
async def test_client_half_close_propagates_and_connection_ends() -> None:
    async with echo_proxy() as (proxy, _):
        reader, writer = await connect(proxy)
        writer.write(b"last words")
        writer.write_eof()
        assert await reader.read() == b"last words"  # echo replied, then closed on our EOF
        writer.close()
        await eventually(lambda: proxy.stats.connections_active == 0)


# --- latency ---------------------------------------------------------------------------------


@aio
async def test_latency_downstream_delays_the_reply_not_the_request() -> None:
    async with echo_proxy({"type": "latency", "attributes": {"latency": 200}}) as (proxy, echo):
        reader, writer = await connect(proxy)
        t0 = time.perf_counter()
        writer.write(b"hello")
        await eventually(lambda: echo.received == 5)
        assert time.perf_counter() - t0 < 0.15  # the request went straight through
        assert await read_exactly(reader, 5) == b"hello"
        assert time.perf_counter() - t0 >= 0.2
        writer.close()


@aio
async def test_latency_upstream_delays_the_request() -> None:
    toxic = {"type": "latency", "stream": "upstream", "attributes": {"latency": 200}}
    async with echo_proxy(toxic) as (proxy, echo):
        reader, writer = await connect(proxy)
        t0 = time.perf_counter()
        writer.write(b"hello")
        await eventually(lambda: echo.received == 5)
        assert time.perf_counter() - t0 >= 0.2
        assert await read_exactly(reader, 5) == b"hello"
        writer.close()


@aio
async def test_latency_is_not_cumulative_across_back_to_back_chunks() -> None:
    async with echo_proxy({"type": "latency", "attributes": {"latency": 150}}) as (proxy, _):
        reader, writer = await connect(proxy)
        t0 = time.perf_counter()
        for i in range(5):
            writer.write(b"%d" % i)
            await asyncio.sleep(0.01)
        assert await read_exactly(reader, 5) == b"01234"
        assert 0.15 <= time.perf_counter() - t0 < 0.5  # ~0.2 s, not 5 x 0.15 s
        writer.close()


# --- bandwidth, slicer, limit_data ------------------------------------------------------------


@aio
async def test_bandwidth_bounds_the_rate() -> None:
    async with echo_proxy({"type": "bandwidth", "attributes": {"rate": 100}}) as (proxy, _):
        reader, writer = await connect(proxy)
        payload = os.urandom(50_000)
        t0 = time.perf_counter()
        writer.write(payload)
        assert await read_exactly(reader, len(payload)) == payload
        elapsed = time.perf_counter() - t0
        # 50 kB at 100 kB/s is 0.5 s; the first 50 ms slice goes at once.
        assert 0.4 <= elapsed < 3.0, elapsed
        writer.close()


@aio
async def test_slicer_delivers_the_same_bytes_in_pieces() -> None:
    toxic = {"type": "slicer", "attributes": {"average_size": 8, "size_variation": 4, "delay": 2000}}
    async with echo_proxy(toxic) as (proxy, _):
        reader, writer = await connect(proxy)
        payload = bytes(range(200))
        writer.write(payload)
        pieces = []
        while sum(map(len, pieces)) < len(payload):
            pieces.append(await reader.read(1 << 16))
        assert b"".join(pieces) == payload
        assert len(pieces) >= 10, [len(p) for p in pieces]
        assert max(map(len, pieces)) <= 12 * 3  # slices (4..12 bytes) 2 ms apart, rarely merged
        writer.close()


def test_slicer_sizes_are_deterministic_by_seed() -> None:
    from mmchaos.proxy.config import parse_toxic

    toxic = parse_toxic({"type": "slicer", "attributes": {"average_size": 10, "size_variation": 6}})

    class Conn:
        closed = False

        def close(self, *, reset: bool = False, reason: str = "") -> None:
            self.closed = True

    async def sizes(seed: str) -> list[int]:
        out: list[int] = []

        async def emit(chunk: Chunk) -> None:
            out.append(len(chunk.data))

        await make_stub(toxic, Conn(), random.Random(seed)).process(Chunk(bytes(500), 0.0), emit)
        assert sum(out) == 500 and all(4 <= n <= 16 for n in out[:-1])
        return out

    a, b, c = (asyncio.run(sizes(s)) for s in ("0:0:x", "0:0:x", "1:0:x"))
    assert a == b != c


@aio
async def test_limit_data_closes_after_n_bytes() -> None:
    async with echo_proxy({"type": "limit_data", "attributes": {"bytes": 100}}) as (proxy, echo):
        reader, writer = await connect(proxy)
        writer.write(os.urandom(300))
        got = await reader.read()  # until EOF
        assert len(got) == 100
        writer.close()
        await eventually(lambda: proxy.stats.connections_active == 0)


# --- reset_peer, timeout, slow_close, down ------------------------------------------------------


@aio
async def test_reset_peer_gives_the_client_econnreset() -> None:
    async with echo_proxy({"type": "reset_peer", "attributes": {"timeout": 100}}) as (proxy, _):
        reader, writer = await connect(proxy)
        writer.write(b"x")
        assert await read_exactly(reader, 1) == b"x"  # data flows until the reset
        t0 = time.perf_counter()
        with pytest.raises(ConnectionResetError):
            await reader.read(10)
        assert time.perf_counter() - t0 >= 0.05
        writer.close()


@aio
async def test_timeout_stalls_then_closes() -> None:
    async with echo_proxy({"type": "timeout", "attributes": {"timeout": 250}}) as (proxy, _):
        reader, writer = await connect(proxy)
        t0 = time.perf_counter()
        writer.write(b"anyone?")
        assert await reader.read(100) == b""  # nothing arrives; the close comes at 250 ms
        assert time.perf_counter() - t0 >= 0.24
        writer.close()


@aio
async def test_timeout_zero_holds_until_removed() -> None:
    async with echo_proxy({"type": "timeout", "name": "hold"}) as (proxy, _):
        reader, writer = await connect(proxy)
        writer.write(b"lost")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(100), 0.3)  # held, not closed
        proxy.remove_toxic("hold")
        writer.write(b"found")  # data sent while the toxic held it is dropped, as in toxiproxy
        assert await read_exactly(reader, 5) == b"found"
        writer.close()


@aio
async def test_slow_close_delays_the_close() -> None:
    async def time_to_eof(proxy: FaultProxy) -> float:
        reader, writer = await connect(proxy)
        writer.write(b"bye")
        assert await read_exactly(reader, 3) == b"bye"
        t0 = time.perf_counter()
        writer.write_eof()  # the echo server closes on our EOF
        assert await reader.read() == b""
        writer.close()
        return time.perf_counter() - t0

    async with echo_proxy() as (proxy, _):
        assert await time_to_eof(proxy) < 0.15
    async with echo_proxy({"type": "slow_close", "attributes": {"delay": 300}}) as (proxy, _):
        assert await time_to_eof(proxy) >= 0.3


@aio
async def test_down_closes_new_connections_and_disabled_refuses() -> None:
    async with echo_proxy({"type": "down", "name": "down"}) as (proxy, echo):
        reader, writer = await connect(proxy)
        assert await reader.read(10) == b""  # closed at once, never reaching the upstream
        writer.close()
        assert echo.received == 0 and not echo._transports
        proxy.remove_toxic("down")
        assert await roundtrip(proxy) < 1
        # enabled=false (toxiproxy's "down"): the port refuses, live connections are closed.
        reader, writer = await connect(proxy)
        await proxy.set_enabled(False)
        assert await reader.read(10) == b""
        writer.close()
        port = proxy.address[1]
        await assert_refused(port)
        await proxy.set_enabled(True)
        assert proxy.address[1] == port
        assert await roundtrip(proxy) < 1


@aio
async def test_down_added_at_run_time_closes_live_connections() -> None:
    async with echo_proxy() as (proxy, _):
        reader, writer = await connect(proxy)
        writer.write(b"a")
        assert await read_exactly(reader, 1) == b"a"
        proxy.add_toxic({"type": "down"})
        assert await reader.read(10) == b""
        writer.close()


# --- toxicity, direction, determinism ------------------------------------------------------------


@aio
async def test_toxicity_zero_never_one_always() -> None:
    never = {"type": "latency", "toxicity": 0.0, "attributes": {"latency": 300}}
    async with echo_proxy(never) as (proxy, _):
        times = [await roundtrip(proxy) for _ in range(8)]
        assert max(times) < 0.3
        assert proxy.stats.faults == {}
    always = {"type": "latency", "toxicity": 1.0, "attributes": {"latency": 100}}
    async with echo_proxy(always) as (proxy, _):
        times = [await roundtrip(proxy) for _ in range(3)]
        assert min(times) >= 0.1
        assert proxy.stats.faults == {("latency_downstream", "latency"): 3}


@aio
async def test_toxicity_draws_are_deterministic_by_seed() -> None:
    async def applied(seed: int) -> list[int]:
        toxic = {"type": "slow_close", "toxicity": 0.5, "attributes": {"delay": 0}}
        out = []
        async with echo_proxy(toxic, seed=seed) as (proxy, _):
            for _ in range(24):
                before = sum(proxy.stats.faults.values())
                await roundtrip(proxy)
                out.append(sum(proxy.stats.faults.values()) - before)
        return out

    a, b, c = await applied(7), await applied(7), await applied(8)
    assert a == b != c
    assert 4 <= sum(a) <= 20


@aio
async def test_toxics_change_live_connections_at_once() -> None:
    async with echo_proxy() as (proxy, _):
        reader, writer = await connect(proxy)

        async def echo_time() -> float:
            t0 = time.perf_counter()
            writer.write(b"z")
            assert await read_exactly(reader, 1) == b"z"
            return time.perf_counter() - t0

        assert await echo_time() < 0.1
        proxy.add_toxic({"type": "latency", "name": "slow", "attributes": {"latency": 200}})
        assert await echo_time() >= 0.2  # the same connection, now slow
        proxy.update_toxic("slow", {"attributes": {"latency": 50}})
        assert 0.05 <= await echo_time() < 0.2
        proxy.update_toxic("slow", {"attributes": {"latency": 5000}})
        writer.write(b"q")
        await asyncio.sleep(0.1)
        t0 = time.perf_counter()
        proxy.remove_toxic("slow")  # releases data already waiting, too
        assert await read_exactly(reader, 1) == b"q"
        assert time.perf_counter() - t0 < 0.5
        assert await echo_time() < 0.1
        writer.close()


@aio
async def test_stop_closes_live_connections_and_frees_the_port() -> None:
    async with TcpEchoServer() as echo:
        proxy = FaultProxy(f"127.0.0.1:{echo.address[1]}", toxics=[{"type": "latency", "attributes": {"latency": 10}}])
        await proxy.start()
        conns = [await connect(proxy) for _ in range(3)]
        for reader, writer in conns:
            writer.write(b"x")
            assert await read_exactly(reader, 1) == b"x"
        await proxy.stop()
        for reader, writer in conns:
            assert await reader.read(10) == b""
            writer.close()
        await assert_refused(proxy.address[1])
        assert proxy.stats.connections_active == 0


@aio
async def test_unreachable_upstream_closes_the_client_and_counts() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]  # bound, never listening: connections are refused
        async with FaultProxy(f"127.0.0.1:{dead_port}") as proxy:
            reader, writer = await connect(proxy)
            assert await reader.read(10) == b""
            writer.close()
            assert proxy.stats.upstream_errors == 1


@aio
async def test_a_client_that_resets_mid_stream_is_not_written_to_again(caplog: pytest.LogCaptureFixture) -> None:
    """The client resets while a toxic chain still holds its answer: the pump stops writing at the
    failed send instead of writing on until the transport's loss is reported (asyncio then logs
    'socket.send() raised exception.' after the fifth write, as serving_faults runs showed)."""
    toxic = {"type": "slicer", "attributes": {"average_size": 64, "size_variation": 32, "delay": 0}}
    async with echo_proxy(toxic) as (proxy, _):
        reader, writer = await connect(proxy)
        writer.write(os.urandom(1_000_000))
        await reader.readexactly(1000)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # SO_LINGER 0: the close is a reset
        await eventually(lambda: proxy.stats.connections_active == 0)
    assert not [r for r in caplog.records if "socket.send() raised" in r.getMessage()]
