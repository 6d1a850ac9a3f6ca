"""Errors to HTTP answers, in one place: every refusal or failure of the server becomes an
OpenAI-style body (``{"error": {"message", "type", "param", "code"}}``) with the status of its
stable code, here and nowhere else (as vLLM's ``create_error_response`` and httpx's
``map_exceptions`` do).

The rest of the server raises domain errors (:mod:`.errors`, the guards' ``PreflightError`` and
``CallNotPermitted``, the targets' ``TargetCallError`` and ``CapabilityError``);
:func:`to_answer` maps any of them, and FastAPI's own refusals, to an :class:`ErrorAnswer`;
:func:`http_status` is the one function that chooses a status.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from mmchaos.error_codes import status_of
from mmchaos.errors import MMChaosError
from mmchaos.guard.breaker import CallNotPermitted
from mmchaos.server.errors import Origin, ServerError, as_domain
from mmchaos.server.metrics import ServerMetrics
from mmchaos.server.protocol import ErrorBody

__all__ = ["CLIENT_CLOSED", "ERROR_RESPONSES", "ErrorAnswer", "http_status", "install", "to_answer"]

#: The status recorded for a request whose client left before its answer (nginx's 499).
CLIENT_CLOSED = 499


def http_status(code: str, origin: Origin = "server", fallback: int = 500) -> int:
    """The HTTP status an error code is answered with: the one place the server chooses one.

    A code's status is its entry in the one table, :data:`mmchaos.error_codes.CODES`; ``fallback``
    answers a code the table lacks (a plugin's, a remote endpoint's passed through: the status of
    its exception class). A refusal of the request's content by the target's own decoder or
    parameter check (``origin="request"``: the guards-off image decoder, GenerationParams) answers
    its code's status too (an image past the element-count limit is 413 with guards on or off);
    only a code whose status is not a client error (a generic ``target_call_failed``) becomes 400
    there, since the request's content, not the server, was at fault. The HTTP framework's own
    refusals (``origin="framework"``: routing, the body parser) keep the status it chose, ``fallback``.
    """
    if origin == "request":
        status = status_of(code, 400)
        return status if 400 <= status < 500 else 400
    if origin == "framework":
        return fallback
    return status_of(code, fallback)


def _type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    if status == 503:
        return "service_unavailable_error"
    if status in (408, 504):
        return "timeout_error"
    return "server_error" if status >= 500 else "invalid_request_error"


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """An answer other than 200: its status, the OpenAI-style body's fields, and its headers."""

    status: int
    code: str
    message: str
    param: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def type(self) -> str:
        return _type(self.status)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=dict(self.headers))

    def event(self) -> bytes:
        """The answer as one server-sent event (an error after a stream's first byte)."""
        return b"data: " + json.dumps(self.body(), separators=(",", ":")).encode() + b"\n\n"

    def count(self, metrics: ServerMetrics) -> ErrorAnswer:
        """Count the answer under its code and status; the answer itself."""
        metrics.errors.labels(self.code, str(self.status)).inc()
        return self


def _answer(code: str, message: str, origin: Origin = "server", fallback: int = 500, **extra: Any) -> ErrorAnswer:
    return ErrorAnswer(http_status(code, origin, fallback), code, message, **extra)


def _validation(exc: RequestValidationError) -> ErrorAnswer:
    """A schema refusal: ``invalid_json`` for a body that is not JSON, else ``invalid_request``."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return _answer(code="invalid_json", message="the request body is not valid JSON")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return _answer(code="invalid_request", message="; ".join(parts) + more, param=".".join(loc) or None)


def _starlette(exc: StarletteHTTPException) -> ErrorAnswer:
    """Starlette's own refusals: routing (404, 405 with its Allow header) and the body parser."""
    headers = dict(exc.headers or {})
    if exc.status_code == 400 and isinstance(exc.__cause__, ValueError | RecursionError):
        # FastAPI's body parser: bad UTF-8, nesting past the parser's depth, an integer of more
        # digits than Python converts. All are a body that is not (usable) JSON.
        message = "the request body is not valid JSON (bad UTF-8, too deeply nested, or a number too large)"
        return _answer(code="invalid_json", message=message)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return _answer(code, str(exc.detail), "framework", exc.status_code, headers=headers)


def to_answer(exc: Exception) -> ErrorAnswer:
    """The HTTP answer to an exception raised while taking or running a request."""
    if isinstance(exc, RequestValidationError):
        return _validation(exc)
    if isinstance(exc, StarletteHTTPException):
        return _starlette(exc)
    err = as_domain(exc)
    headers: dict[str, str] = {}
    if isinstance(err, ServerError):
        headers.update(err.headers)
        if err.retry_after is not None:
            headers["Retry-After"] = str(err.retry_after)
        return _answer(err.code, err.message, err.origin, param=err.param, headers=headers)
    if isinstance(err, CallNotPermitted):
        headers["Retry-After"] = str(max(1, math.ceil(err.retry_after or 1.0)))
    # a guard's, a target's or the model's error: its code's status, else its class's
    return _answer(err.code, err.message, fallback=err.http_status, headers=headers)


def install(app: FastAPI, metrics: ServerMetrics) -> None:
    """Answer every domain error and every FastAPI refusal raised in ``app``'s endpoints, counted."""

    async def answer(request: Request, exc: Exception) -> Response:
        return to_answer(exc).count(metrics).response()

    for kind in (MMChaosError, RequestValidationError, StarletteHTTPException):
        app.add_exception_handler(kind, answer)


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": what}
    for status, what in (
        (400, "malformed input (bad JSON, corrupt image, invalid UTF-8, ...)"),
        (401, "missing or wrong API key"),
        (404, "unknown model"),
        (413, "too large (body, image pixels, element count, text, tokens, inputs)"),
        (415, "unsupported content type, image format or mode"),
        (422, "well-formed but unprocessable input (too small, animated, refused by the model)"),
        (408, "the request body did not arrive in time"),
        (429, "queue full (Retry-After)"),
        (500, "the model failed or returned NaN"),
        (503, "circuit breaker open (Retry-After), or the model failed its load check"),
        (504, "request timeout"),
    )
}
"""The error answers of the ``/v1`` endpoints, for the OpenAPI schema."""
