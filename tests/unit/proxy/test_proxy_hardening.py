"""Issue 11, the fault proxy: the loopback rule, browser refusal, and hostile control-API input.

The control API runs for real (a ProxyThread on loopback); hostile requests go over raw sockets
where httpx would refuse to send them (a negative Content-Length, a bad chunk size).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from mmchaos.errors import ConfigError
from mmchaos.net import REMOTE_REFUSED, require_loopback
from mmchaos.proxy import ControlServer, FaultProxy, ProxyThread
from tests.paths import SRC


@pytest.fixture()
def api(caplog: pytest.LogCaptureFixture) -> Iterator[tuple[ProxyThread, httpx.Client]]:
    """A proxy (upstream never contacted) with its control API; no error may be logged meanwhile."""
    caplog.set_level(logging.ERROR)
    with ProxyThread("127.0.0.1:9", name="p", control="127.0.0.1:0") as thread:
        assert thread.control_url is not None
        with httpx.Client(base_url=thread.control_url, trust_env=False, timeout=5) as client:
            yield thread, client
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def raw(thread: ProxyThread, request: bytes) -> tuple[int, dict[str, Any] | None, bytes]:
    """One raw request to the control API; (status, JSON body or None, the whole response)."""
    assert thread.control_url is not None
    host, _, port = thread.control_url.removeprefix("http://").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(1 << 16):
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep and b"content-length:" in head.lower():
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                if len(body) >= length:
                    break
    assert data.startswith(b"HTTP/1.1 "), f"no response, or not HTTP: {data[:80]!r}"
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    return status, parsed, data


POST_JSON = b"POST /proxies HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


def post(path: str, body: bytes, *, ctype: str = "application/json", extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n{extra}"
        "Connection: close\r\n\r\n"
    ).encode() + body


# --- the loopback rule --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [
        ({"upstream": "10.0.0.1:8000"}, "upstream"),
        ({"upstream": "[::ffff:10.0.0.1]:8000"}, "upstream"),
        ({"upstream": "127.0.0.1:8000", "listen": "0.0.0.0:0"}, "listen"),
        ({"upstream": "127.0.0.1:8000", "listen": "[::]:0"}, "listen"),
    ],
)
def test_proxy_refuses_addresses_that_are_not_loopback(kwargs: dict[str, str], what: str) -> None:
    upstream = kwargs.pop("upstream")
    with pytest.raises(ConfigError, match=what) as info:
        FaultProxy(upstream, **kwargs)
    assert info.value.code == REMOTE_REFUSED
    with pytest.raises(ConfigError, match=what) as info:
        ProxyThread(upstream, **kwargs)
    assert info.value.code == REMOTE_REFUSED


def test_control_address_must_be_loopback_too() -> None:
    with pytest.raises(ConfigError, match="control") as info:
        ProxyThread("127.0.0.1:8000", control="0.0.0.0:0")
    assert info.value.code == REMOTE_REFUSED
    with pytest.raises(ConfigError) as info:
        ControlServer(listen="0.0.0.0:8474")
    assert info.value.code == REMOTE_REFUSED


def test_loopback_names_and_mapped_addresses_pass_and_allow_remote_opens_the_rule() -> None:
    FaultProxy("localhost:8000")
    FaultProxy("[::ffff:127.0.0.1]:8000", listen="[::1]:0")

    async def main() -> None:
        # allowed: starts and listens (on loopback); the remote upstream is never contacted here
        async with FaultProxy("10.0.0.1:8000", allow_remote=True) as proxy:
            assert proxy.address[0] == "127.0.0.1"
        async with FaultProxy("localhost:8000", listen="localhost:0") as proxy:  # names resolve at start
            assert proxy.address[1] > 0

    asyncio.run(asyncio.wait_for(main(), 20))


def test_host_names_must_resolve_to_loopback_only() -> None:
    # DNS is faked (no lookups leave this machine in tests): a name with one remote address fails.
    def resolver(addresses: list[str]) -> Callable[..., list[tuple[Any, ...]]]:
        return lambda *a, **k: [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, 0)) for ip in addresses]

    require_loopback("svc", what="upstream", resolver=resolver(["127.0.0.1", "::1"]))
    for addresses in (["127.0.0.1", "10.0.0.1"], []):
        with pytest.raises(ConfigError, match="upstream 'svc'") as info:
            require_loopback("svc", what="upstream", resolver=resolver(addresses))
        assert info.value.code == REMOTE_REFUSED

    def fails(*a: Any, **k: Any) -> list[tuple[Any, ...]]:
        raise socket.gaierror(-2, "Name or service not known")

    with pytest.raises(ConfigError, match="cannot be resolved") as info:
        require_loopback("svc", what="upstream", resolver=fails)
    assert info.value.code == REMOTE_REFUSED


@pytest.mark.parametrize(
    "argv",
    [
        ["proxy", "--upstream", "10.0.0.1:8000"],
        ["proxy", "--upstream", "127.0.0.1:8000", "--listen", "0.0.0.0:9000"],
        ["proxy", "--upstream", "127.0.0.1:8000", "--control", "0.0.0.0:8474"],
    ],
)
def test_cli_refuses_remote_addresses_with_one_line_and_exit_2(argv: list[str], subprocess_env: dict[str, str]) -> None:
    # A child process: without the rule the command would serve until interrupted (the timeout).
    env = dict(subprocess_env, PYTHONPATH=os.pathsep.join([str(SRC), subprocess_env["PYTHONPATH"]]))
    proc = subprocess.run(
        [sys.executable, "-m", "mmchaos", *argv], capture_output=True, text=True, timeout=30, env=env, check=False
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error [{REMOTE_REFUSED}]: ") and "--allow-remote" in lines[0]


def test_control_api_refuses_to_create_proxies_with_remote_addresses(api: tuple[ProxyThread, httpx.Client]) -> None:
    _, client = api
    for body in (
        {"name": "far", "listen": "127.0.0.1:0", "upstream": "10.0.0.1:80"},
        {"name": "open", "listen": "0.0.0.0:0", "upstream": "127.0.0.1:80"},
    ):
        r = client.post("/proxies", json=body)
        assert r.status_code == 403 and r.json()["code"] == REMOTE_REFUSED, r.text
        r = client.post("/populate", json=[body])
        assert r.status_code == 403 and r.json()["code"] == REMOTE_REFUSED, r.text
    assert set(client.get("/proxies").json()) == {"p"}


# --- browser-originated requests -----------------------------------------------------------------


def test_control_api_refuses_browsers_like_toxiproxy(api: tuple[ProxyThread, httpx.Client]) -> None:
    thread, client = api
    browser = {"User-Agent": "Mozilla/5.0 (X11; Linux x86_64) Firefox/120.0"}
    r = client.get("/proxies", headers=browser)
    assert r.status_code == 403 and r.json()["code"] == "control_browser_refused"
    toxic = {"type": "latency", "attributes": {"latency": 100}}
    r = client.post("/proxies/p/toxics", json=toxic, headers=browser)
    assert r.status_code == 403
    # a page posting text/plain (no CORS preflight) must not create anything
    r = client.post(
        "/proxies", content=json.dumps({"name": "x", "upstream": "127.0.0.1:1"}), headers={"Content-Type": "text/plain"}
    )
    assert r.status_code == 415 and r.json()["code"] == "control_unsupported_media_type"
    r = client.post("/proxies/p/toxics", content=json.dumps(toxic))  # no Content-Type at all
    assert r.status_code == 415
    r = client.post("/proxies/p/toxics", json=toxic, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and r.json()["code"] == "control_browser_refused"
    assert thread.toxics == [] and set(client.get("/proxies").json()) == {"p"}
    # what toxiproxy's clients send still works: JSON bodies, and bodiless POST /reset
    r = client.post("/proxies/p/toxics", json=toxic, headers={"User-Agent": "toxiproxy-cli"})
    assert r.status_code == 200
    r = client.post(
        "/proxies/p/toxics/latency_downstream",
        content=b'{"toxicity": 0.5}',
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert r.status_code == 200 and r.json()["toxicity"] == 0.5
    assert client.post("/reset").status_code == 204 and thread.toxics == []


# --- hostile input to the control API ------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "code"),
    [
        ("/proxies", b"[" * 100_000 + b"]" * 100_000, "control_bad_json"),
        ("/proxies", b'{"a":' * 5_000 + b"1" + b"}" * 5_000, "control_bad_json"),
        ("/populate", b'[1, "x", null]', "config_invalid_proxy"),
        ("/proxies/p/toxics", b'{"type": "latency", "attributes": {"latency": Infinity}}', "control_bad_json"),
        ("/proxies/p/toxics", b'{"type": "latency", "attributes": {"latency": NaN}}', "control_bad_json"),
        ("/proxies/p/toxics", b'{"type": "latency", "attributes": {"latency": 1e30}}', "config_invalid_toxic"),
        (
            "/proxies/p/toxics",
            b'{"type": "latency", "attributes": {"latency": 1, "jitter": 1e300}}',
            "config_invalid_toxic",
        ),
        ("/proxies/p/toxics", b'{"type": "bandwidth", "attributes": {"rate": 1e400}}', "control_bad_json"),
        (
            "/proxies/p/toxics",
            b'{"type": "bandwidth", "attributes": {"rate": 99999999999999999999999}}',
            "config_invalid_toxic",
        ),
        ("/proxies/p/toxics", b'{"type": "slow_close", "attributes": {"delay": 1e30}}', "config_invalid_toxic"),
        ("/proxies/p/toxics", b'{"type": "timeout", "attributes": {"timeout": 1e30}}', "config_invalid_toxic"),
        ("/proxies/p/toxics", b'{"type": "http_stall", "attributes": {"duration": 1e30}}', "config_invalid_toxic"),
        (
            "/proxies/p/toxics",
            b'{"type": "latency", "toxicity": 1e30, "attributes": {"latency": 1}}',
            "config_invalid_toxic",
        ),
        (
            "/proxies/p/toxics",
            b'{"type": "http_status", "attributes": {"content_type": "a/b\\r\\nX-Evil: 1"}}',
            "config_invalid_toxic",
        ),
        (
            "/proxies/p/toxics",
            b'{"type": "http_status", "attributes": {"path_prefix": "/a\\u0000"}}',
            "config_invalid_toxic",
        ),
        (
            "/proxies/p/toxics",
            b'{"type": "http_status", "attributes": {"content_type": "text/\\u00e9"}}',
            "config_invalid_toxic",
        ),
        ("/proxies/p/toxics", b'"just a string"', "config_invalid_toxic"),
        ("/proxies", b'{"name": "s", "upstream": "127.0.0.1:1", "seed": 1e400}', "control_bad_json"),
        ("/proxies", b'{"name": "s", "upstream": "127.0.0.1:1", "seed": ' + b"9" * 5000 + b"}", "control_bad_json"),
        ("/proxies", b'{"name": "s", "upstream": "127.0.0.1:1", "seed": ' + b"9" * 30 + b"}", "config_invalid_proxy"),
        ("/proxies", b"\xff\xfe{}", "control_bad_json"),
        ("/proxies", b'{"name": "s", "upstream": "a\\u0000b:80"}', "config_invalid_proxy"),
        ("/proxies", b'{"name": "s", "upstream": "a\\r\\nb:80"}', "config_invalid_proxy"),
        ("/proxies", b'{"name": "s", "upstream": "' + b"a" * 300 + b':80"}', "config_invalid_proxy"),
    ],
)
def test_hostile_json_gets_a_clean_4xx_with_a_stable_code(
    api: tuple[ProxyThread, httpx.Client], path: str, body: bytes, code: str
) -> None:
    thread, client = api
    status, parsed, data = raw(thread, post(path, body))
    assert 400 <= status < 500 and parsed is not None and parsed["code"] == code, data[:300]
    assert b"X-Evil" not in data
    assert thread.toxics == [] and set(client.get("/proxies").json()) == {"p"}


@pytest.mark.parametrize(
    ("request_bytes", "code"),
    [
        (
            POST_JSON + b"Content-Length: -1\r\n\r\n{}",
            "http_bad_content_length",
        ),
        (
            POST_JSON + b"Content-Length: +2\r\n\r\n{}",
            "http_bad_content_length",
        ),
        (
            POST_JSON + b"Content-Length: 99999999999\r\n\r\n",
            "http_body_too_large",
        ),
        (
            POST_JSON + b"Transfer-Encoding: chunked\r\n\r\n-5\r\nabc\r\n0\r\n\r\n",
            "http_bad_chunk",
        ),
        (
            POST_JSON + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n",
            "http_bad_chunk",
        ),
        (b"GET /proxies HTTP/1.1 extra\r\nHost: t\r\n\r\n", "http_bad_request"),
        (b"GET /proxies HTTP/1.1\r\nno colon\r\n\r\n", "http_bad_request"),
        (b"GET /proxies HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", "http_head_too_large"),
    ],
)
def test_malformed_http_gets_a_clean_4xx_not_a_dropped_connection(
    api: tuple[ProxyThread, httpx.Client], request_bytes: bytes, code: str
) -> None:
    thread, client = api
    status, parsed, data = raw(thread, request_bytes)
    assert 400 <= status < 500 and parsed is not None and parsed["code"] == code, data[:300]
    assert client.get("/version").status_code == 200


# --- toxiproxy compatibility ---------------------------------------------------------------------


def test_patch_updates_like_post(api: tuple[ProxyThread, httpx.Client]) -> None:
    thread, client = api
    client.post("/proxies/p/toxics", json={"type": "latency", "name": "lag", "attributes": {"latency": 10}})
    r = client.patch("/proxies/p/toxics/lag", json={"attributes": {"latency": 20}})
    assert r.status_code == 200 and r.json()["attributes"]["latency"] == 20
    assert thread.toxics[0].attributes.latency == 20  # type: ignore[union-attr]
    r = client.patch("/proxies/p", json={"enabled": False})
    assert r.status_code == 200 and r.json()["enabled"] is False
    assert client.patch("/proxies/p", json={"enabled": True}).json()["enabled"] is True


def test_integer_attributes_are_integers_as_in_toxiproxy(api: tuple[ProxyThread, httpx.Client]) -> None:
    _, client = api
    toxics = [
        {"type": "latency", "attributes": {"latency": 200, "jitter": 5}},
        {"type": "bandwidth", "attributes": {"rate": 100}},
        {"type": "slow_close", "attributes": {"delay": 50}},
        {"type": "timeout", "attributes": {"timeout": 100}},
        {"type": "reset_peer", "attributes": {"timeout": 10}},
        {"type": "slicer", "attributes": {"average_size": 10, "size_variation": 2, "delay": 5}},
        {"type": "limit_data", "attributes": {"bytes": 1000}},
    ]
    for toxic in toxics:
        r = client.post("/proxies/p/toxics", json=toxic)
        assert r.status_code == 200, r.text
        attrs = r.json()["attributes"]
        for key, value in toxic["attributes"].items():  # type: ignore[attr-defined]
            assert type(attrs[key]) is int and attrs[key] == value, (toxic, r.text)
    listed = client.get("/proxies/p/toxics").text
    assert ".0" not in listed.replace('"toxicity": 1.0', "")


def test_control_api_refuses_a_rebound_host_and_other_local_origins(api: tuple[ProxyThread, httpx.Client]) -> None:
    """DNS rebinding: a page at evil.example re-pointed at 127.0.0.1 reached /proxies and /metrics (its
    Host header still names evil.example); and a page on any other loopback port was a trusted origin."""
    thread, client = api
    assert thread.control_url is not None
    port = int(thread.control_url.rsplit(":", 1)[1])
    for host in ("evil.example", f"evil.example:{port}", f"10.0.0.1:{port}", "localhost.evil.example"):
        for path in ("/proxies", "/metrics", "/version"):
            r = client.get(path, headers={"Host": host})
            assert r.status_code == 403 and r.json()["code"] == "control_host_refused", (host, path, r.text)
    toxic = {"type": "latency", "attributes": {"latency": 100}}
    r = client.post("/proxies/p/toxics", json=toxic, headers={"Host": f"evil.example:{port}"})
    assert r.status_code == 403 and thread.toxics == []
    for origin in (f"http://127.0.0.1:{port + 1}", "http://localhost:3000", "http://127.0.0.1"):
        r = client.post("/proxies/p/toxics", json=toxic, headers={"Origin": origin})
        assert r.status_code == 403 and r.json()["code"] == "control_browser_refused", origin
    assert thread.toxics == []
    # the control server's own names and origin still work
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", "[::1]:9000", "localhost"):
        assert client.get("/proxies", headers={"Host": host}).status_code == 200, host
    r = client.post("/proxies/p/toxics", json=toxic, headers={"Origin": f"http://localhost:{port}"})
    assert r.status_code == 200 and len(thread.toxics) == 1
