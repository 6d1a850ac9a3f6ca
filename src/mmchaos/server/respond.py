"""Small pieces every endpoint uses: strict JSON answers, the client-disconnect watch, the error mapping."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response

from mmchaos.server.errors import HTTPError, to_http_error

__all__ = ["disconnected", "guarded", "json_response"]

T = TypeVar("T")


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
    """``await work()``, every exception turned into the HTTP answer it stands for."""
    try:
        return await work()
    except HTTPError:
        raise
    except Exception as exc:
        raise to_http_error(exc) from exc
