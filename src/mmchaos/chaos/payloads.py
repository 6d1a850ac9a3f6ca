"""What an experiment sends: the good traffic mix, and hand-built image payloads (bombs, lying
headers, large legitimate JPEGs) for the poison experiment.

Every body that carries an image is built by :mod:`mmchaos.targets.openai_forms` in the deployment's
image form (``Deployment.image_form``: what the ``openai:`` probe found the endpoint to take), so the
harness's own traffic is never refused for its shape; :func:`traffic` says what was sent, for the
journal.

The hostile PNGs are built byte by byte (zlib + struct) rather than with PIL, because PIL refuses to
write an image whose header lies about its size, and a bomb must stay kilobytes on the wire.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from mmchaos.chaos.spec import ExperimentContext, PayloadSpec
from mmchaos.errors import ConfigError
from mmchaos.targets.base import Capability
from mmchaos.targets.openai_forms import (
    CHAT_IMAGE_FORM,
    ImageForm,
    chat_body,
    chat_image_content,
    embeddings_form,
)

if TYPE_CHECKING:
    import random

    import httpx

    from mmchaos.chaos.deployment import Deployment
    from mmchaos.chaos.load import PayloadMix

__all__ = [
    "bomb_png",
    "chat_mix",
    "chats",
    "declared_png",
    "good_mix",
    "good_path",
    "gradient_jpeg",
    "image_request_body",
    "png_data_url",
    "traffic",
]


def chats(dep: Deployment) -> bool:
    """Whether the good traffic is chat completions: a generative target that embeds nothing."""
    caps = dep.capabilities
    return Capability.GENERATE in caps and not caps & {Capability.EMBED_IMAGE, Capability.EMBED_TEXT}


def good_path(dep: Deployment) -> str:
    return f"{dep.prefix}/chat/completions" if chats(dep) else f"{dep.prefix}/embeddings"


def _chat_validator(response: httpx.Response) -> None:
    body = json.loads(response.content)
    choices = body["choices"]
    if not isinstance(choices, list) or not choices:
        raise ValueError("a chat answer without choices")
    content = choices[0]["message"]["content"]
    if not isinstance(content, str):
        raise ValueError(f"message.content is {type(content).__name__}, not text")


def _stream_validator(response: httpx.Response) -> None:
    """A streamed chat answer read whole: complete (``data: [DONE]``, or choice 0's finish_reason
    before the connection closed) and free of error events; a stream cut mid-way is a bad body."""
    from mmchaos.targets.openai_wire import EndpointError, sse_deltas

    try:
        for _ in sse_deltas(response.text.splitlines(), "/chat/completions"):
            pass
    except EndpointError as exc:
        raise ValueError(str(exc)) from None


def chat_mix(ctx: ExperimentContext, dep: Deployment, spec: PayloadSpec) -> PayloadMix:
    """OpenAI ``/v1/chat/completions`` requests from the dataset: a question about one image (a
    ``data:`` URL part and a text part), and a text-only question; greedy, ``spec.max_tokens`` long.
    A ``spec.stream_share`` of each kind is sent with ``stream: true`` (kinds ``*_stream``), read
    whole and judged complete by its end (:func:`_stream_validator`)."""
    from mmchaos.chaos.load import LoadRequest, MixEntry, PayloadMix
    from mmchaos.errors import DataError

    chosen = list(ctx.dataset)[: spec.samples]
    if not chosen:
        raise DataError(f"dataset {ctx.dataset.name} is empty", code="data_empty")
    path = good_path(dep)

    def body(content: str | list[dict[str, object]]) -> bytes:
        return json.dumps(chat_body(dep.model, content, max_tokens=spec.max_tokens, temperature=0)).encode()

    def streamed(raw: bytes) -> bytes:
        return json.dumps({**json.loads(raw), "stream": True}).encode()

    bodies: dict[str, list[bytes]] = {}
    images = [s for s in chosen if s.has_image]
    if images:
        bodies["chat_image"] = [
            body(
                chat_image_content([png_data_url(_png_bytes(s.load_image()))], s.question or "What is in the picture?")
            )
            for s in images
        ]
    bodies["chat_text"] = [body(s.question or s.caption or "Say hello.") for s in chosen]
    headers = {"Content-Type": "application/json"}

    def factory(kind: str, options: list[bytes]) -> Callable[[random.Random], LoadRequest]:
        validate = _stream_validator if kind.endswith("_stream") else _chat_validator

        def make(rng: random.Random) -> LoadRequest:
            content = options[rng.randrange(len(options))]
            return LoadRequest(kind, path, "POST", content=content, headers=headers, validate=validate)

        return make

    weights = {"chat_image": 1.0, "chat_text": 0.25}
    share = spec.stream_share or 0.0
    entries = []
    for kind, options in bodies.items():
        if share < 1.0:
            entries.append(MixEntry(factory(kind, options), weights[kind] * (1.0 - share)))
        if share > 0.0:
            entries.append(MixEntry(factory(f"{kind}_stream", [streamed(b) for b in options]), weights[kind] * share))
    return PayloadMix(entries)


def _png_bytes(image: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.asarray(image, dtype=np.uint8)).convert("RGB").save(buf, format="PNG")
    return buf.getvalue()


def good_mix(ctx: ExperimentContext, dep: Deployment, spec: PayloadSpec) -> PayloadMix:
    from mmchaos.chaos.load import embeddings_mix

    if chats(dep):
        return chat_mix(ctx, dep, spec)

    weights = dict(spec.weights)
    if not dep.capabilities & {Capability.EMBED_IMAGE} or not ctx.dataset.has_images:
        weights.update(image_small=0.0, image_large=0.0)
    if Capability.EMBED_TEXT not in dep.capabilities:
        weights.update(text_short=0.0, text_long=0.0)
    if not any(v > 0 for v in weights.values()):
        raise ConfigError("no payload kind is left to send (weights, capabilities and data exclude them all)")
    return embeddings_mix(
        ctx.dataset,
        model=dep.model,
        path=f"{dep.prefix}/embeddings",
        samples=spec.samples,
        large_side=spec.large_side,
        weights=weights,
        image_form=dep.image_form,
    )


def _sends_images(ctx: ExperimentContext, dep: Deployment, spec: PayloadSpec) -> bool:
    if not ctx.dataset.has_images:
        return False
    if chats(dep):
        return True
    return Capability.EMBED_IMAGE in dep.capabilities and any(
        spec.weights.get(k, 1.0) > 0 for k in ("image_small", "image_large")
    )


def traffic(ctx: ExperimentContext, dep: Deployment, spec: PayloadSpec) -> dict[str, object]:
    """What the good traffic is, for the journal: its endpoint, whether it carries images, and in
    which image form and why that one."""
    out: dict[str, object] = {"endpoint": good_path(dep), "images": _sends_images(ctx, dep, spec)}
    if chats(dep):
        out.update(image_form=CHAT_IMAGE_FORM, shape="messages[0].content: image_url and text parts",
                   streamed_share=spec.stream_share or 0.0)  # fmt: skip
    else:
        out.update(embeddings_form(dep.image_form).describe(), image_form_source=dep.image_form_source)
    return out


def image_request_body(form: ImageForm, model: str, url: str) -> bytes:
    """One ``/embeddings`` request for the image at ``url`` in ``form`` (``Deployment.image_form``)."""
    return json.dumps(embeddings_form(form).body(model, [url])).encode()


def png_data_url(blob: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(blob).decode('ascii')}"


def _png_chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def _png(width: int, height: int, bit_depth: int, colour: int, idat: bytes) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


@lru_cache(maxsize=4)
def bomb_png(side: int) -> bytes:
    """A complete 1-bit ``side`` x ``side`` PNG of zeros: kilobytes encoded, gigabytes as RGB."""
    comp = zlib.compressobj(9)
    row = b"\x00" * (1 + (side + 7) // 8)
    parts = [comp.compress(row * min(512, side - i)) for i in range(0, side, 512)]
    parts.append(comp.flush())
    return _png(side, side, 1, 0, b"".join(parts))


@lru_cache(maxsize=4)
def declared_png(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` RGB but whose data holds one short row."""
    return _png(width, height, 8, 2, zlib.compress(b"\x00" * 4097))


@lru_cache(maxsize=4)
def gradient_jpeg(side: int) -> bytes:
    """A legitimate large image (a smooth gradient, so it stays small encoded)."""
    from PIL import Image

    ramp = np.linspace(0, 255, side, dtype=np.float32)
    levels = ramp.astype(np.uint8)
    img = np.empty((side, side, 3), np.uint8)  # filled in place: no float32 image, no stacking copy
    diagonal = np.add.outer(ramp, ramp)
    diagonal /= 2
    img[..., 0] = diagonal  # truncated, as astype(uint8) truncates
    img[..., 1] = levels[None, :]
    img[..., 2] = levels[:, None]
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=75)
    return buf.getvalue()
