"""ImageNet-C weather corruptions: snow, frost (procedural texture), fog, brightness, spatter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np

from mmchaos.perturb import _ops
from mmchaos.perturb._stack import StackKernel, rows
from mmchaos.perturb.base import ImageArray, ImagePerturbation, as_u8, draw_seed, severity_value
from mmchaos.perturb.noise import IMAGENET_C, IMAGENET_C_EXTRA
from mmchaos.perturb.textures import FROST_STYLES, frost_texture

_INV255 = np.float32(1.0 / 255.0)


def _float(item: ImageArray) -> Any:
    return item.astype(np.float32) * _INV255


def _to_uint8(x: Any) -> ImageArray:
    np.clip(x, 0.0, 1.0, out=x)
    x *= np.float32(255.0)
    out: ImageArray = x.astype(np.uint8)
    return out


class Snow(ImagePerturbation):
    """Falling snow: a thresholded, zoomed noise layer streaked by motion blur, over a greyed image."""

    name = "snow"
    group = "weather"
    source = IMAGENET_C
    # (mean, std, zoom, threshold, blur radius, blur sigma, image weight)
    TABLE = (
        (0.1, 0.3, 3.0, 0.5, 10, 4, 0.8),
        (0.2, 0.3, 2.0, 0.5, 12, 4, 0.7),
        (0.55, 0.3, 4.0, 0.9, 12, 8, 0.7),
        (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
        (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55),
    )

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        loc, scale, zoom, thr, radius, sigma, weight = severity_value(self.TABLE, severity)
        return {
            "loc": loc, "scale": scale, "zoom": zoom, "threshold": thr, "radius": radius, "sigma": sigma,
            "weight": weight, "angle": float(rng.uniform(-135, -45)), "seed": draw_seed(rng),
        }  # fmt: skip

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        h, w = item.shape[:2]
        gen = np.random.default_rng(params["seed"])
        layer = gen.standard_normal((h, w), dtype=np.float32) * np.float32(params["scale"])
        layer += np.float32(params["loc"])
        layer = _ops.clipped_zoom(layer, float(params["zoom"]))
        layer[layer < params["threshold"]] = 0
        np.clip(layer, 0, 1, out=layer)
        layer = _ops.motion_blur(layer, int(params["radius"]), float(params["sigma"]), float(params["angle"]))
        layer = np.round(layer * 255).astype(np.uint8).astype(np.float32) * _INV255
        x = _float(item)
        weight = np.float32(params["weight"])
        gray = _ops.rgb_to_gray(x)[..., None] * np.float32(1.5) + np.float32(0.5)
        x = weight * x + (1 - weight) * np.maximum(x, gray)
        x += (layer + layer[::-1, ::-1])[..., None]
        return _to_uint8(x)


class Frost(ImagePerturbation):
    """Frosted lens: the image dimmed and blended with a procedural ice-crystal texture."""

    name = "frost"
    group = "weather"
    source = IMAGENET_C + ", procedural texture in place of the frost photographs"
    # (image weight, texture weight)
    TABLE = ((1.0, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75))

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        image_w, frost_w = severity_value(self.TABLE, severity)
        style = int(rng.integers(len(FROST_STYLES)))
        return {"image_weight": image_w, "frost_weight": frost_w, "style": style, "seed": draw_seed(rng)}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        h, w = item.shape[:2]
        texture = frost_texture(h, w, int(params["style"]), int(params["seed"]))
        out = cv2.addWeighted(
            item.astype(np.float32), float(params["image_weight"]), texture, float(params["frost_weight"]), 0.0
        )
        return np.clip(out, 0, 255).astype(np.uint8)


class Fog(ImagePerturbation):
    """Fog: a diamond-square plasma cloud added, the image's range compressed (ImageNet-C)."""

    name = "fog"
    group = "weather"
    source = IMAGENET_C
    TABLE = ((1.5, 2.0), (2.0, 2.0), (2.5, 1.7), (2.5, 1.5), (3.0, 1.4))

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        strength, decay = severity_value(self.TABLE, severity)
        return {"strength": strength, "decay": decay, "seed": draw_seed(rng)}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        h, w = item.shape[:2]
        strength = float(params["strength"])
        size = _ops.next_power_of_2(max(h, w))
        cloud = _ops.plasma_fractal(size, float(params["decay"]), np.random.default_rng(params["seed"]))
        # (x / 255 + strength * cloud) * max / (max + strength), clipped to [0, 1], times 255 and
        # truncated: on the 0-255 scale, one scaling of the image and one of the cloud.
        max_val = float(item.max()) / 255.0
        gain = max_val / (max_val + strength)
        x = item.astype(np.float32)
        x *= np.float32(gain)
        haze = cloud[:h, :w] * np.float32(255.0 * strength * gain)
        x += haze[..., None]
        np.minimum(x, np.float32(255.0), out=x)  # both terms are >= 0
        out: ImageArray = x.astype(np.uint8)
        return out


class Brightness(StackKernel):
    """Over-exposure: HSV value raised by ImageNet-C's offsets, hue and saturation kept."""

    name = "brightness"
    group = "weather"
    source = IMAGENET_C
    TABLE = (0.1, 0.2, 0.3, 0.4, 0.5)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {"offset": severity_value(self.TABLE, severity)}

    KEYS = ("offset",)

    def kernel(self, images: ImageArray, params: Sequence[dict[str, Any]]) -> Any:
        # Raising V with H and S fixed scales each pixel's RGB by V'/V (V = max channel); a pure
        # black pixel (S = 0, H = 0) becomes grey V'. Both depend only on V: one 256-entry table.
        item = rows(images)
        offset = float(params[0]["offset"]) * 255.0
        levels = np.arange(256, dtype=np.float64)
        gain = np.minimum(levels + offset, 255.0) / np.maximum(levels, 1.0)
        r, g, b = cv2.split(item)
        value = cv2.max(cv2.max(r, g), b)
        scale = cv2.LUT(value, gain.astype(np.float32))
        # Rounds where the reference truncates: within one level, for a single fused pass.
        out = as_u8(cv2.multiply(item, cv2.merge([scale, scale, scale]), dtype=cv2.CV_8U))
        if offset > 0:
            out[value == 0] = min(round(offset), 255)
        return out


class Spatter(ImagePerturbation):
    """Water drops (severities 1-3) or mud splashes (4-5) on the lens (ImageNet-C's spatter)."""

    name = "spatter"
    group = "weather"
    source = IMAGENET_C_EXTRA
    # (mean, std, blur sigma, threshold, intensity or mud blur sigma, mud?)
    TABLE = (
        (0.65, 0.3, 4, 0.69, 0.6, 0),
        (0.65, 0.3, 3, 0.68, 0.6, 0),
        (0.65, 0.3, 2, 0.68, 0.5, 0),
        (0.65, 0.3, 1, 0.65, 1.5, 1),
        (0.67, 0.4, 1, 0.65, 1.5, 1),
    )
    _WATER = np.array([175.0, 238.0, 238.0], dtype=np.float32) / 255.0
    _MUD = np.array([63.0, 42.0, 20.0], dtype=np.float32) / 255.0
    _EMBOSS = np.array([[-2, -1, 0], [-1, 1, 1], [0, 1, 2]], dtype=np.float32)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        loc, scale, sigma, thr, strength, mud = severity_value(self.TABLE, severity)
        return {
            "loc": loc, "scale": scale, "sigma": sigma, "threshold": thr, "strength": strength,
            "mud": bool(mud), "seed": draw_seed(rng),
        }  # fmt: skip

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        h, w = item.shape[:2]
        gen = np.random.default_rng(params["seed"])
        liquid = gen.standard_normal((h, w), dtype=np.float32) * np.float32(params["scale"])
        liquid += np.float32(params["loc"])
        liquid = _ops.gaussian(liquid, float(params["sigma"]))
        liquid[liquid < params["threshold"]] = 0
        x = _float(item)
        if not params["mud"]:
            liquid_u8 = (np.clip(liquid, 0, 1) * 255).astype(np.uint8)
            dist = 255 - cv2.Canny(liquid_u8, 50, 150)
            dist = cv2.distanceTransform(dist, cv2.DIST_L2, 5)
            _, dist = cv2.threshold(dist, 20, 20, cv2.THRESH_TRUNC)
            dist = cv2.blur(dist, (3, 3)).astype(np.uint8)
            dist = cv2.equalizeHist(dist)
            dist = cv2.filter2D(dist, cv2.CV_8U, self._EMBOSS)
            dist = cv2.blur(dist, (3, 3)).astype(np.float32)
            m = liquid * dist
            peak = float(m.max())
            if peak > 0:
                m *= np.float32(float(params["strength"]) / peak)
            x += m[..., None] * self._WATER
            return _to_uint8(x)
        m = (liquid > params["threshold"]).astype(np.float32)
        m = _ops.gaussian(m, float(params["strength"]))
        m[m < 0.8] = 0
        x *= (1 - m)[..., None]
        x += m[..., None] * self._MUD
        return _to_uint8(x)
