"""Small pieces every endpoint uses: its server, strict JSON answers, the client-disconnect watch,
and the line between an mmchaos error and a model that raised."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response

from mmchaos.server.core import GuardedServer
from mmchaos.server.errors import as_domain

__all__ = ["disconnected", "guarded", "json_response", "server_of"]

T = TypeVar("T")


def server_of(request: Request) -> GuardedServer:
    """The app's one :class:`GuardedServer` (the routers hold no state)."""
    server: GuardedServer = request.app.state.mmchaos
    return server


def json_response(payload: Any, status: int = 200) -> Response:
    """Strict JSON (no NaN), compact."""
    body = json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()
    return Response(body, status_code=status, media_type="application/json")


async def disconnected(request: Request) -> None:
    """Complete when the client goes away (the body was read already: only ``http.disconnect`` is left)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def guarded(work: Callable[[], Awaitable[T]]) -> T:
    """``await work()``; an exception from it that is not an mmchaos error becomes the model's
    failure (``model_error``), answered as such rather than as a crash of the server."""
    try:
        return await work()
    except Exception as exc:
        err = as_domain(exc)
        if err is exc:
            raise
        raise err from exc
