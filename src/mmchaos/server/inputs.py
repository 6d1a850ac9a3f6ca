"""A request's inputs as items (a text, or an image's data URL, and where it came from)."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mmchaos.guard.preflight import estimate_tokens
from mmchaos.server.errors import ServerError
from mmchaos.server.protocol import CHAT_ROLES, ChatMessage, EmbeddingRequest, ImageURLPart, TextPart

__all__ = [
    "Item",
    "Turn",
    "bare_data_url_bytes",
    "chat_turns",
    "check_role",
    "embedding_items",
    "message_parts",
    "part_item",
    "truncate_to_tokens",
]

#: Turns token ids into the text they stand for (``param`` names the input in errors).
Detokenize = Callable[[Sequence[int], str], str]


@dataclass(frozen=True, slots=True)
class Item:
    modality: str  # "text" or "image"
    value: str  # the text, or the image's data URL
    param: str


@dataclass(frozen=True, slots=True)
class Turn:
    """One chat message's inputs, in order; ``plain`` when its content was a string (one text)."""

    role: str
    items: tuple[Item, ...]
    plain: bool


def chat_turns(messages: Sequence[ChatMessage], max_items: int) -> list[Turn]:
    """A chat request's messages as turns of items (nothing decoded); 400 on an unknown role,
    413 past ``max_items`` content parts."""
    turns = []
    for i, m in enumerate(messages):
        check_role(m, i)
        items = tuple(part_item(p, where) for p, where in message_parts(m.content, f"messages[{i}]"))
        turns.append(Turn(m.role, items, plain=not isinstance(m.content, list)))
    count = sum(len(t.items) for t in turns)
    if count > max_items:
        raise ServerError(f"{count} content parts; the limit is {max_items}", code="too_many_inputs", param="messages")
    return turns


def check_role(message: ChatMessage, i: int) -> None:
    """400 ``bad_messages`` unless message ``i`` has one of :data:`CHAT_ROLES` (what the schema lists)."""
    if message.role not in CHAT_ROLES:
        roles = ", ".join(sorted(CHAT_ROLES))
        raise ServerError(
            f"message {i} has role {message.role!r}; this server takes {roles}", code="bad_messages",
            param=f"messages[{i}].role",
        )  # fmt: skip


def bare_data_url_bytes(url: str) -> bytes:
    """The guard-free path's data URL parsing: base64 only, no size checks."""
    head, sep, payload = url.partition(",")
    if not sep or not head.lower().startswith("data:") or not head.lower().endswith(";base64"):
        raise ServerError("not a base64 data: URL", code="bad_data_url")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ServerError(f"invalid base64: {exc}", code="bad_data_url") from exc


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


def embedding_items(body: EmbeddingRequest, max_items: int, detokenize: Detokenize) -> list[Item]:
    items: list[Item] = []
    if body.input is not None:
        raw: list[Any] = [body.input] if isinstance(body.input, str) else list(body.input)
        if raw and isinstance(raw[0], int):  # one text as token ids
            return [Item("text", detokenize(raw, "input"), "input")]
        if not raw:
            raise ServerError("'input' is an empty list", code="empty_input", param="input")
        if len(raw) > max_items:
            raise ServerError(f"{len(raw)} inputs; the limit is {max_items}", code="too_many_inputs", param="input")
        for i, x in enumerate(raw):
            where = f"input[{i}]"
            if isinstance(x, str):
                items.append(Item("text", x, where))
            elif isinstance(x, list):
                items.append(Item("text", detokenize(x, where), where))
            else:
                items.append(part_item(x, where))
        return items
    messages: list[ChatMessage] = body.messages or []
    for i, m in enumerate(messages):
        check_role(m, i)
    parts = [p for i, m in enumerate(messages) for p in message_parts(m.content, f"messages[{i}]")]
    if len(parts) != 1:
        raise ServerError(
            f"a 'messages' request embeds exactly one image or one text, got {len(parts)} content parts "
            "(send a batch as 'input' items)",
            code="one_item_per_conversation",
            param="messages",
        )
    return [part_item(*parts[0])]


def truncate_to_tokens(text: str, limit: int) -> tuple[str, bool]:
    """The longest prefix of ``text`` (cut after a word where one fits) of at most ``limit`` tokens
    as usage counts them (:func:`~mmchaos.guard.preflight.estimate_tokens`); and whether it was cut."""
    if estimate_tokens(text) <= limit:
        return text, False
    best = ""
    for match in re.finditer(r"\S+", text):
        head = text[: match.end()]
        if estimate_tokens(head) > limit:
            break
        best = head
    if not best:  # the first word alone is too long: cut inside it
        best = text.lstrip()[: 4 * limit]
        while best and estimate_tokens(best) > limit:
            best = best[:-1]
    return best, True
