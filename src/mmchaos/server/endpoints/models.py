"""``GET /v1/models``: the one served model, with the target's URI, capabilities, fingerprint and
input limits (batch size, context limits) under ``mmchaos``."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from mmchaos import __version__
from mmchaos.server.core import GuardedServer
from mmchaos.server.protocol import ModelList
from mmchaos.server.respond import json_response, server_of
from mmchaos.targets.base import Capability

__all__ = ["model_card", "router"]

_SERVED_CAPABILITIES = frozenset(
    {Capability.EMBED_IMAGE, Capability.EMBED_TEXT, Capability.READ_TEXT, Capability.GENERATE}
)

router = APIRouter()


def model_card(server: GuardedServer) -> dict[str, Any]:
    """OpenAI's model object, plus what mmchaos knows of the target (its fingerprint hashes files)."""
    caps = sorted(c.value for c in server.target.capabilities if c in _SERVED_CAPABILITIES)
    positions = _limit(server, "context_tokens")
    return {
        "id": server.model_name,
        "object": "model",
        "created": int(server.started),
        "owned_by": "mmchaos",
        # vLLM's field: what a gateway in front keeps (it may strip the mmchaos block)
        **({"max_model_len": positions} if positions is not None else {}),
        "mmchaos": {
            "version": __version__,
            "target": server.target.uri,
            "capabilities": caps,
            "fingerprint": server.target.fingerprint().to_dict(),
            "image_input": ["input", "messages"],
            "max_items": server.config.max_items,
            "max_text_tokens": _limit(server, "max_text_tokens"),
            "context_tokens": _limit(server, "context_tokens"),
            "guards": server.guards,
        },
    }


def _limit(server: GuardedServer, name: str) -> int | None:
    """One of the served target's context limits (``max_text_tokens`` of a text encoder,
    ``context_tokens`` of a generative model), so a client need not probe for it."""
    limit = getattr(server.target, name, None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 2 else None


@router.get("/v1/models", response_model=ModelList, tags=["openai"])
async def models(request: Request) -> Response:
    """The one served model, with the target's URI, capabilities and fingerprint under ``mmchaos``."""
    server = server_of(request)
    card = await asyncio.get_running_loop().run_in_executor(None, model_card, server)
    return json_response({"object": "list", "data": [card]})
