"""The reference server on a real loopback port: every endpoint, every guard's answer, shutdown.

Targets are small numpy models (tests/fakes/targets.py) plus a few built here that fail, block or read
on demand, so each guard can be driven to its answer deterministically.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

import mmchaos
from mmchaos.guard.breaker import BreakerConfig
from mmchaos.server import ServerConfig, ServerThread, create_app
from tests.fakes.server_targets import ControlledTarget, ReaderTarget, TokenizedTarget
from tests.fakes.targets import HashEmbedTarget
from tests.support.images import png_declaring

pytestmark = pytest.mark.integration


def png_url(img: np.ndarray, fmt: str = "PNG", mode: str | None = None) -> str:
    buf = io.BytesIO()
    pil = Image.fromarray(img)
    if mode is not None:
        pil = pil.convert(mode)
    pil.save(buf, format=fmt)
    mime = {"PNG": "png", "JPEG": "jpeg", "TIFF": "tiff", "GIF": "gif"}[fmt]
    return f"data:image/{mime};base64," + base64.b64encode(buf.getvalue()).decode()


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


IMG = np.random.default_rng(0).integers(0, 255, (32, 40, 3), dtype=np.uint8)


@pytest.fixture()
def target() -> ControlledTarget:
    return ControlledTarget()


@pytest.fixture()
def server(target: ControlledTarget) -> Iterator[ServerThread]:
    srv = ServerThread(target, ServerConfig(max_concurrency=2, max_queue=4, request_timeout=10.0)).start()
    try:
        yield srv
    finally:
        target.gate.set()
        srv.stop()
        assert_closed(srv.port)


@pytest.fixture()
def client(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=20.0) as c:
        yield c


def assert_closed(port: int) -> None:
    with socket.socket() as s:
        s.settimeout(1.0)
        assert s.connect_ex(("127.0.0.1", port)) != 0, f"something still listens on {port}"


def assert_error(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code, err
    assert err["message"]
    assert resp.headers["x-request-id"]
    return dict(err)


# -- endpoints -----------------------------------------------------------------------------------


def test_embeddings_match_the_target_exactly(client: httpx.Client, target: ControlledTarget) -> None:
    body = {
        "model": "ControlledTarget",
        "input": ["a red circle", image_part(png_url(IMG)), {"type": "text", "text": "x"}],
    }
    resp = client.post("/v1/embeddings", json=body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["object"] == "list" and out["model"] == "ControlledTarget"
    assert [d["index"] for d in out["data"]] == [0, 1, 2]
    got = np.array([d["embedding"] for d in out["data"]], dtype=np.float32)
    ref_t = HashEmbedTarget().embed_texts(["a red circle", "x"])
    ref_i = HashEmbedTarget().embed_images([IMG])
    np.testing.assert_array_equal(got, np.stack([ref_t[0], ref_i[0], ref_t[1]]))
    assert out["usage"]["prompt_tokens"] > 0
    # a single string, base64 float32, and vLLM's chat-embeddings form
    b64 = client.post("/v1/embeddings", json={"input": "a red circle", "encoding_format": "base64"}).json()
    vec = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(vec, ref_t[0])
    msg = {"messages": [{"role": "user", "content": [image_part(png_url(IMG))]}]}
    chat_form = client.post("/v1/embeddings", json=msg).json()
    np.testing.assert_array_equal(np.array(chat_form["data"][0]["embedding"], np.float32), ref_i[0])
    text_form = client.post("/v1/embeddings", json={"messages": [{"role": "user", "content": "a red circle"}]})
    np.testing.assert_array_equal(np.array(text_form.json()["data"][0]["embedding"], np.float32), ref_t[0])


def test_models_health_ready_metrics_openapi(client: httpx.Client, target: ControlledTarget) -> None:
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and len(models["data"]) == 1
    card = models["data"][0]
    assert card["id"] == "ControlledTarget" and card["object"] == "model"
    meta = card["mmchaos"]
    assert meta["fingerprint"] == target.fingerprint().to_dict()
    assert meta["capabilities"] == ["embed_image", "embed_text"]
    assert "max_model_len" not in card, "an embedding target states no positions"
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json()["status"] == "ready"
    client.post("/v1/embeddings", json={"input": ["hello", image_part(png_url(IMG))]})
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    for modality in ("text", "image"):
        for stage in ("decode", "model"):
            assert f'mmchaos_server_stage_seconds_count{{modality="{modality}",stage="{stage}"}} 1.0' in text
    for family in (
        "mmchaos_breaker_state",
        "mmchaos_preflight_inputs_total",
        "mmchaos_drift_embeddings_total",
        "mmchaos_slo_requests_total",
        'mmchaos_server_requests_total{endpoint="/v1/embeddings",status="200"}',
    ):
        assert family in text, family  # fmt: skip
    spec = client.get("/openapi.json").json()
    assert {"/v1/embeddings", "/v1/chat/completions", "/v1/models", "/healthz", "/readyz", "/metrics"} <= set(
        spec["paths"]
    )
    assert "413" in spec["paths"]["/v1/embeddings"]["post"]["responses"]


def test_request_id_is_echoed_or_generated(client: httpx.Client) -> None:
    resp = client.get("/healthz", headers={"x-request-id": "req-123.abc"})
    assert resp.headers["x-request-id"] == "req-123.abc"
    ids = {client.get("/healthz").headers["x-request-id"] for _ in range(3)}
    assert len(ids) == 3 and all(len(i) == 32 for i in ids)
    # a hostile id is replaced, never reflected
    bad = client.get("/healthz", headers={"x-request-id": "x" * 500})
    assert bad.headers["x-request-id"] != "x" * 500
    err = client.post("/v1/embeddings", json={"input": []}, headers={"x-request-id": "err-1"})
    assert err.headers["x-request-id"] == "err-1"


def test_chat_completions_reads_text() -> None:
    with ServerThread(ReaderTarget()) as srv, httpx.Client(base_url=srv.url) as c:
        light = png_url(np.full((20, 30, 3), 250, np.uint8))
        dark = png_url(np.zeros((16, 16, 3), np.uint8))
        body = {"model": "ReaderTarget", "messages": [
            {"role": "system", "content": "transcribe"},
            {"role": "user", "content": [{"type": "text", "text": "read this"}, image_part(light), image_part(dark)]},
        ]}  # fmt: skip
        out = c.post("/v1/chat/completions", json=body)
        assert out.status_code == 200, out.text
        answer = out.json()
        assert answer["object"] == "chat.completion" and answer["id"].startswith("chatcmpl-")
        assert answer["choices"][0]["message"] == {"role": "assistant", "content": "30x20 light\n16x16 dark"}
        assert_error(c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}), 400,
                     "empty_input")  # fmt: skip
        assert_error(c.post("/v1/chat/completions", json={**body, "stream": True}), 400, "stream_unsupported")
        assert_error(c.post("/v1/embeddings", json={"input": "x"}), 400, "capability_missing")


# -- guards: client errors -----------------------------------------------------------------------


BOMB = png_declaring(30000, 30000)  # 2.7e9 elements: refused from the header, nothing decoded


@pytest.mark.parametrize(
    ("item", "status", "code"),
    [
        (image_part("data:image/png;base64,!!notbase64!!"), 400, "bad_data_url"),
        (image_part("https://example.com/cat.png"), 400, "bad_data_url"),
        (image_part("data:image/png;base64," + base64.b64encode(b"not an image at all").decode()), 400, "bad_image"),
        (image_part("data:image/png;base64," + base64.b64encode(base64.b64decode(png_url(IMG)[22:])[:300]).decode()),
         400, "truncated_image"),
        (image_part("data:image/png;base64," + base64.b64encode(BOMB).decode()), 413,
         "element_count_overflow"),
        (image_part(png_url(IMG, "TIFF")), 415, "unsupported_format"),
        (image_part(png_url(np.zeros((4, 4, 3), np.uint8))), 422, "image_too_small"),
        (image_part(png_url(np.zeros((8, 2000, 3), np.uint8))), 422, "bad_aspect_ratio"),
        ("\ud800 lone surrogate", 400, "bad_utf8"),
        ("word " * 20000, 413, "text_too_long"),
    ],
)  # fmt: skip
def test_preflight_rejections_map_to_their_status(client: httpx.Client, item: Any, status: int, code: str) -> None:
    body = json.dumps({"input": ["fine", item]}).encode()  # ASCII escapes carry lone surrogates
    resp = client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
    err = assert_error(resp, status, code)
    assert err["param"].startswith("input[1]")
    assert err["type"] == "invalid_request_error"


def test_request_level_client_errors(server: ServerThread, client: httpx.Client) -> None:
    assert_error(client.post("/v1/embeddings", content=b"{nope", headers={"content-type": "application/json"}),
                 400, "invalid_json")  # fmt: skip
    assert_error(client.post("/v1/embeddings", json={"input": 3}), 400, "invalid_request")
    assert_error(client.post("/v1/embeddings", json={"input": []}), 400, "empty_input")
    assert_error(client.post("/v1/embeddings", json={"input": "x", "messages": []}), 400, "invalid_request")
    assert_error(client.post("/v1/embeddings", content=b"input=x", headers={"content-type": "text/plain"}), 415,
                 "unsupported_media_type")  # fmt: skip
    assert_error(client.post("/v1/embeddings", json={"input": ["x"] * 65}), 413, "too_many_inputs")
    big = b'{"input": "' + b"a" * (33 * 2**20) + b'"}'
    assert_error(client.post("/v1/embeddings", content=big, headers={"content-type": "application/json"}), 413,
                 "payload_too_large")  # fmt: skip
    assert_error(client.post("/v1/embeddings", json={"model": "gpt-4", "input": "x"}), 404, "model_not_found")
    assert_error(client.post("/v1/embeddings", json={"input": "x", "dimensions": 3}), 400, "dimensions_unsupported")
    two = {"messages": [{"role": "user", "content": [image_part(png_url(IMG)), {"type": "text", "text": "x"}]}]}
    assert_error(client.post("/v1/embeddings", json=two), 400, "one_item_per_conversation")
    assert_error(client.get("/nowhere"), 404, "not_found")
    assert_error(client.get("/v1/embeddings"), 405, "method_not_allowed")
    assert_error(client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}), 400,
                 "capability_missing")  # fmt: skip
    # the client's faults are not the model's: the breaker saw none of them
    assert server.state.breaker.state.value == "closed" and breaker_count(server, "failed") == 0


def test_model_failures_are_5xx_with_codes(client: httpx.Client, target: ControlledTarget) -> None:
    target.nan = True
    assert_error(client.post("/v1/embeddings", json={"input": "x"}), 500, "non_finite_output")
    target.nan = False
    target.refuse = True
    assert_error(client.post("/v1/embeddings", json={"input": "x"}), 422, "model_refused")
    target.refuse = False
    target.fail = True
    err = assert_error(client.post("/v1/embeddings", json={"input": "x"}), 500, "model_error")
    assert err["type"] == "server_error" and "RuntimeError" in err["message"]


def test_api_key_is_required_when_configured(target: ControlledTarget) -> None:
    config = ServerConfig(api_keys=("s3cret-key",))
    with ServerThread(target, config) as srv, httpx.Client(base_url=srv.url) as c:
        assert_error(c.post("/v1/embeddings", json={"input": "x"}), 401, "invalid_api_key")
        wrong = c.post("/v1/embeddings", json={"input": "x"}, headers={"Authorization": "Bearer nope"})
        assert_error(wrong, 401, "invalid_api_key")
        ok = c.post("/v1/embeddings", json={"input": "x"}, headers={"Authorization": "Bearer s3cret-key"})
        assert ok.status_code == 200
        assert c.get("/healthz").status_code == 200  # operations endpoints stay open
        assert "s3cret" not in repr(config) and "s3cret" not in c.get("/v1/models", headers={
            "Authorization": "Bearer s3cret-key"}).text  # fmt: skip


def test_a_bearer_key_that_is_not_ascii_is_refused_like_any_wrong_key(target: ControlledTarget) -> None:
    """Keys are compared in constant time over their digests: a non-ASCII or over-long key is a 401, not a 500."""
    config = ServerConfig(api_keys=("key-one", "key-two"))
    with ServerThread(target, config) as srv, httpx.Client(base_url=srv.url) as c:
        for given in (
            "Bearer k\u00e9y-one".encode().decode("latin-1"),
            "Bearer " + "x" * 5000,
            "Basic key-one",
            "Bearer",
        ):
            refused = c.post("/v1/embeddings", json={"input": "x"}, headers={"Authorization": given.encode("latin-1")})
            assert_error(refused, 401, "invalid_api_key")
        for key in ("key-one", "key-two"):
            ok = c.post("/v1/embeddings", json={"input": "x"}, headers={"Authorization": f"bearer {key}"})
            assert ok.status_code == 200, ok.text
        assert c.get("/metrics").status_code == 200 and c.get("/readyz").status_code == 200  # operations stay open


# -- guards: load, timeouts, the breaker -----------------------------------------------------------


def test_full_queue_answers_429_with_retry_after(target: ControlledTarget) -> None:
    target.gate.clear()
    config = ServerConfig(max_concurrency=1, max_queue=1, request_timeout=20.0)
    with ServerThread(target, config) as srv, ThreadPoolExecutor(2) as pool:
        post = partial_post(srv.url, {"input": "x"})
        first = pool.submit(post)
        assert target.entered.acquire(timeout=10.0)  # the first holds the only slot, in the model
        second = pool.submit(post)
        wait_until(lambda: len(srv.state.admission.waiters) == 1)
        with httpx.Client(base_url=srv.url) as c:
            third = c.post("/v1/embeddings", json={"input": "x"})
            err = assert_error(third, 429, "queue_full")
            assert err["type"] == "rate_limit_error"
            assert int(third.headers["retry-after"]) >= 1
            assert "mmchaos_server_queued 1.0" in c.get("/metrics").text
        target.gate.set()
        assert first.result(10).status_code == 200
        assert second.result(10).status_code == 200


def test_timeout_answers_504_and_the_slot_is_held_until_the_model_returns(target: ControlledTarget) -> None:
    target.gate.clear()
    config = ServerConfig(max_concurrency=1, max_queue=1, request_timeout=0.3)
    with ServerThread(target, config) as srv, httpx.Client(base_url=srv.url, timeout=10.0) as c:
        start = time.monotonic()
        err = assert_error(c.post("/v1/embeddings", json={"input": "x"}), 504, "request_timeout")
        assert err["type"] == "timeout_error" and "longer than" in err["message"]
        assert time.monotonic() - start < 5.0
        # the model is still busy with it, so the next request waits in the queue, and times out there
        err = assert_error(c.post("/v1/embeddings", json={"input": "x"}), 504, "request_timeout")
        assert "no slot freed up" in err["message"]
        assert target.calls == 1  # no second call piled up behind the stuck one
        target.gate.set()
        wait_until(lambda: srv.state.admission.active == 0)
        assert c.post("/v1/embeddings", json={"input": "x"}).status_code == 200
        # the call that outlived its request was recorded by the breaker as slow
        assert breaker_count(srv, "successful", "mmchaos_breaker_slow_calls") >= 1


def test_breaker_opens_on_failures_and_closes_after_recovery(target: ControlledTarget) -> None:
    breaker = BreakerConfig(
        failure_rate_threshold=50, sliding_window_size=4, minimum_number_of_calls=4,
        wait_duration_in_open_state=0.4, permitted_number_of_calls_in_half_open_state=2,
    )  # fmt: skip
    with ServerThread(target, ServerConfig(breaker=breaker)) as srv, httpx.Client(base_url=srv.url) as c:
        assert c.post("/v1/embeddings", json={"input": "ok"}).status_code == 200
        target.fail = True
        for _ in range(3):
            assert_error(c.post("/v1/embeddings", json={"input": "x"}), 500, "model_error")
        calls = target.calls
        opened = c.post("/v1/embeddings", json={"input": "x"})
        err = assert_error(opened, 503, "call_not_permitted")
        assert err["type"] == "service_unavailable_error"
        assert 1 <= int(opened.headers["retry-after"]) <= 1
        assert target.calls == calls  # rejected without touching the model
        assert_error(c.get("/readyz"), 503, "not_ready")
        assert 'mmchaos_breaker_state{name="model",state="open"} 1.0' in c.get("/metrics").text
        target.fail = False  # the model recovers
        time.sleep(0.5)
        for _ in range(2):  # the half-open trial calls succeed
            assert c.post("/v1/embeddings", json={"input": "x"}).status_code == 200
        assert srv.state.breaker.state.value == "closed"
        assert c.get("/readyz").status_code == 200
        metrics = c.get("/metrics").text
        assert 'mmchaos_breaker_transitions_total{from_state="half_open",name="model",to_state="closed"} 1.0' in metrics


def test_guards_off_serves_the_bare_target(target: ControlledTarget) -> None:
    with ServerThread(target, ServerConfig(guards=False)) as srv, httpx.Client(base_url=srv.url) as c:
        out = c.post("/v1/embeddings", json={"input": ["x", image_part(png_url(IMG))]})
        assert out.status_code == 200
        assert c.get("/v1/models").json()["data"][0]["mmchaos"]["guards"] is False
        metrics = c.get("/metrics").text
        assert 'mmchaos_preflight_inputs_total{code="ok",kind="text",name="server"} 0.0' in metrics
        assert 'mmchaos_breaker_calls_total{kind="successful",name="model"} 0.0' in metrics


# -- shutdown ----------------------------------------------------------------------------------------


def test_graceful_shutdown_finishes_every_request_in_flight(target: ControlledTarget) -> None:
    target.delay = 0.2
    srv = ServerThread(target, ServerConfig(max_concurrency=2, max_queue=8)).start()
    port = srv.port
    n = 6
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(partial_post(srv.url, {"input": [f"text {i}"]})) for i in range(n)]
        wait_until(lambda: srv.state.admission.active + len(srv.state.admission.waiters) == n)
        stopper = threading.Thread(target=srv.stop)
        stopper.start()
        wait_until(lambda: srv.state.draining)
        responses = [f.result(20) for f in futures]
        stopper.join(20)
    assert [r.status_code for r in responses] == [200] * n
    assert [r.json()["data"][0]["embedding"] for r in responses] == [
        HashEmbedTarget().embed_texts([f"text {i}"])[0].tolist() for i in range(n)
    ]
    assert 1 <= target.calls <= n  # batching: requests admitted together may share a call
    assert_closed(port)


def test_app_works_in_process_without_a_socket(target: ControlledTarget) -> None:
    from starlette.testclient import TestClient

    with TestClient(create_app(target)) as c:
        assert c.post("/v1/embeddings", json={"input": "x"}).status_code == 200


# -- helpers -------------------------------------------------------------------------------------


def partial_post(url: str, body: dict[str, Any]) -> Any:
    def post() -> httpx.Response:
        with httpx.Client(base_url=url, timeout=30.0) as c:
            return c.post("/v1/embeddings", json=body)

    return post


def breaker_count(srv: ServerThread, kind: str, family: str = "mmchaos_breaker_calls") -> float:
    return sum(v for name, labels, v in srv.state.breaker.metric_samples() if name == family and labels[1] == kind)


def wait_until(cond: Any, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def test_public_surface_and_light_imports() -> None:
    import subprocess
    import sys

    import mmchaos.server

    assert mmchaos.server.__all__ == [
        "REQUEST_ID_HEADER", "GuardedServer", "ServerConfig", "ServerThread", "contract_from_yaml", "create_app",
        "serve",
    ]  # fmt: skip
    for name in mmchaos.server.__all__:
        assert getattr(mmchaos.server, name) is not None
    # serving code that imports only the guards, or the target registry, pays for no web stack
    code = (
        "import sys, mmchaos.guard, mmchaos.targets, mmchaos.server\n"
        "from mmchaos.guard import Preflight, CircuitBreaker, DriftMonitor\n"
        "heavy = {'fastapi', 'uvicorn', 'starlette', 'httpx', 'torch'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- hardening (issue 11): memory, disconnects, slow clients, bad bodies, load gate, tracing --------


def zero_png(width: int, height: int) -> bytes:
    """An all-zero RGB PNG, built with zlib (fast at any size): what the pixel budget must not decode."""
    row = b"\x00" + b"\x00" * (3 * width)
    comp = zlib.compressobj(9)
    data = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def metric(srv: ServerThread, family: str, **labels: str) -> float:
    """One sample of the server's registry (0.0 when absent)."""
    value = srv.state.registry.get_sample_value(family, labels)
    return 0.0 if value is None else float(value)


def raw_request(port: int, head: bytes, body: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10.0)
    sock.sendall(head + body)
    return sock


def post_head(path: str, length: int, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{extra}\r\n"
    ).encode()


def test_pixel_budget_refuses_many_huge_images_before_decoding(target: ControlledTarget) -> None:
    url = "data:image/png;base64," + base64.b64encode(zero_png(5000, 5000)).decode()
    body = json.dumps({"input": [image_part(url)] * 16}).encode()
    assert len(body) < 2 * 2**20  # ~1.5 MB on the wire, 400 M pixels once decoded
    with ServerThread(target, ServerConfig()) as srv, httpx.Client(base_url=srv.url, timeout=30.0) as c:
        resp = c.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
        err = assert_error(resp, 413, "request_pixels_too_large")
        assert err["param"] == "input"
        # refused from the declared sizes: nothing was decoded, the model never ran
        assert metric(srv, "mmchaos_server_stage_seconds_count", modality="image", stage="decode") == 0
        assert metric(srv, "mmchaos_preflight_inputs_total", name="server", kind="image", code="ok") == 0
        assert target.calls == 0
        # one such image is within the per-request budget and is served
        one = c.post("/v1/embeddings", json={"input": [image_part(url)]})
        assert one.status_code == 200, one.text
        assert metric(srv, "mmchaos_preflight_inputs_total", name="server", kind="image", code="ok") == 1


def test_pixel_budget_in_flight_queues_instead_of_decoding(target: ControlledTarget) -> None:
    px = IMG.shape[0] * IMG.shape[1]
    config = ServerConfig(max_concurrency=4, max_request_pixels=px, max_inflight_pixels=px, request_timeout=20.0)
    body = {"input": [image_part(png_url(IMG))]}
    target.gate.clear()
    with ServerThread(target, config) as srv, ThreadPoolExecutor(2) as pool:
        first = pool.submit(partial_post(srv.url, body))
        assert target.entered.acquire(timeout=10.0)  # the first request holds its pixels in the model
        second = pool.submit(partial_post(srv.url, body))
        # a free slot, but no pixels: the second request waits in the queue, undecoded
        wait_until(lambda: metric(srv, "mmchaos_server_queued") == 1)
        assert metric(srv, "mmchaos_server_stage_seconds_count", modality="image", stage="decode") == 1
        target.gate.set()
        assert first.result(20.0).status_code == 200
        assert second.result(20.0).status_code == 200
    with pytest.raises(ValueError, match="max_inflight_pixels"):
        ServerConfig(max_request_pixels=10_000_000, max_inflight_pixels=1_000_000)


def test_client_disconnect_mid_upload_is_499_and_spares_the_slo(server: ServerThread) -> None:
    for _ in range(3):
        sock = raw_request(server.port, post_head("/v1/embeddings", 100_000), b'{"input": ["abc')
        sock.close()
    wait_until(lambda: metric(server, "mmchaos_server_requests_total", endpoint="/v1/embeddings", status="499") == 3)
    assert metric(server, "mmchaos_server_requests_total", endpoint="/v1/embeddings", status="500") == 0
    assert metric(server, "mmchaos_slo_errors_total", slo="server") == 0
    assert metric(server, "mmchaos_slo_requests_total", slo="server") == 0


def test_client_disconnect_cancels_work_still_waiting_for_the_model(
    server: ServerThread, client: httpx.Client, target: ControlledTarget
) -> None:
    target.gate.clear()
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(partial_post(server.url, {"input": "held"}))
        assert target.entered.acquire(timeout=10.0)
        body = json.dumps({"input": "abandoned"}).encode()
        sock = raw_request(server.port, post_head("/v1/embeddings", len(body)), body)
        wait_until(lambda: metric(server, "mmchaos_server_inflight") == 2)
        sock.close()
        wait_until(
            lambda: metric(server, "mmchaos_server_requests_total", endpoint="/v1/embeddings", status="499") == 1
        )
        target.gate.set()
        assert first.result(20.0).status_code == 200
    wait_until(lambda: server.state.outstanding == 0)
    assert target.calls == 1  # the abandoned request never reached the model
    assert metric(server, "mmchaos_slo_errors_total", slo="server") == 0


def test_slow_header_and_slow_body_connections_are_closed(target: ControlledTarget) -> None:
    config = ServerConfig(header_timeout=0.5, body_timeout=0.5)
    with ServerThread(target, config) as srv:
        slow = [raw_request(srv.port, b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n") for _ in range(4)]
        silent = socket.create_connection(("127.0.0.1", srv.port), timeout=10.0)
        for sock in [*slow, silent]:
            with sock, contextlib.suppress(ConnectionResetError):
                assert sock.recv(1024) == b""  # closed by the server, no answer
        with raw_request(srv.port, post_head("/v1/embeddings", 1000), b'{"input": "x') as sock:
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"code":"body_timeout"' in answer
        with httpx.Client(base_url=srv.url) as c:
            assert c.post("/v1/embeddings", json={"input": "still serving"}).status_code == 200


def test_operations_endpoints_and_malformed_bodies(client: httpx.Client, target: ControlledTarget) -> None:
    spec = client.get("/openapi.json").json()
    content = spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(content) == ["text/plain"]
    head = client.head("/healthz")
    assert head.status_code == 200 and head.content == b""
    assert client.head("/readyz").status_code == 200
    json_ct = {"content-type": "application/json"}
    for raw in (
        b'{"input": "\xff\xfe"}',  # not UTF-8
        b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # nested past any parser's depth
        b'{"input": "x", "dimensions": 1' + b"0" * 5000 + b"}",  # an integer of 5,000 digits
    ):
        assert_error(client.post("/v1/embeddings", content=raw, headers=json_ct), 400, "invalid_json")
    err = assert_error(client.post("/v1/embeddings", json={"input": "x", "dimensions": -1}), 400,
                       "dimensions_unsupported")  # fmt: skip
    assert err["param"] == "dimensions"
    assert target.calls == 0  # refused before the model ran


def write_model_dir(path: Any, processor_side: int) -> Any:
    path.mkdir()
    config = {"vision_config": {"image_size": 224, "patch_size": 32}, "text_config": {"vocab_size": 100}}
    (path / "config.json").write_text(json.dumps(config))
    processor = {"do_center_crop": True, "crop_size": processor_side, "size": processor_side}
    (path / "preprocessor_config.json").write_text(json.dumps(processor))
    return path


class DirTarget(HashEmbedTarget):
    """A target loaded from a model directory (``path``), as hf: and onnx: targets are."""

    uri = "hf:/models/dir-target"

    def __init__(self, path: Any) -> None:
        super().__init__()
        self.path = path
        self.calls = 0


def test_a_processor_that_does_not_belong_never_becomes_ready(tmp_path: Any) -> None:
    bad = DirTarget(write_model_dir(tmp_path / "bad", processor_side=336))
    with ServerThread(bad) as srv, httpx.Client(base_url=srv.url) as c:
        assert_error(c.get("/readyz"), 503, "model_load_mismatch")
        assert_error(c.post("/v1/embeddings", json={"input": "x"}), 503, "model_load_mismatch")
        assert metric(srv, "mmchaos_model_load_mismatch_total") == 1
        assert c.get("/healthz").status_code == 200  # alive, not ready
    good = DirTarget(write_model_dir(tmp_path / "good", processor_side=224))
    with ServerThread(good) as srv, httpx.Client(base_url=srv.url) as c:
        assert c.get("/readyz").status_code == 200
        assert metric(srv, "mmchaos_model_load_mismatch_total") == 0
    # a recorded fingerprint to serve against: another weights hash is a mismatch too
    pinned = ServerConfig(expected_fingerprint={"weights": "some-other-weights"})
    with ServerThread(ControlledTarget(), pinned) as srv, httpx.Client(base_url=srv.url) as c:
        err = assert_error(c.get("/readyz"), 503, "model_load_mismatch")
        assert "weights" in err["message"]


def test_traceparent_is_continued_and_spans_are_exported(target: ControlledTarget) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(target, ServerConfig(), tracer_provider=provider)
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url) as c:
        resp = c.post("/v1/embeddings", json={"input": "x"}, headers={"traceparent": f"00-{trace_id}-{parent}-01"})
        assert resp.status_code == 200
        version, tid, span_id, flags = resp.headers["traceparent"].split("-")
        assert (version, tid, flags) == ("00", trace_id, "01") and span_id != parent and len(span_id) == 16
        # no traceparent: a new trace starts; a malformed one is ignored, never reflected
        fresh = c.get("/healthz", headers={"traceparent": "00-zz-bad"}).headers["traceparent"]
        assert fresh.split("-")[1] not in (trace_id, "zz") and len(fresh.split("-")[1]) == 32
    provider.shutdown()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    server_span = spans["POST /v1/embeddings"]
    assert format(server_span.context.trace_id, "032x") == trace_id
    assert format(server_span.context.span_id, "016x") == span_id
    assert server_span.parent is not None and format(server_span.parent.span_id, "016x") == parent
    assert server_span.attributes["http.response.status_code"] == 200
    assert server_span.attributes["mmchaos.request_id"] == resp.headers["x-request-id"]
    # the guards' work, done in a worker thread, is part of the request's trace
    checked = spans["mmchaos.preflight.text"]
    assert checked.parent is not None and checked.parent.span_id == server_span.context.span_id


# -- vLLM interop (issue 11): model names, /health, /version, ids, token ids, max_tokens -----------


def test_model_may_be_named_by_uri_or_alias_as_vllm_accepts(target: ControlledTarget) -> None:
    config = ServerConfig(model_name="clip", model_aliases=("clip-v2", "openai/clip"))
    with ServerThread(target, config) as srv, httpx.Client(base_url=srv.url) as c:
        for name in ("clip", "clip-v2", "openai/clip", target.uri):
            resp = c.post("/v1/embeddings", json={"model": name, "input": "x"})
            assert resp.status_code == 200, (name, resp.text)
            assert resp.json()["model"] == "clip"  # answers name the served model
        assert_error(c.post("/v1/embeddings", json={"model": "gpt-4", "input": "x"}), 404, "model_not_found")
        assert_error(c.post("/v1/embeddings", json={"model": "ControlledTarget", "input": "x"}), 404,
                     "model_not_found")  # fmt: skip
        assert {m["id"] for m in c.get("/v1/models").json()["data"]} == {"clip"}


def test_vllm_health_version_and_embedding_ids(client: httpx.Client) -> None:
    health = client.get("/health")
    assert health.status_code == 200 and health.content == b""
    assert client.get("/version").json() == {"version": mmchaos.__version__}
    out = client.post("/v1/embeddings", json={"input": "x"}, headers={"x-request-id": "rq-7"}).json()
    assert out["id"] == "embd-rq-7" and isinstance(out["created"], int) and out["created"] > 1_600_000_000
    spec = client.get("/openapi.json").json()
    assert {"/health", "/version"} <= set(spec["paths"])
    assert {"id", "created"} <= set(spec["components"]["schemas"]["EmbeddingResponse"]["properties"])


def test_token_id_inputs_where_the_target_has_a_tokenizer(target: ControlledTarget) -> None:
    ref = HashEmbedTarget().embed_texts(["a red circle", "circle"])
    with ServerThread(TokenizedTarget()) as srv, httpx.Client(base_url=srv.url) as c:
        one = c.post("/v1/embeddings", json={"input": [0, 1, 2, 3, 4]})
        assert one.status_code == 200, one.text
        np.testing.assert_array_equal(np.array(one.json()["data"][0]["embedding"], np.float32), ref[0])
        two = c.post("/v1/embeddings", json={"input": [[1, 2, 3], [3]]}).json()
        np.testing.assert_array_equal(np.array([d["embedding"] for d in two["data"]], np.float32), ref)
        err = assert_error(c.post("/v1/embeddings", json={"input": [[1, 2], [1, 99]]}), 400, "invalid_token_id")
        assert err["param"] == "input[1]"
        assert_error(c.post("/v1/embeddings", json={"input": [-1]}), 400, "invalid_token_id")
    with ServerThread(target) as srv, httpx.Client(base_url=srv.url) as c:
        assert_error(c.post("/v1/embeddings", json={"input": [1, 2]}), 400, "token_ids_unsupported")


def test_chat_honours_max_tokens() -> None:
    page = png_url(np.full((20, 30, 3), 250, np.uint8))
    body = {"messages": [{"role": "user", "content": [image_part(page)] * 3}]}
    with ServerThread(ReaderTarget()) as srv, httpx.Client(base_url=srv.url) as c:
        full = c.post("/v1/chat/completions", json=body).json()
        assert full["choices"][0]["message"]["content"] == "30x20 light\n30x20 light\n30x20 light"
        assert full["choices"][0]["finish_reason"] == "stop"
        cut = c.post("/v1/chat/completions", json={**body, "max_tokens": 3}).json()
        choice = cut["choices"][0]
        assert choice["finish_reason"] == "length"
        assert choice["message"]["content"] == "30x20 light"  # 3 tokens as usage counts them
        assert cut["usage"]["completion_tokens"] == 3
        newer = c.post("/v1/chat/completions", json={**body, "max_completion_tokens": 3}).json()
        assert newer["choices"][0]["message"]["content"] == choice["message"]["content"]
        roomy = c.post("/v1/chat/completions", json={**body, "max_tokens": 1000}).json()
        assert roomy["choices"][0]["finish_reason"] == "stop"
        assert_error(c.post("/v1/chat/completions", json={**body, "max_tokens": 0}), 400, "invalid_request")


def test_tiny_clip_by_uri_and_by_its_own_token_ids() -> None:
    from mmchaos.targets import load_target

    clip = load_target("builtin:tiny-clip")
    try:
        ids = [int(i) for i in clip.tokenizer("a red circle")["input_ids"]]  # type: ignore[attr-defined]
        with ServerThread(clip) as srv, httpx.Client(base_url=srv.url, timeout=30.0) as c:
            by_text = c.post("/v1/embeddings", json={"model": "builtin:tiny-clip", "input": "a red circle"})
            assert by_text.status_code == 200, by_text.text
            by_ids = c.post("/v1/embeddings", json={"model": "tiny-clip", "input": ids})
            assert by_ids.status_code == 200, by_ids.text
            np.testing.assert_allclose(by_ids.json()["data"][0]["embedding"], by_text.json()["data"][0]["embedding"],
                                       rtol=1e-5, atol=1e-6)  # fmt: skip
            assert c.get("/readyz").status_code == 200  # its processor belongs to its weights
    finally:
        clip.close()


def test_undeclared_methods_and_bodyless_answers_match_the_schema(client: httpx.Client) -> None:
    # found by schemathesis against /openapi.json
    assert_error(client.post("/v1/models"), 405, "method_not_allowed")  # not 415: no POST is documented there
    refused = client.request("OPTIONS", "/healthz")
    assert refused.status_code == 405 and "GET" in refused.headers["allow"]
    spec = client.get("/openapi.json").json()
    assert spec["paths"]["/health"]["get"]["responses"]["200"].get("content", {}) == {}


def test_otlp_export_without_the_exporter_is_a_clear_error(target: ControlledTarget) -> None:
    import importlib.util

    from mmchaos.errors import MissingDependencyError

    if importlib.util.find_spec("opentelemetry.exporter") is not None:
        pytest.skip("the OTLP exporter is installed here")
    with pytest.raises(MissingDependencyError, match="opentelemetry-exporter-otlp-proto-http"):
        create_app(target, ServerConfig(otlp_endpoint="http://127.0.0.1:4318/v1/traces"))


def test_timed_out_work_never_reaches_the_model(target: ControlledTarget) -> None:
    target.gate.clear()
    config = ServerConfig(max_concurrency=2, request_timeout=0.5)
    with ServerThread(target, config) as srv, ThreadPoolExecutor(1) as pool:
        first = pool.submit(partial_post(srv.url, {"input": "held"}))
        assert target.entered.acquire(timeout=10.0)
        with httpx.Client(base_url=srv.url, timeout=10.0) as c:
            # decoded, then waits for the model lock behind the first request, and times out there
            assert_error(c.post("/v1/embeddings", json={"input": "late"}), 504, "request_timeout")
        target.gate.set()
        assert first.result(20.0).status_code == 504  # it timed out too, inside the model
        wait_until(lambda: srv.state.outstanding == 0)
    assert target.calls == 1  # the late request's work was cancelled before its model call


def test_a_generative_card_states_max_model_len_as_vllm_does() -> None:
    """What a gateway that strips the mmchaos block keeps: long_context_recall and context_boundary
    read the limit from it over openai:."""
    from tests.fakes.generative import WordsTarget

    words = WordsTarget()
    words.context_tokens = 512  # type: ignore[attr-defined]
    with ServerThread(words) as srv, httpx.Client(base_url=srv.url, trust_env=False) as c:
        card = c.get("/v1/models").json()["data"][0]
    assert card["max_model_len"] == 512
