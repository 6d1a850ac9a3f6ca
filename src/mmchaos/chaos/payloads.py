"""What an experiment sends: the good traffic mix, and hand-built image payloads (bombs, lying
headers, large legitimate JPEGs) for the poison experiment.

The hostile PNGs are built byte by byte (zlib + struct) rather than with PIL, because PIL refuses to
write an image whose header lies about its size, and a bomb must stay kilobytes on the wire.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from mmchaos.chaos.spec import ExperimentContext, PayloadSpec
from mmchaos.errors import ConfigError
from mmchaos.targets.base import Capability

if TYPE_CHECKING:
    from mmchaos.chaos.deployment import Deployment
    from mmchaos.chaos.load import PayloadMix

__all__ = ["bomb_png", "declared_png", "good_mix", "gradient_jpeg", "image_request_body", "png_data_url"]


def good_mix(ctx: ExperimentContext, dep: Deployment, spec: PayloadSpec) -> PayloadMix:
    from mmchaos.chaos.load import embeddings_mix

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
    )


def image_request_body(model: str, url: str) -> bytes:
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
            "encoding_format": "float",
        }
    ).encode()


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
    img = np.stack([np.add.outer(ramp, ramp) / 2, np.tile(ramp, (side, 1)), np.tile(ramp[:, None], (1, side))], -1)
    buf = io.BytesIO()
    Image.fromarray(img.astype(np.uint8)).save(buf, format="JPEG", quality=75)
    return buf.getvalue()
