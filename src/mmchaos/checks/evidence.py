"""Turning inputs into stored evidence: PNG bytes for images, short text for texts."""

from __future__ import annotations

import io

import numpy as np
import numpy.typing as npt
from PIL import Image

from mmchaos.findings import Artifact

__all__ = ["image_artifact", "png_bytes"]


def png_bytes(image: npt.NDArray[np.uint8]) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def image_artifact(name: str, image: npt.NDArray[np.uint8]) -> Artifact:
    return Artifact(name=name, data=png_bytes(image), media_type="image/png")


def safe_name(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)
