"""The reference server: an OpenAI-compatible FastAPI app over an in-process target, guards on the path.

The parts, as in vLLM's entrypoint: :mod:`.engine` (the target, its guards and the worker pool),
:mod:`.admission` (slots and the queue), :mod:`.middleware` (request ids, body limits, request
metrics), :mod:`.handlers` (the endpoints), :mod:`.errors` (stable error bodies) and
:mod:`.protocol` (the request and response schemas). This module wires them into one app.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from mmchaos import __version__
from mmchaos.server.config import ServerConfig
from mmchaos.server.engine import GuardedServer, served_model_name
from mmchaos.server.errors import HTTPError, validation_error
from mmchaos.server.handlers import router
from mmchaos.server.middleware import REQUEST_ID_HEADER, RequestEdge
from mmchaos.targets.base import Target

__all__ = ["REQUEST_ID_HEADER", "GuardedServer", "create_app", "served_model_name"]


def create_app(target: Target, config: ServerConfig | None = None, *, tracer_provider: Any = None) -> FastAPI:
    """An OpenAI-compatible app serving ``target`` with the guards of ``config`` on the request path.

    The caller owns ``target`` (and closes it). The app's :class:`GuardedServer` is
    ``app.state.mmchaos``; its Prometheus registry is ``app.state.mmchaos.registry``.
    ``tracer_provider``: an OpenTelemetry tracer provider for the request spans (default: one
    exporting to ``config.otlp_endpoint`` when set, else OpenTelemetry's global provider).
    """
    server = GuardedServer(target, config, tracer_provider=tracer_provider)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        server.startup()
        try:
            yield
        finally:
            # uvicorn has answered every request by now; calls that outlived theirs (a 504) get a
            # bounded while to finish, so a hung model cannot hold the shutdown forever.
            drained = await server.drain(server.config.request_timeout + 5.0)
            await asyncio.get_running_loop().run_in_executor(None, partial(server.shutdown, wait=drained))

    app = FastAPI(
        title="mmchaos reference server",
        version=__version__,
        summary=f"{server.model_name} ({target.uri}) behind mmchaos guards",
        description=(
            "OpenAI-compatible embeddings and chat completions over an in-process target. Images are "
            '`image_url` content parts holding `data:` URLs. Errors are `{"error": {"message", "type", '
            '"param", "code"}}` with a stable `code`.'
        ),
        lifespan=lifespan,
    )
    app.state.mmchaos = server
    app.add_middleware(RequestEdge, server=server)
    app.include_router(router)

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError) -> Response:
        server.metrics.errors.labels(exc.code, str(exc.status)).inc()
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return await _http_error(request, validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _starlette(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        if exc.status_code == 400 and isinstance(exc.__cause__, ValueError | RecursionError):
            # FastAPI's body parser: bad UTF-8, nesting past the parser's depth, an integer of
            # more digits than Python converts. All are a body that is not (usable) JSON.
            code = "invalid_json"
            exc = StarletteHTTPException(400, "the request body is not valid JSON (bad UTF-8, too deeply nested, "
                                          "or a number too large)")  # fmt: skip
        err = HTTPError(exc.status_code, code, str(exc.detail), headers=dict(exc.headers or {}))
        return await _http_error(request, err)

    return app
