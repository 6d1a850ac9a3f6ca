"""The reference server: an OpenAI-compatible FastAPI app over an in-process target, guards on the path.

The parts, as in vLLM's entrypoint: :mod:`.core` (the target, its guards, the pixel budget and
the load gate) over :mod:`.work` (admission, the worker pool, the request timeout) and
:mod:`.model` (the model lock, the breaker, decoding); :mod:`.middleware` (request ids, body
limits, request metrics); :mod:`.endpoints` (one module per endpoint); :mod:`.errors` (the domain
errors everything raises) and :mod:`.http_errors` (the one place they become HTTP answers);
:mod:`.protocol` (the request and response schemas). This module wires them into one app.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from fastapi import FastAPI

from mmchaos import __version__
from mmchaos.server.config import ServerConfig
from mmchaos.server.core import GuardedServer, served_model_name
from mmchaos.server.endpoints import ROUTERS
from mmchaos.server.http_errors import install as install_error_answers
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
    for router in ROUTERS:
        app.include_router(router)
    install_error_answers(app, server.metrics)
    return app
