"""The proxy's HTTP faults on real HTTP/1.1 responses from the echo upstream, over loopback.

Through httpx (keep-alive, Content-Length and chunked bodies) and, where the exact bytes on the
wire matter, through a raw socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from mmchaos.proxy.echo import EchoHTTPServer
from mmchaos.proxy.proxy import FaultProxy
from tests.support import aio


@contextlib.asynccontextmanager
async def http_proxy(
    *toxics: dict[str, Any], seed: int = 0
) -> AsyncIterator[tuple[FaultProxy, EchoHTTPServer, httpx.AsyncClient]]:
    async with EchoHTTPServer() as echo:
        proxy = FaultProxy(f"127.0.0.1:{echo.address[1]}", toxics=toxics, seed=seed)
        async with proxy, httpx.AsyncClient(base_url=proxy.url, trust_env=False, timeout=5) as client:
            yield proxy, echo, client
        assert proxy.stats.connections_active == 0
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(*proxy.address)


async def raw_exchange(proxy: FaultProxy, request: bytes) -> tuple[bytes, bool]:
    """Send one request on a fresh connection; (every byte until close or 1 s of silence, closed?)."""
    reader, writer = await asyncio.open_connection(*proxy.address)
    writer.write(request)
    data, closed = b"", False
    while True:
        try:
            chunk = await asyncio.wait_for(reader.read(1 << 16), 1.0)
        except TimeoutError:
            break
        if not chunk:
            closed = True
            break
        data += chunk
    writer.close()
    return data, closed


GET_JSON = b"GET /json?size=1000 HTTP/1.1\r\nHost: t\r\n\r\n"


# --- injected status ---------------------------------------------------------------------------


@aio
async def test_status_503_with_retry_after_never_reaches_upstream() -> None:
    toxic = {"type": "http_status", "name": "busy", "attributes": {"status": 503, "retry_after": 7}}
    async with http_proxy(toxic) as (proxy, echo, client):
        r = await client.get("/json")
        assert r.status_code == 503
        assert r.headers["retry-after"] == "7"
        assert r.json()["error"]["code"] == 503
        r = await client.post("/echo", content=b"x" * 100_000)  # a body to swallow, keep-alive kept
        assert r.status_code == 503
        assert echo.requests == 0
        proxy.remove_toxic("busy")
        r = await client.get("/json")
        assert r.status_code == 200 and echo.requests == 1
        assert proxy.stats.connections_total == 1  # all on one keep-alive connection
        assert proxy.stats.faults == {("busy", "http_status"): 2}


@aio
async def test_status_429_and_500_without_retry_after_and_custom_body() -> None:
    async with http_proxy({"type": "http_status", "attributes": {"status": 429}}) as (_, _, client):
        r = await client.get("/json")
        assert r.status_code == 429 and "retry-after" not in r.headers
    toxic = {"type": "http_status", "attributes": {"status": 500, "body": "boom", "content_type": "text/plain"}}
    async with http_proxy(toxic) as (_, _, client):
        r = await client.get("/json")
        assert (r.status_code, r.text, r.headers["content-type"]) == (500, "boom", "text/plain")


@aio
async def test_status_swallows_chunked_request_bodies_and_stays_in_step() -> None:
    async with http_proxy({"type": "http_status", "name": "s"}) as (proxy, echo, client):

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(5):
                yield b"y" * 1000

        r = await client.post("/echo", content=chunks())  # httpx sends this chunked
        assert r.status_code == 503
        proxy.remove_toxic("s")
        r = await client.post("/echo", content=chunks())
        assert r.status_code == 200 and r.content == b"y" * 5000
        assert proxy.stats.connections_total == 1 and echo.requests == 1


# --- corrupt, truncate, drop headers -----------------------------------------------------------


@aio
async def test_corrupt_flips_bytes_keeping_length_consistent() -> None:
    async with http_proxy() as (proxy, _, client):
        clean = (await client.get("/json?size=500")).content
        proxy.add_toxic({"type": "http_corrupt", "attributes": {"flips": 4}})
        r = await client.get("/json?size=500")
        assert r.status_code == 200
        assert int(r.headers["content-length"]) == len(r.content) == len(clean)
        diff = [i for i, (a, b) in enumerate(zip(r.content, clean)) if a != b]
        assert len(diff) == 4 and all(r.content[i] == clean[i] ^ 0xFF for i in diff)
        with pytest.raises(ValueError):
            json.loads(r.content)
        # chunked (streamed) responses too: same framing, flipped data
        stream = await client.get("/stream?events=3&interval_ms=1")
        assert stream.status_code == 200
        assert len(stream.content) == len(b"".join(b'data: {"i": %d}\n\n' % i for i in range(3)) + b"data: [DONE]\n\n")


@aio
async def test_corruption_is_deterministic_by_seed() -> None:
    async def body(seed: int) -> bytes:
        async with http_proxy({"type": "http_corrupt", "attributes": {"flips": 3}}, seed=seed) as (_, _, client):
            return (await client.get("/json?size=300")).content

    a, b, c = await body(1), await body(1), await body(2)
    assert a == b != c


@aio
async def test_truncate_closes_after_part_of_the_body() -> None:
    async with http_proxy({"type": "http_truncate", "attributes": {"fraction": 0.5}}) as (proxy, _, client):
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get("/json?size=1000")
        data, closed = await raw_exchange(proxy, GET_JSON)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1])
        assert closed and len(body) == length // 2
        proxy.update_toxic("http_truncate_downstream", {"attributes": {"bytes": 10}})
        data, closed = await raw_exchange(proxy, GET_JSON)
        assert closed and len(data.partition(b"\r\n\r\n")[2]) == 10


@aio
async def test_truncate_chunked_stream() -> None:
    async with http_proxy({"type": "http_truncate", "attributes": {"bytes": 5}}) as (proxy, _, client):
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get("/stream?events=4&interval_ms=1")
        data, closed = await raw_exchange(proxy, b"GET /stream?events=4&interval_ms=1 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert closed and data.endswith(b"\r\ndata:")  # chunk-size line, then 5 data bytes


@aio
async def test_drop_header_removes_content_type_only() -> None:
    async with http_proxy({"type": "http_drop_header"}) as (_, _, client):
        r = await client.get("/json")
        assert "content-type" not in r.headers
        assert r.headers["content-length"] and r.json()["ok"] is True
        r2 = await client.get("/json")  # framing intact: keep-alive still works
        assert r2.status_code == 200


@aio
async def test_dropping_content_length_ends_the_body_with_the_close() -> None:
    async with http_proxy({"type": "http_drop_header", "attributes": {"headers": ["Content-Length"]}}) as (proxy, _, c):
        r = await c.get("/json?size=300")
        assert "content-length" not in r.headers and r.json()["ok"] is True
        data, closed = await raw_exchange(proxy, GET_JSON)
        assert closed and b"content-length" not in data.partition(b"\r\n\r\n")[0].lower()


# --- stall ----------------------------------------------------------------------------------------


@aio
async def test_stall_holds_a_streaming_response_for_the_duration() -> None:
    toxic = {"type": "http_stall", "attributes": {"after_bytes": 10, "duration": 400}}
    async with http_proxy(toxic) as (_, _, client):
        t0 = time.perf_counter()
        first_at = None
        received = b""
        async with client.stream("GET", "/stream?events=3&interval_ms=1") as r:
            async for piece in r.aiter_raw():
                if first_at is None:
                    first_at = time.perf_counter() - t0
                received += piece
        total = time.perf_counter() - t0
        assert first_at is not None and first_at < 0.3  # the first 10 bytes came at once
        assert total >= 0.4
        assert received.endswith(b"data: [DONE]\n\n")
        # a Content-Length JSON response is not a stream: left alone
        t0 = time.perf_counter()
        assert (await client.get("/json")).status_code == 200
        assert time.perf_counter() - t0 < 0.3


@aio
async def test_stall_until_removed() -> None:
    async with http_proxy({"type": "http_stall", "name": "freeze"}) as (proxy, _, client):

        async def fetch() -> bytes:
            return (await client.get("/stream?events=2&interval_ms=1")).content

        task = asyncio.create_task(fetch())
        await asyncio.sleep(0.3)
        assert not task.done()
        proxy.remove_toxic("freeze")
        assert (await asyncio.wait_for(task, 2)).endswith(b"[DONE]\n\n")


# --- selection, per-request toxicity, joining and leaving live connections ---------------------------------


@aio
async def test_path_prefix_limits_a_fault_to_matching_requests() -> None:
    toxic = {"type": "http_status", "attributes": {"status": 500, "path_prefix": "/v1/"}}
    async with http_proxy(toxic) as (_, _, client):
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.post("/v1/embeddings", json={"input": "a"})).status_code == 500
        assert (await client.get("/json")).status_code == 200


@aio
async def test_http_toxicity_is_drawn_per_request_and_seeded() -> None:
    async def statuses(seed: int) -> list[int]:
        toxic = {"type": "http_status", "toxicity": 0.5, "attributes": {"status": 503}}
        async with http_proxy(toxic, seed=seed) as (proxy, _, client):
            out = [(await client.get("/healthz")).status_code for _ in range(20)]
            assert proxy.stats.connections_total == 1
            return out

    a, b, c = await statuses(3), await statuses(3), await statuses(4)
    assert a == b != c
    assert 3 <= a.count(503) <= 17


@aio
async def test_http_faults_join_a_live_keep_alive_connection_and_leave_it() -> None:
    async with http_proxy() as (proxy, _, client):
        assert (await client.get("/json")).status_code == 200
        (conn,) = proxy._connections
        assert conn.http is None  # plain pump so far
        proxy.add_toxic({"type": "http_status", "name": "s", "attributes": {"status": 429}})
        assert (await client.get("/json")).status_code == 429
        assert conn.http is not None
        proxy.remove_toxic("s")
        assert (await client.get("/json")).status_code == 200
        assert conn.http is None  # back to the plain pump at the next request
        assert proxy.stats.connections_total == 1


@aio
async def test_framing_stays_in_step_across_mixed_keep_alive_traffic() -> None:
    # An HTTP toxic that matches nothing keeps the session parsing every message.
    toxic = {"type": "http_status", "attributes": {"path_prefix": "/never"}}
    async with http_proxy(toxic) as (proxy, _, client):
        for i in range(3):
            assert (await client.get(f"/json?size={100 + i}")).json()["ok"]
            body = bytes(range(256)) * (1000 + i)
            assert (await client.post("/echo", content=body)).content == body
            r = await client.get("/stream?events=5&interval_ms=1")
            assert r.text.count("data:") == 6
            assert (await client.head("/json")).status_code == 200
            assert (await client.get("/status/204")).status_code == 204
        assert proxy.stats.connections_total == 1
        assert proxy._connections and all(c.http is not None and not c.http.passthrough for c in proxy._connections)


@aio
async def test_non_http_traffic_passes_through_untouched() -> None:
    from mmchaos.proxy.echo import TcpEchoServer

    async with TcpEchoServer() as echo:
        proxy = FaultProxy(f"127.0.0.1:{echo.address[1]}", toxics=[{"type": "http_corrupt"}])
        async with proxy:
            reader, writer = await asyncio.open_connection(*proxy.address)
            writer.write(b"\x00\x01 not http at all\r\n\r\n")
            assert await reader.readexactly(22) == b"\x00\x01 not http at all\r\n\r\n"
            writer.close()


@aio
async def test_pipelined_requests_get_answers_in_order() -> None:
    toxic = {"type": "http_status", "attributes": {"status": 503, "path_prefix": "/v1/"}}
    async with http_proxy(toxic) as (proxy, echo, _):
        pipeline = (
            b"GET /delay/50 HTTP/1.1\r\nHost: t\r\n\r\n"  # forwarded, answered late
            b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"  # injected: must wait its turn
            b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
        data, closed = await raw_exchange(proxy, pipeline)
        statuses = [int(part[:3]) for part in data.split(b"HTTP/1.1 ")[1:]]
        assert statuses == [200, 503, 200] and closed
        assert echo.requests == 2


@aio
async def test_injected_status_answers_expect_continue_at_once_and_closes() -> None:
    async with http_proxy({"type": "http_status", "attributes": {"status": 429}}) as (proxy, echo, _):
        request = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
        data, closed = await raw_exchange(proxy, request)  # the body is never sent
        assert data.startswith(b"HTTP/1.1 429 ") and b"Connection: close" in data and closed
        assert echo.requests == 0


@aio
async def test_a_request_the_framer_gives_up_on_reaches_the_upstream_whole() -> None:
    # Transfer-Encoding other than chunked: the session stops parsing; the head it read goes on.
    toxic = {"type": "http_status", "attributes": {"path_prefix": "/never"}}
    async with http_proxy(toxic) as (proxy, echo, _):
        request = (
            b"POST /upload HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\nContent-Length: 3\r\n"
            b"Connection: close\r\n\r\nabc"
        )
        data, closed = await raw_exchange(proxy, request)
        assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b'{"bytes": 3}') and closed
        assert echo.requests == 1


@aio
async def test_a_request_head_that_does_not_parse_reaches_the_upstream_whole() -> None:
    # A space before the colon: the framer refuses the head, the upstream accepts it.
    toxic = {"type": "http_status", "attributes": {"path_prefix": "/never"}}
    async with http_proxy(toxic) as (proxy, echo, _):
        request = b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Odd : 1\r\nConnection: close\r\n\r\n"
        data, closed = await raw_exchange(proxy, request)
        assert data.startswith(b"HTTP/1.1 200 ") and closed
        assert echo.requests == 1


@aio
async def test_injected_answer_to_a_pipelined_request_waits_for_the_streaming_response_before_it() -> None:
    toxic = {"type": "http_status", "attributes": {"status": 503, "path_prefix": "/v1/"}}
    async with http_proxy(toxic) as (proxy, _, _):
        reader, writer = await asyncio.open_connection(*proxy.address)
        writer.write(b"GET /stream?events=4&interval_ms=100 HTTP/1.1\r\nHost: t\r\n\r\n")
        first = await asyncio.wait_for(reader.readuntil(b"data: "), 5)  # the stream has begun
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        rest = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        data = first + rest
        stream_end = data.index(b"0\r\n\r\n")
        assert b"data: [DONE]" in data[:stream_end], data
        assert data[stream_end + 5 :].startswith(b"HTTP/1.1 503 "), data
