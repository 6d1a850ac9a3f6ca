"""The control API (toxiproxy's REST, plus /metrics), ProxyThread for sync code, and `mmchaos proxy`."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mmchaos.proxy import ControlServer, EchoHTTPServer, FaultProxy, ProxyThread, TcpEchoServer
from tests.support.proxy_control import refused


def metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_control_api_round_trip() -> None:
    async def main() -> None:
        async with EchoHTTPServer() as echo:
            proxy = FaultProxy(f"127.0.0.1:{echo.address[1]}", name="api")
            # The clients need the URLs the servers got when they started, hence the nesting.
            async with proxy, ControlServer([proxy], listen="127.0.0.1:0") as control:  # noqa: SIM117
                async with (
                    httpx.AsyncClient(base_url=control.url, trust_env=False) as api,
                    httpx.AsyncClient(base_url=proxy.url, trust_env=False) as client,
                ):
                    listed = (await api.get("/proxies")).json()
                    assert listed["api"]["upstream"] == proxy.upstream and listed["api"]["enabled"] is True
                    assert listed["api"]["toxics"] == []

                    # add: toxiproxy's JSON, default name <type>_<stream>
                    r = await api.post(
                        "/proxies/api/toxics", json={"type": "http_status", "attributes": {"status": 503}}
                    )
                    assert r.status_code == 200 and r.json()["name"] == "http_status_downstream"
                    assert (await client.get("/json")).status_code == 503
                    r = await api.post("/proxies/api/toxics", json={"type": "http_status"})
                    assert r.status_code == 409 and r.json()["code"] == "toxic_exists"

                    # update merges attributes; get shows it
                    r = await api.post(
                        "/proxies/api/toxics/http_status_downstream", json={"attributes": {"status": 429}}
                    )
                    assert r.json()["attributes"]["status"] == 429 and r.json()["attributes"]["retry_after"] is None
                    assert (await api.get("/proxies/api/toxics/http_status_downstream")).json()["attributes"][
                        "status"
                    ] == 429
                    assert (await client.get("/json")).status_code == 429

                    # remove: the next request is clean
                    assert (await api.delete("/proxies/api/toxics/http_status_downstream")).status_code == 204
                    assert (await client.get("/json")).status_code == 200
                    assert (await api.get("/proxies/api/toxics")).json() == []

                    # errors: one line, a stable code, toxiproxy's status codes
                    r = await api.post("/proxies/api/toxics", json={"type": "latncy", "attributes": {"latency": 1}})
                    assert (
                        r.status_code == 400 and "latency" in r.json()["error"] and r.json()["code"] == "unknown_toxic"
                    )
                    r = await api.post("/proxies/api/toxics", json={"type": "latency", "attributes": {"latency": -1}})
                    assert r.status_code == 400 and "attributes.latency" in r.json()["error"]
                    r = await api.post("/proxies/api/toxics", json={"type": "latency", "attributes": {"ms": 5}})
                    assert r.status_code == 400 and "ms" in r.json()["error"]
                    assert (await api.get("/proxies/nope")).status_code == 404
                    assert (await api.delete("/proxies/api/toxics/nope")).status_code == 404
                    r = await api.post(
                        "/proxies/api/toxics", content=b"{not json", headers={"Content-Type": "application/json"}
                    )
                    assert r.status_code == 400 and r.json()["code"] == "control_bad_json"

                    # proxies: disable and enable, create, delete, reset
                    port = proxy.address[1]
                    assert (await api.post("/proxies/api", json={"enabled": False})).json()["enabled"] is False
                    assert refused(port)
                    await api.post("/proxies/api", json={"enabled": True})
                    assert (await client.get("/json")).status_code == 200
                    r = await api.post(
                        "/proxies", json={"name": "second", "listen": "127.0.0.1:0", "upstream": proxy.upstream}
                    )
                    assert r.status_code == 201
                    second = control.proxies["second"]
                    async with httpx.AsyncClient(base_url=second.url, trust_env=False) as c2:
                        assert (await c2.get("/healthz")).status_code == 200
                    assert (await api.post("/proxies", json={"name": "second", "upstream": "x:1"})).status_code == 409
                    await api.post("/proxies/second/toxics", json={"type": "latency", "attributes": {"latency": 1}})
                    await api.post("/proxies/api", json={"enabled": False})
                    assert (await api.post("/reset")).status_code == 204
                    assert second.toxics == [] and proxy.enabled
                    second_port = second.address[1]
                    assert (await api.delete("/proxies/second")).status_code == 204
                    assert refused(second_port) and "second" not in control.proxies
            assert refused(control.address[1]) and refused(proxy.address[1])

    asyncio.run(asyncio.wait_for(main(), 30))


def test_metrics_count_connections_bytes_and_faults() -> None:
    async def main() -> None:
        async with TcpEchoServer() as echo:
            proxy = FaultProxy(f"127.0.0.1:{echo.address[1]}", name="m")
            async with proxy, ControlServer([proxy], listen="127.0.0.1:0") as control:
                for _ in range(2):
                    reader, writer = await asyncio.open_connection(*proxy.address)
                    writer.write(b"x" * 1000)
                    await reader.readexactly(1000)
                    writer.close()
                while proxy.stats.connections_active:  # closed ones must not take the new toxic
                    await asyncio.sleep(0.01)
                proxy.add_toxic({"type": "latency", "name": "slow", "attributes": {"latency": 1}})
                reader, writer = await asyncio.open_connection(*proxy.address)
                writer.write(b"y" * 10)
                await reader.readexactly(10)
                async with httpx.AsyncClient(base_url=control.url, trust_env=False) as api:
                    r = await api.get("/metrics")
                writer.close()
                assert r.headers["content-type"].startswith("text/plain")
                m = metrics(r.text)
                assert m[("mmchaos_proxy_connections_total", (("proxy", "m"),))] == 3
                assert m[("mmchaos_proxy_connections_active", (("proxy", "m"),))] == 1
                for direction in ("upstream", "downstream"):
                    key = ("mmchaos_proxy_sent_bytes_total", (("direction", direction), ("proxy", "m")))
                    assert m[key] == 2010
                fault = ("mmchaos_proxy_faults_total", (("proxy", "m"), ("toxic", "slow"), ("type", "latency")))
                assert m[fault] == 1
                assert m[("mmchaos_proxy_toxics", (("proxy", "m"),))] == 1

    asyncio.run(asyncio.wait_for(main(), 30))


def test_proxy_thread_from_sync_code() -> None:
    threads_before = threading.active_count()

    async def serve(ready: threading.Event, stop: threading.Event, box: list[Any]) -> None:
        async with TcpEchoServer() as echo:
            box.append(echo.address)
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.02)

    ready, stop, box = threading.Event(), threading.Event(), []
    upstream = threading.Thread(target=lambda: asyncio.run(serve(ready, stop, box)))
    upstream.start()
    try:
        assert ready.wait(10)
        with ProxyThread(f"127.0.0.1:{box[0][1]}", control="127.0.0.1:0") as proxy:
            port = proxy.address[1]

            def echo_time() -> float:
                with socket.create_connection(proxy.address, timeout=5) as s:
                    t0 = time.perf_counter()
                    s.sendall(b"hi")
                    assert s.recv(10) == b"hi"
                    return time.perf_counter() - t0

            assert echo_time() < 0.15
            proxy.add_toxic({"type": "latency", "name": "lag", "attributes": {"latency": 150}})
            assert [t.name for t in proxy.toxics] == ["lag"]
            assert echo_time() >= 0.15
            proxy.remove_toxic("lag")
            assert echo_time() < 0.15
            assert proxy.stats().connections_total == 3
            assert proxy.control_url is not None
            assert (
                httpx.get(proxy.control_url + "/proxies", trust_env=False).json()["mmchaos"]["listen"] == proxy.listen
            )
            proxy.set_enabled(False)
            assert refused(port)
            proxy.reset()
            assert echo_time() < 0.15
            control_port = int(proxy.control_url.rsplit(":", 1)[1])
        assert refused(port) and refused(control_port)
    finally:
        stop.set()
        upstream.join(10)
    assert threading.active_count() == threads_before


def test_proxy_thread_reports_bad_input_in_the_caller() -> None:
    from mmchaos.errors import ConfigError

    with pytest.raises(ConfigError):
        ProxyThread("no-port-here")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(ConfigError, match="cannot listen"), ProxyThread("127.0.0.1:1", listen=f"127.0.0.1:{taken}"):
            pass


def test_control_errors_are_toxiproxys_shape_with_the_codes_own_status() -> None:
    """docs/proxy.md: ``{"error": message, "status": http_status, "code": ...}``, never OpenAI's nesting,
    and the status is the one the code table gives."""
    from mmchaos.error_codes import status_of

    async def main() -> None:
        async with ControlServer([], listen="127.0.0.1:0") as control:  # noqa: SIM117 (the client needs its URL)
            async with httpx.AsyncClient(base_url=control.url, trust_env=False) as api:
                for method, path, code in (
                    ("GET", "/proxies/nope", "proxy_not_found"),
                    ("PUT", "/proxies", "control_method"),
                    ("GET", "/nowhere", "control_no_route"),
                ):
                    r = await api.request(method, path)
                    body = r.json()
                    assert set(body) == {"error", "status", "code"} and isinstance(body["error"], str), body
                    assert body["code"] == code and r.status_code == body["status"] == status_of(code), body

    asyncio.run(main())
