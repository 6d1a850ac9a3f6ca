"""The endpoints, one module each, over the shared core (:class:`~mmchaos.server.core.GuardedServer`).

Each module is an ``APIRouter`` whose handlers find the server on ``request.app.state.mmchaos``
and raise domain errors (:mod:`mmchaos.server.errors`), never HTTP answers:
:mod:`mmchaos.server.http_errors` turns them into one. :data:`ROUTERS` is what the app includes,
in the order of the OpenAPI schema.
"""

from __future__ import annotations

from fastapi import APIRouter

from mmchaos.server.endpoints import chat, embeddings, models, operations

__all__ = ["ROUTERS"]

ROUTERS: tuple[APIRouter, ...] = (embeddings.router, chat.router, models.router, operations.router)
