"""Digital corruptions: what encoders and pipelines do to pixels."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image

from mmchaos.perturb.base import ImageArray, ImagePerturbation, severity_value
from mmchaos.perturb.noise import IMAGENET_C


def jpeg_roundtrip(item: ImageArray, quality: int) -> ImageArray:
    buf = io.BytesIO()
    Image.fromarray(item).save(buf, format="JPEG", quality=quality)
    buf.seek(0)
    with Image.open(buf) as img:
        return np.asarray(img.convert("RGB"), dtype=np.uint8)


class JpegCompression(ImagePerturbation):
    """JPEG re-encoding at ImageNet-C's quality table (libjpeg through Pillow)."""

    name = "jpeg_compression"
    group = "digital"
    source = IMAGENET_C
    TABLE = (25, 18, 15, 10, 7)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {"quality": severity_value(self.TABLE, severity)}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        return jpeg_roundtrip(item, int(params["quality"]))
