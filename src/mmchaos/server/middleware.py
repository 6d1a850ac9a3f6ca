"""The ASGI edge of every request: request ids and W3C trace context, API keys, content type, body
size and body-read timeout, and the request metrics and SLO events (timed here, so every answer
counts, refusals included). A client that leaves before its answer is counted under status 499
(nginx's "client closed request"), never as a server error, and is no SLO event."""

from __future__ import annotations

import asyncio
import re
import time
import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mmchaos.server.core import GuardedServer
from mmchaos.server.errors import ServerError
from mmchaos.server.http_errors import CLIENT_CLOSED, to_answer
from mmchaos.server.tracing import TRACEPARENT_HEADER, parse_traceparent

__all__ = ["ENDPOINTS", "POST_ENDPOINTS", "REQUEST_ID_HEADER", "RequestEdge"]

REQUEST_ID_HEADER = "x-request-id"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")
_JSON_TYPES = ("application/json", "application/vnd.openai+json")
#: The paths that take a JSON body; a POST elsewhere is the router's 404 or 405, unread.
POST_ENDPOINTS = frozenset({"/v1/embeddings", "/v1/chat/completions"})
ENDPOINTS = frozenset(
    {
        "/v1/embeddings", "/v1/chat/completions", "/v1/models", "/healthz", "/readyz", "/metrics", "/openapi.json",
        "/health", "/version",
    }
)  # fmt: skip


class RequestEdge:
    """ASGI middleware: request ids, API keys, content type and body size, request metrics and SLO."""

    def __init__(self, app: ASGIApp, server: GuardedServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        srv = self.server
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        given = headers.get(REQUEST_ID_HEADER, "")
        rid = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        path: str = scope.get("path", "")
        method: str = scope.get("method", "GET")
        endpoint = path if path in ENDPOINTS else "other"
        start = time.perf_counter()
        status = [500]
        parent = parse_traceparent(headers.get(TRACEPARENT_HEADER))
        attributes = {"http.request.method": method, "url.path": path, "mmchaos.request_id": rid}
        with srv.tracer.span(f"{method} {endpoint}", parent, attributes) as (trace, span):

            async def send_with_ids(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status[0] = int(message["status"])
                    out = MutableHeaders(scope=message)
                    out[REQUEST_ID_HEADER] = rid
                    out[TRACEPARENT_HEADER] = trace.header()
                await send(message)

            try:
                await self._handle(scope, receive, send_with_ids, headers, path, status)
            finally:
                # A stream whose client left mid-way started as 200; it counts as the client's 499.
                code = CLIENT_CLOSED if scope["state"].get("client_closed") else status[0]
                elapsed = time.perf_counter() - start
                srv.metrics.requests.labels(endpoint, str(code)).inc()
                srv.metrics.seconds.labels(endpoint).observe(elapsed)
                # A client that left (499) is not an error of the service: no SLO event either way.
                if srv.guards and path.startswith("/v1/") and endpoint != "other" and code != CLIENT_CLOSED:
                    srv.slo.record(code < 500, elapsed)
                if span is not None:
                    span.set_attribute("http.response.status_code", code)

    async def _handle(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], path: str, status: list[int]
    ) -> None:
        refusal = self._refuse(scope, headers, path)
        body: bytes | None = None
        if refusal is None and scope.get("method") == "POST" and path in POST_ENDPOINTS:
            body, refusal = await self._read_body(receive, headers)
            if body is None and refusal is None:
                status[0] = CLIENT_CLOSED  # the client went away mid-upload: nobody to answer
                return
        if refusal is not None:
            await to_answer(refusal).count(self.server.metrics).response()(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive) if body is not None else receive, send)

    def _refuse(self, scope: Scope, headers: dict[str, str], path: str) -> ServerError | None:
        srv = self.server
        if srv.api_keys and path.startswith("/v1/"):
            auth = headers.get("authorization", "")
            scheme, _, key = auth.partition(" ")
            matches = srv.key_matches(key.strip())  # compared whatever the scheme: no early answer
            if not matches or scheme.lower() != "bearer":
                return ServerError("a valid API key is required (Authorization: Bearer ...)", code="invalid_api_key")
        if scope.get("method") == "POST" and path in POST_ENDPOINTS:
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype not in _JSON_TYPES:
                return ServerError(
                    f"the body must be application/json, got {ctype or 'no content type'}",
                    code="unsupported_media_type",
                )
        return None

    async def _read_body(self, receive: Receive, headers: dict[str, str]) -> tuple[bytes | None, ServerError | None]:
        limit = self.server.config.max_body_bytes
        too_big = ServerError(f"the request body is over {limit} bytes", code="payload_too_large")
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return b"", too_big
        chunks: list[bytes] = []
        size = 0
        timeout = self.server.config.body_timeout
        try:
            async with asyncio.timeout(timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None, None
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        return b"", too_big
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks), None
        except TimeoutError:
            slow = f"the request body did not arrive within {timeout:g}s"
            return b"", ServerError(slow, code="body_timeout", headers={"Connection": "close"})


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
