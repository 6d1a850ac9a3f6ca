"""The poison payloads serving_poison sends: what each one is, byte for byte, since a run's findings
are reproduced from its seed and these bytes are part of every request it made."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image

from mmchaos.chaos.payloads import bomb_png, declared_png, gradient_jpeg


def _gradient_plainly(side: int) -> bytes:
    """The legitimate large image written plainly: three float32 ramps stacked and truncated."""
    ramp = np.linspace(0, 255, side, dtype=np.float32)
    img = np.stack([np.add.outer(ramp, ramp) / 2, np.tile(ramp, (side, 1)), np.tile(ramp[:, None], (1, side))], -1)
    buf = io.BytesIO()
    Image.fromarray(img.astype(np.uint8)).save(buf, format="JPEG", quality=75)
    return buf.getvalue()


def test_the_large_gradient_is_the_plain_one_and_decodes_at_its_side() -> None:
    for side in (64, 333, 1024):
        data = gradient_jpeg.__wrapped__(side)
        assert data == _gradient_plainly(side)
        assert Image.open(io.BytesIO(data)).size == (side, side)


def test_the_bomb_and_the_lying_header_declare_what_they_say() -> None:
    bomb = bomb_png(5000)
    width, height, depth, colour = struct.unpack(">IIBB", bomb[16:26])
    assert (width, height, depth, colour) == (5000, 5000, 1, 0) and len(bomb) < 20_000
    pixels = zlib.decompress(bomb[41:-16])
    assert len(pixels) == 5000 * (1 + 625) and not any(pixels), "all rows of zeros, each with its filter byte"
    liar = declared_png(30000, 20000)
    assert struct.unpack(">II", liar[16:24]) == (30000, 20000) and len(zlib.decompress(liar[41:-16])) == 4097
