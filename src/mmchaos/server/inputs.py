"""A request's inputs as items (a text, or an image's data URL, and where it came from)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mmchaos.server.errors import HTTPError
from mmchaos.server.protocol import ChatMessage, EmbeddingRequest, ImageURLPart, TextPart

__all__ = ["Item", "bare_data_url_bytes", "embedding_items", "message_parts", "part_item"]


@dataclass(frozen=True, slots=True)
class Item:
    modality: str  # "text" or "image"
    value: str  # the text, or the image's data URL
    param: str


def bare_data_url_bytes(url: str) -> bytes:
    """The guard-free path's data URL parsing: base64 only, no size checks."""
    head, sep, payload = url.partition(",")
    if not sep or not head.lower().startswith("data:") or not head.lower().endswith(";base64"):
        raise HTTPError(400, "bad_data_url", "not a base64 data: URL")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise HTTPError(400, "bad_data_url", f"invalid base64: {exc}") from exc


def message_parts(content: str | list[Any] | None, where: str) -> Iterable[tuple[Any, str]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [(TextPart(type="text", text=content), f"{where}.content")]
    return [(part, f"{where}.content[{j}]") for j, part in enumerate(content)]


def part_item(part: Any, param: str) -> Item:
    if isinstance(part, ImageURLPart):
        return Item("image", part.image_url.url, f"{param}.image_url.url")
    if isinstance(part, TextPart):
        return Item("text", part.text, f"{param}.text")
    return Item("text", str(part), param)


def embedding_items(body: EmbeddingRequest, max_items: int) -> list[Item]:
    items: list[Item] = []
    if body.input is not None:
        raw = [body.input] if isinstance(body.input, str) else body.input
        if not raw:
            raise HTTPError(400, "empty_input", "'input' is an empty list", param="input")
        if len(raw) > max_items:
            raise HTTPError(413, "too_many_inputs", f"{len(raw)} inputs; the limit is {max_items}", param="input")
        for i, x in enumerate(raw):
            items.append(Item("text", x, f"input[{i}]") if isinstance(x, str) else part_item(x, f"input[{i}]"))
        return items
    messages: list[ChatMessage] = body.messages or []
    parts = [p for i, m in enumerate(messages) for p in message_parts(m.content, f"messages[{i}]")]
    if len(parts) != 1:
        raise HTTPError(
            400,
            "one_item_per_conversation",
            f"a 'messages' request embeds exactly one image or one text, got {len(parts)} content parts "
            "(send a batch as 'input' items)",
            param="messages",
        )
    return [part_item(*parts[0])]
