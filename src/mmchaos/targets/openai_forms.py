"""The request bodies mmchaos sends to an OpenAI-compatible endpoint: one builder per image form.

Servers disagree on how an image goes to ``POST /embeddings``; the ``openai:`` target probes which
form an endpoint takes (``OpenAITarget.image_input``), and everything that sends images to it (the
target itself, the serving experiments' good traffic and poison, the load driver, the metrics
check) builds its bodies here, so traffic speaks the form the endpoint was found to take:

- ``"messages"``: vLLM's chat-embeddings request, one image per request
  (``{"messages": [{"role": "user", "content": [<image_url part>]}]}``);
- ``"input"``: ``input`` items that are ``image_url`` content parts, batched (``mmchaos serve``);
- ``"data_url"``: ``input`` strings that are ``data:`` URLs, batched (LiteLLM);
- ``"modality"``: the same strings with ``"modality": "image"`` in the body, batched (infinity, which
  embeds a data-URL string as text without it).

Chat completions have one form: ``image_url`` parts beside text parts in a user message. Plain
JSON over strings; nothing here encodes images (see :mod:`.openai_wire`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "CHAT_IMAGE_FORM",
    "IMAGE_FORMS",
    "EmbeddingsForm",
    "ImageForm",
    "chat_body",
    "chat_image_content",
    "embeddings_form",
    "image_part",
    "text_body",
]

ImageForm = Literal["messages", "input", "data_url", "modality"]
IMAGE_FORMS: tuple[ImageForm, ...] = ("messages", "input", "data_url", "modality")
"""The ways of sending an image to ``/embeddings``, in the order the ``openai:`` probe tries them."""
CHAT_IMAGE_FORM = "chat"
"""What the journal names the image form of chat traffic (``image_url`` parts in a message)."""


def image_part(url: str) -> dict[str, Any]:
    """An OpenAI ``image_url`` content part."""
    return {"type": "image_url", "image_url": {"url": url}}


@dataclass(frozen=True)
class EmbeddingsForm:
    """How one image form puts images into an ``/embeddings`` body.

    ``batched``: whether one body may carry several images (``messages`` embeds exactly one).
    ``shape``: the body's image field as a reader would recognise it (the journal records it).
    """

    name: ImageForm
    batched: bool
    shape: str

    def body(self, model: str, urls: Sequence[str], encoding_format: str = "float") -> dict[str, Any]:
        """One request body embedding the images at ``urls`` (``data:`` URLs, sent as given)."""
        if not urls:
            raise ValueError("an image embeddings request needs at least one image")
        if self.name == "messages":
            if len(urls) != 1:
                raise ValueError(f"the 'messages' form embeds one image per request, not {len(urls)}")
            return {
                "model": model,
                "messages": [{"role": "user", "content": [image_part(urls[0])]}],
                "encoding_format": encoding_format,
            }
        items: list[Any] = [image_part(u) for u in urls] if self.name == "input" else list(urls)
        body: dict[str, Any] = {"model": model, "input": items, "encoding_format": encoding_format}
        if self.name == "modality":
            body["modality"] = "image"
        return body

    def describe(self) -> dict[str, Any]:
        return {"image_form": self.name, "batched": self.batched, "shape": self.shape}


_FORMS: dict[str, EmbeddingsForm] = {
    f.name: f
    for f in (
        EmbeddingsForm("messages", False, 'messages[0].content: [{"type": "image_url", ...}] (vLLM)'),
        EmbeddingsForm("input", True, 'input: [{"type": "image_url", "image_url": {"url": "data:..."}}]'),
        EmbeddingsForm("data_url", True, 'input: ["data:image/...;base64,..."] (LiteLLM)'),
        EmbeddingsForm("modality", True, 'input: ["data:image/...;base64,..."], modality: "image" (infinity)'),
    )
}


def embeddings_form(name: str) -> EmbeddingsForm:
    """The builder of one image form; an unknown name is a ValueError naming the known ones."""
    try:
        return _FORMS[name]
    except KeyError:
        raise ValueError(f"unknown image form {name!r} (known: {', '.join(IMAGE_FORMS)})") from None


def text_body(model: str, texts: str | Sequence[str], encoding_format: str = "float") -> dict[str, Any]:
    """An ``/embeddings`` body for one text (sent as a string) or several (a list)."""
    return {
        "model": model,
        "input": texts if isinstance(texts, str) else list(texts),
        "encoding_format": encoding_format,
    }


def chat_image_content(urls: Sequence[str], text: str | None = None) -> list[dict[str, Any]]:
    """A user message's content: ``image_url`` parts for ``urls``, then the text part if any."""
    parts = [image_part(u) for u in urls]
    if text is not None:
        parts.append({"type": "text", "text": text})
    return parts


def chat_body(model: str, content: str | list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    """A ``/chat/completions`` body with one user message; ``options`` (``max_tokens``,
    ``temperature``, ``stream``, ...) are added as given."""
    return {"model": model, "messages": [{"role": "user", "content": content}], **options}
