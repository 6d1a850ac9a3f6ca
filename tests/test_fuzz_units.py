"""The fuzzer's parts without worker processes: formats, mutators, signatures, minimisation."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from mmchaos.fuzz.formats import build_png, parse_ifd, parse_jpeg, parse_png, sniff
from mmchaos.fuzz.minimise import MinimiseBudget, Minimiser
from mmchaos.fuzz.mutators import MUTATORS, mutate
from mmchaos.fuzz.seeds import format_seeds, text_seeds
from mmchaos.fuzz.signature import judge
from mmchaos.isolation import ErrorInfo, JobResult

IMG = np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)
SEEDS = format_seeds(IMG)


def _gif_with_frame(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).convert("P").save(buf, "GIF")
    blob = bytearray(buf.getvalue())
    desc = blob.find(b"\x2c", 13)
    blob[desc + 5 : desc + 9] = struct.pack("<HH", width, height)
    return bytes(blob)


def test_the_shared_loader_refuses_a_gif_frame_larger_than_its_screen() -> None:
    """Found by the fuzzer: an 8x8 GIF screen whose frame declares 65535x65535 escaped as an
    untyped DecompressionBombError from ``load()`` (the header-only size check saw 8x8)."""
    from mmchaos.data.images import ImageLoadError, load_image

    with pytest.raises(ImageLoadError) as info:
        load_image(_gif_with_frame(0xFFFF, 0xFFFF))
    assert info.value.code == "image_too_large"
