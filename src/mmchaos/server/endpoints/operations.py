"""The operations probes: liveness (``/healthz``), readiness (``/readyz``), vLLM's ``/health`` and
``/version``, and the Prometheus ``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from mmchaos import __version__
from mmchaos.server.errors import ServerError
from mmchaos.server.protocol import ErrorBody
from mmchaos.server.respond import json_response, server_of

__all__ = ["router"]

router = APIRouter()


@router.head("/healthz", include_in_schema=False)
@router.get("/healthz", tags=["operations"])  # registered first: a 405 here says Allow: GET
async def healthz() -> Response:
    """Liveness: 200 while the event loop answers (also to HEAD)."""
    return json_response({"status": "ok"})


_EMPTY_200: dict[int | str, dict[str, Any]] = {200: {"description": "healthy (no body)", "content": {}}}


@router.get(
    "/health", tags=["operations"], response_class=Response, responses={**_EMPTY_200, 503: {"model": ErrorBody}}
)
async def health(request: Request) -> Response:
    """vLLM's health probe: 200 with no body while the server runs a model that passed its load
    check, else 503."""
    server = server_of(request)
    ok, why, code = server.readiness()
    if (not ok and code == "model_load_mismatch") or not server.running:
        raise ServerError(why, code=code)
    return Response(status_code=200)


@router.get("/version", tags=["operations"])
async def version() -> Response:
    """vLLM's version endpoint: the mmchaos version serving."""
    return json_response({"version": __version__})


@router.head("/readyz", include_in_schema=False)
@router.get("/readyz", tags=["operations"], responses={503: {"model": ErrorBody}})
async def readyz(request: Request) -> Response:
    """Readiness: 503 while starting, draining for shutdown, with the breaker open (``not_ready``),
    or for good when the model failed its load check (``model_load_mismatch``)."""
    server = server_of(request)
    ok, why, code = server.readiness()
    server.metrics.ready.set(1.0 if ok else 0.0)
    if ok:
        return json_response({"status": "ready", "model": server.model_name})
    raise ServerError(why, code=code)


_METRICS_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Prometheus text exposition format 0.0.4",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}


@router.get("/metrics", tags=["operations"], response_class=PlainTextResponse, responses=_METRICS_DOC)
async def metrics(request: Request) -> Response:
    """Prometheus text format: requests, per-modality stage latencies and every guard's metrics."""
    return Response(generate_latest(server_of(request).registry), media_type=CONTENT_TYPE_LATEST)
