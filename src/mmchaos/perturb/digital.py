"""ImageNet-C digital corruptions: what encoders, resamplers and colour pipelines do to pixels."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import cv2
import numpy as np

from mmchaos.perturb import _ops
from mmchaos.perturb._stack import StackKernel, rows
from mmchaos.perturb.base import (
    GeometricMixin,
    ImageArray,
    ImagePerturbation,
    as_u8,
    draw_seed,
    severity_value,
)
from mmchaos.perturb.noise import IMAGENET_C, IMAGENET_C_EXTRA


def jpeg_roundtrip(item: ImageArray, quality: int) -> ImageArray:
    """Encode and decode with libjpeg at ``quality`` (4:2:0 chroma subsampling, as Pillow's default)."""
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(item, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:  # pragma: no cover - OpenCV encodes any uint8 RGB image
        raise RuntimeError("JPEG encoding failed")
    decoded = cv2.imdecode(buf, cv2.IMREAD_COLOR_RGB)  # libjpeg writes RGB: no second conversion
    if decoded is None:  # pragma: no cover - what OpenCV encoded it decodes
        raise RuntimeError("JPEG decoding failed")
    return as_u8(decoded)


class JpegCompression(ImagePerturbation):
    """JPEG re-encoding at ImageNet-C's quality table (libjpeg, 4:2:0 chroma)."""

    name = "jpeg_compression"
    group = "digital"
    source = IMAGENET_C
    TABLE = (25, 18, 15, 10, 7)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {"quality": severity_value(self.TABLE, severity)}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        return jpeg_roundtrip(item, int(params["quality"]))


_LEVELS = (np.arange(256, dtype=np.float64) / 255.0)[:, None]
"""The 256 levels of a uint8 channel on the reference's 0-1 scale, a column (one row per level)."""


class Contrast(StackKernel):
    """Contrast loss: each channel pulled towards its mean by ImageNet-C's factors."""

    name = "contrast"
    group = "digital"
    source = IMAGENET_C
    TABLE = (0.4, 0.3, 0.2, 0.1, 0.05)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {"factor": severity_value(self.TABLE, severity)}

    KEYS = ("factor",)

    def kernel(self, images: ImageArray, params: Sequence[dict[str, Any]]) -> Any:
        factor = float(params[0]["factor"])
        # The reference's floor(clip((v / 255 - m) * factor + m, 0, 1) * 255), m a channel's mean,
        # depends only on the level v and the channel: a 256-entry table per channel, one lookup
        # a value, plane by plane (a 3-channel table took twice as long). A scaling pass plus a
        # per-channel fractional add, used before, rounded twice, and the add took 0.3-0.5 ms a
        # 224 x 224 image on OpenCV 5.1, 40 times its 5.0 time.
        out = np.empty_like(images)
        for i, item in enumerate(images):
            means = np.array(cv2.mean(item)[:3]) / 255.0
            tables = np.floor(np.clip((_LEVELS - means) * factor + means, 0.0, 1.0) * 255.0).astype(np.uint8).T
            planes = cv2.split(item)
            looked_up = [
                cv2.LUT(plane, np.ascontiguousarray(table)) for plane, table in zip(planes, tables, strict=True)
            ]
            cv2.merge(looked_up, dst=out[i])
        return out


class Saturate(StackKernel):
    """HSV saturation scaled and offset (ImageNet-C's table: 1-2 wash colours out, 3-5 overdrive them)."""

    name = "saturate"
    group = "digital"
    source = IMAGENET_C_EXTRA
    TABLE = ((0.3, 0.0), (0.1, 0.0), (2.0, 0.0), (5.0, 0.1), (20.0, 0.2))

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        scale, offset = severity_value(self.TABLE, severity)
        return {"scale": scale, "offset": offset}

    KEYS = ("scale", "offset")

    def kernel(self, images: ImageArray, params: Sequence[dict[str, Any]]) -> Any:
        item = rows(images)
        hsv = np.asarray(cv2.cvtColor(item.astype(np.float32) * np.float32(1 / 255), cv2.COLOR_RGB2HSV), np.float32)
        sat = hsv[..., 1]
        sat *= np.float32(params[0]["scale"])
        sat += np.float32(params[0]["offset"])
        np.clip(sat, 0, 1, out=sat)
        rgb = np.asarray(cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB), dtype=np.float32)
        np.clip(rgb, 0, 1, out=rgb)
        rgb *= np.float32(255)
        out: ImageArray = rgb.astype(np.uint8)
        return out


class Pixelate(ImagePerturbation):
    """Box-downsampled by ImageNet-C's factors, then blown up with nearest neighbours."""

    name = "pixelate"
    group = "digital"
    source = IMAGENET_C
    TABLE = (0.6, 0.5, 0.4, 0.3, 0.25)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {"factor": severity_value(self.TABLE, severity)}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        h, w = item.shape[:2]
        factor = float(params["factor"])
        # PIL's BOX filter to int(W * factor) (runs of whole pixels, see _ops.box_downscale); PIL's
        # nearest neighbour samples pixel centres, as INTER_NEAREST_EXACT does.
        small = _ops.box_downscale(item, max(1, int(w * factor)), max(1, int(h * factor)))
        return as_u8(cv2.resize(small, (w, h), interpolation=cv2.INTER_NEAREST_EXACT))


@lru_cache(maxsize=8)
def _identity_grid(h: int, w: int) -> tuple[Any, Any]:
    """The identity map of an ``h x w`` image as OpenCV's x and y maps (float32), made once a size."""
    grid_x, grid_y = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    grid_x.flags.writeable = False
    grid_y.flags.writeable = False
    return grid_x, grid_y


class ElasticTransform(GeometricMixin, ImagePerturbation):
    """Local elastic warping: a smoothed random displacement field (imagecorruptions' table)."""

    name = "elastic_transform"
    group = "digital"
    source = IMAGENET_C + " (imagecorruptions' displacement-field form)"
    TABLE = (250 * 0.05, 250 * 0.065, 250 * 0.085, 250 * 0.1, 250 * 0.12)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {"alpha": severity_value(self.TABLE, severity), "seed": draw_seed(rng)}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        h, w = item.shape[:2]
        alpha = float(params["alpha"])
        max_d = h * 0.005
        gen = np.random.default_rng(params["seed"])
        sigma_y, sigma_x = h * 0.01, w * 0.01
        ksize = (_ops.gaussian_ksize(sigma_x, 3.0), _ops.gaussian_ksize(sigma_y, 3.0))
        # Two fields uniform in [-max_d, max_d), from 16-bit draws (bin centres) in one call,
        # smoothed, scaled by alpha and added to the identity map.
        draws = _ops.uniform16(gen, (2, h, w))
        step = 2.0 * max_d / 65536.0
        maps = []
        for raw, grid in zip(draws, _identity_grid(h, w), strict=True):
            smooth = cv2.GaussianBlur(
                raw.astype(np.float32), ksize, sigmaX=sigma_x, sigmaY=sigma_y, borderType=cv2.BORDER_REFLECT
            )
            # alpha * (step * blur(u) + (step / 2 - max_d)) + grid: the affine map of the draws
            # commutes with the normalised blur, so it is applied once, after it.
            maps.append(cv2.scaleAdd(smooth, alpha * step, grid + np.float32(alpha * (step / 2.0 - max_d))))
        return as_u8(cv2.remap(item, maps[0], maps[1], interpolation=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT))
