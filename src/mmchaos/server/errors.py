"""What a request can fail with, as domain errors: the server's code raises these (and the
library's own errors) and never an HTTP answer; :mod:`.http_errors` alone turns them into one.

    MMChaosError
    ├── ServerError       the server refuses or cannot answer (admission, limits, the request's fields)
    ├── BadModelOutput    the model answered with something that cannot be served (NaN, wrong shape)
    └── ModelFailure      the model raised an exception that is not an mmchaos error
    RequestCancelled      work stopped because nobody waits for its answer (not an error of anyone's)

No web framework is imported here: admission, inputs and the worker code raise these without
FastAPI.
"""

from __future__ import annotations

import logging
from typing import Literal

from mmchaos.errors import MMChaosError

__all__ = ["BadModelOutput", "ModelFailure", "Origin", "RequestCancelled", "ServerError", "as_domain"]

log = logging.getLogger("mmchaos.server")

#: Who refused, where that and not the code decides the HTTP status: ``server`` (the code's
#: status, from :data:`mmchaos.error_codes.CODES`), ``request`` (the request's content, as the
#: target's own decoder or parameter check read it: the code's status, 400 where that is not a 4xx),
#: ``framework`` (FastAPI's own refusal: the status it chose). See :func:`mmchaos.server.http_errors.http_status`.
Origin = Literal["server", "request", "framework"]


class ServerError(MMChaosError):
    """The server refuses or cannot answer a request; ``code`` is stable and decides the HTTP status.

    ``param`` names the request field at fault; ``retry_after`` (whole seconds) becomes a
    Retry-After header; ``headers`` carries any other header the answer needs (``Connection:
    close`` after a body timeout, Starlette's ``Allow``); ``origin``: see :data:`Origin`.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str,
        param: str | None = None,
        retry_after: int | None = None,
        headers: dict[str, str] | None = None,
        origin: Origin = "server",
    ) -> None:
        super().__init__(message, code=code)
        self.param = param
        self.retry_after = retry_after
        self.headers = dict(headers or {})
        self.origin: Origin = origin


class BadModelOutput(MMChaosError):
    """The target answered with something that cannot be served (NaN, wrong shape): a model failure."""


class ModelFailure(MMChaosError):
    """The model raised ``cause``, an exception that is not an mmchaos error."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"the model raised {type(cause).__name__}: {str(cause)[:300]}", code="model_error")
        self.cause = cause


class RequestCancelled(Exception):
    """Work stopped because its client timed out or went away; nobody waits for its answer."""


def as_domain(exc: Exception) -> MMChaosError:
    """``exc`` when it is an mmchaos error, else a :class:`ModelFailure` for it (logged with its traceback)."""
    if isinstance(exc, MMChaosError):
        return exc
    log.warning("model call failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
    return ModelFailure(exc)
