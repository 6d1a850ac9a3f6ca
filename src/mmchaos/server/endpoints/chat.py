"""``POST /v1/chat/completions``: one route, two kinds of target.

A generative target (``generate``) answers as OpenAI and vLLM do (:mod:`.chat_generate`, and
:mod:`.chat_stream` for ``stream: true``); a target that reads text (OCR) answers the text in the
request's images (:mod:`.chat_ocr`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from mmchaos.server.endpoints.chat_generate import generate_chat, generative_request
from mmchaos.server.endpoints.chat_ocr import ocr_chat
from mmchaos.server.endpoints.chat_stream import stream_chat
from mmchaos.server.http_errors import ERROR_RESPONSES
from mmchaos.server.protocol import ChatCompletionRequest, ChatCompletionResponse
from mmchaos.server.respond import server_of
from mmchaos.targets.base import Capability

__all__ = ["router"]

router = APIRouter()


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=ERROR_RESPONSES, tags=["openai"])
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    """Answer a chat: generative targets generate (``stream: true`` for server-sent events); targets
    that read text (OCR) answer the text in the ``image_url`` parts."""
    server = server_of(request)
    server.check_model(body.model)
    if not server.target.has(Capability.GENERATE):
        return await ocr_chat(server, body, request)
    chat = generative_request(server, body)
    if body.stream:
        return await stream_chat(server, chat, request)
    return await generate_chat(server, chat, request)
