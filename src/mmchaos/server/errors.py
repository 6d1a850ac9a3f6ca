"""The server's error answers: :class:`HTTPError` (an OpenAI-style body with a stable ``code``),
and the mapping from library exceptions and validation errors to it."""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from mmchaos.errors import CapabilityError, MMChaosError, TargetCallError
from mmchaos.guard.breaker import CallNotPermitted
from mmchaos.guard.preflight import PreflightError
from mmchaos.server.protocol import ErrorBody
from mmchaos.targets.generation import TARGET_FAULT_CODES

__all__ = [
    "CLIENT_CLOSED",
    "ERROR_RESPONSES",
    "BadModelOutput",
    "HTTPError",
    "RequestCancelled",
    "to_http_error",
    "validation_error",
]

#: The status recorded for a request whose client left before its answer (nginx's 499).
CLIENT_CLOSED = 499

log = logging.getLogger("mmchaos.server")


class HTTPError(Exception):
    """An answer other than 200, with an OpenAI-style body. Internal to the server."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.headers = headers or {}

    @property
    def type(self) -> str:
        if self.status == 401:
            return "authentication_error"
        if self.status == 429:
            return "rate_limit_error"
        if self.status == 503:
            return "service_unavailable_error"
        if self.status in (408, 504):
            return "timeout_error"
        return "server_error" if self.status >= 500 else "invalid_request_error"

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


class BadModelOutput(Exception):
    """The target answered with something that cannot be served (NaN, wrong shape): a model failure."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class RequestCancelled(Exception):
    """Work stopped because its client timed out or went away; nobody waits for its answer."""


def to_http_error(exc: BaseException) -> HTTPError:
    """The answer to an exception raised while running a request's work."""
    if isinstance(exc, HTTPError):
        return exc
    if isinstance(exc, PreflightError):
        return HTTPError(exc.http_status, exc.code, exc.message)
    if isinstance(exc, CallNotPermitted):
        wait = max(1, math.ceil(exc.retry_after or 1.0))
        return HTTPError(503, exc.code, exc.message, headers={"Retry-After": str(wait)})
    if isinstance(exc, CapabilityError):
        return HTTPError(400, exc.code, exc.message)
    if isinstance(exc, TargetCallError):  # the model refused this input, or failed on it itself
        return HTTPError(500 if exc.code in TARGET_FAULT_CODES else 422, exc.code, exc.message)
    if isinstance(exc, BadModelOutput):
        return HTTPError(500, exc.code, str(exc))
    if isinstance(exc, MMChaosError):
        return HTTPError(500, exc.code, exc.message)
    log.warning("model call failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
    return HTTPError(500, "model_error", f"the model raised {type(exc).__name__}: {str(exc)[:300]}")


def validation_error(exc: RequestValidationError) -> HTTPError:
    """A schema refusal: ``invalid_json`` for a body that is not JSON, else ``invalid_request``."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return HTTPError(400, "invalid_json", "the request body is not valid JSON")
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return HTTPError(400, "invalid_request", "; ".join(parts) + more, param=param)


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
