"""Fuzzing the server's request bodies: no client-side fault may ever get a 5xx.

Bodies come from the server's own OpenAPI schema (a small JSON-schema-to-Hypothesis translator,
with mutations that break it: wrong types, missing and extra keys), from arbitrary JSON, and from
raw bytes; images are valid PNGs, byte-flipped or truncated PNGs and garbage, as data URLs.
The target is correct, so any 5xx is the server's own bug. Every answer must be a 200 of the right
shape or an OpenAI error body with a stable code.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from mmchaos.server import ServerConfig, ServerThread
from mmchaos.targets.base import Capability
from tests.fakes.targets import HashEmbedTarget

pytestmark = pytest.mark.integration

FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _png(side_w: int, side_h: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(side_w * 31 + side_h).integers(0, 255, (side_h, side_w, 3), np.uint8)).save(
        buf, "PNG"
    )
    return buf.getvalue()


BASE_PNG = _png(24, 24)


@st.composite
def image_bytes(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["valid", "flipped", "truncated", "garbage", "sized"]))
    if kind == "valid":
        return BASE_PNG
    if kind == "sized":
        return _png(draw(st.integers(1, 40)), draw(st.integers(1, 40)))
    if kind == "garbage":
        return draw(st.binary(max_size=64))
    data = bytearray(BASE_PNG)
    if kind == "truncated":
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    for _ in range(draw(st.integers(1, 8))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@st.composite
def image_urls(draw: st.DrawFn) -> str:
    blob = draw(image_bytes())
    form = draw(st.sampled_from(["png", "octet", "nobase64", "http", "badb64"]))
    b64 = base64.b64encode(blob).decode()
    if form == "png":
        return f"data:image/png;base64,{b64}"
    if form == "octet":
        return f"data:application/octet-stream;base64,{b64}"
    if form == "nobase64":
        return "data:image/png," + draw(st.text(max_size=20))
    if form == "http":
        return "http://127.0.0.1:1/x.png"
    return f"data:image/png;base64,{b64[:-1]}!"


def texts() -> st.SearchStrategy[str]:
    return st.one_of(st.text(max_size=40), st.sampled_from(["", " ", "\ud800", "a\x00b", "\U0001f600" * 3]))


def json_values() -> st.SearchStrategy[Any]:
    leaves = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), texts())
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts(), inner, max_size=4),
                        max_leaves=12)  # fmt: skip


class EmbedAndReadTarget(HashEmbedTarget):
    """Correct embeddings, and a 'reader' that names each image's size: every endpoint is live."""

    capabilities = frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT, Capability.READ_TEXT})

    def read_text(self, images: Any) -> list[str]:
        return [f"{i.shape[1]}x{i.shape[0]}" for i in images]


MODEL = "fuzz"


class SchemaStrategies:
    """Hypothesis strategies for the JSON-schema subset FastAPI writes into its OpenAPI document."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.components = spec["components"]["schemas"]
        # Properties whose values matter for getting past the first checks.
        self.overrides: dict[str, st.SearchStrategy[Any]] = {
            "model": st.sampled_from([MODEL, MODEL, "other-model"]),
            "role": st.sampled_from(["user", "system", "assistant"]),
        }

    def of(self, schema: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
        if "$ref" in schema:
            return st.deferred(lambda: self.of(self.components[schema["$ref"].split("/")[-1]], depth + 1))
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return st.one_of([self.of(s, depth + 1) for s in schema[key]])
        if "const" in schema:
            return st.just(schema["const"])
        if "enum" in schema:
            return st.sampled_from(schema["enum"])
        kind = schema.get("type")
        if kind == "object" or "properties" in schema:
            return self._object(schema, depth)
        if kind == "array":
            items = self.of(schema.get("items", {}), depth + 1)
            return st.lists(items, min_size=schema.get("minItems", 0), max_size=4 if depth < 4 else 1)
        if kind == "string":
            if schema.get("title") == "Url" or "data: URL" in schema.get("description", ""):
                return image_urls()
            return texts()
        if kind == "integer":
            return st.integers(-5, 70)
        if kind == "number":
            return st.floats(allow_nan=False, allow_infinity=False)
        if kind == "boolean":
            return st.booleans()
        if kind == "null":
            return st.none()
        return json_values()

    def _object(self, schema: dict[str, Any], depth: int) -> st.SearchStrategy[dict[str, Any]]:
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        fields = {k: self.overrides[k] if k in self.overrides else self.of(v, depth + 1) for k, v in props.items()}
        return st.fixed_dictionaries(
            {k: s for k, s in fields.items() if k in required},
            optional={k: s for k, s in fields.items() if k not in required},
        )


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[Any]) -> Any:
    body = draw(valid)
    if not isinstance(body, dict) or draw(st.booleans()):
        return body
    body = dict(body)
    action = draw(st.sampled_from(["drop", "retype", "extra"]))
    if action == "drop" and body:
        body.pop(draw(st.sampled_from(sorted(body))))
    elif action == "retype" and body:
        body[draw(st.sampled_from(sorted(body)))] = draw(json_values())
    else:
        body[draw(texts())] = draw(json_values())
    return body


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    config = ServerConfig(max_concurrency=2, max_queue=256, max_body_bytes=1 << 20, max_items=16, model_name=MODEL)
    with ServerThread(EmbedAndReadTarget(), config) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30.0) as c:
        yield c


@pytest.fixture(scope="module")
def strategies(client: httpx.Client) -> SchemaStrategies:
    return SchemaStrategies(client.get("/openapi.json").json())


def body_schema(client: httpx.Client, path: str) -> dict[str, Any]:
    spec = client.get("/openapi.json").json()
    schema: dict[str, Any] = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return schema


def check_answer(resp: httpx.Response, path: str) -> None:
    assert resp.status_code < 500, f"{resp.status_code} {resp.text[:500]}"
    assert resp.headers.get("x-request-id")
    body = resp.json()
    if resp.status_code == 200:
        assert body["object"] == ("list" if path == "/v1/embeddings" else "chat.completion")
        if path == "/v1/embeddings":
            for item in body["data"]:
                emb = item["embedding"]
                vec = np.frombuffer(base64.b64decode(emb), "<f4") if isinstance(emb, str) else np.asarray(emb)
                assert vec.shape == (32,) and np.isfinite(vec).all()
        return
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["code"], str) and err["code"] and isinstance(err["message"], str)


def post(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    content = json.dumps(body).encode()  # ASCII escapes, so lone surrogates travel too
    return client.post(path, content=content, headers={"content-type": "application/json"})


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v1/chat/completions"])
def test_schema_driven_bodies_never_get_5xx(client: httpx.Client, strategies: SchemaStrategies, path: str) -> None:
    valid = strategies.of(body_schema(client, path))

    @FUZZ
    @given(body=mutated(valid))
    def run(body: Any) -> None:
        check_answer(post(client, path, body), path)

    run()


def test_embedding_inputs_never_get_5xx(client: httpx.Client) -> None:
    image = image_urls().map(lambda u: {"type": "image_url", "image_url": {"url": u}})
    item = st.one_of(image, image, image, texts())
    bodies = st.fixed_dictionaries(
        {
            "input": st.one_of(
                st.lists(item, min_size=1, max_size=4),
                st.lists(image, min_size=1, max_size=2),
                st.lists(st.one_of(item, json_values()), max_size=3),
                texts(),
            )
        },
        optional={"encoding_format": st.sampled_from(["float", "base64", "hex"]), "model": st.just(MODEL)},
    )

    @FUZZ
    @given(body=bodies)
    def run(body: Any) -> None:
        check_answer(post(client, "/v1/embeddings", body), "/v1/embeddings")

    run()


def test_raw_bodies_and_content_types_never_get_5xx(client: httpx.Client) -> None:
    @FUZZ
    @given(
        raw=st.one_of(st.binary(max_size=200), json_values().map(lambda v: json.dumps(v).encode())),
        ctype=st.sampled_from(["application/json", "text/plain", "", "application/json; charset=latin-1"]),
        path=st.sampled_from(["/v1/embeddings", "/v1/chat/completions", "/v1/models", "/v1/nope"]),
    )
    def run(raw: bytes, ctype: str, path: str) -> None:
        headers = {"content-type": ctype} if ctype else {}
        resp = client.post(path, content=raw, headers=headers)
        assert resp.status_code < 500, f"{resp.status_code} {resp.text[:300]}"
        assert "error" in resp.json() or resp.status_code == 200

    run()


def test_server_still_serves_after_the_fuzzing(client: httpx.Client, server: ServerThread) -> None:
    resp = client.post("/v1/embeddings", json={"input": ["still alive"]})
    assert resp.status_code == 200
    assert server.state.breaker.state.value == "closed"
