"""ImageNet-C weather corruptions: snow, frost (procedural texture), fog, brightness, spatter."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from mmchaos.perturb import _ops
from mmchaos.perturb._stack import StackKernel, rows
from mmchaos.perturb.base import ImageArray, ImagePerturbation, as_u8, draw_seed, severity_value
from mmchaos.perturb.noise import IMAGENET_C, IMAGENET_C_EXTRA
from mmchaos.perturb.textures import FROST_STYLES, frost_texture


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
        # The noise the reference draws at full size and then zooms into: only the part the zoom
        # reads is drawn (_ops.zoom_crop_shape), as Gaussian quantiles of 16-bit uniforms.
        zoom = float(params["zoom"])
        rows, cols = _ops.zoom_crop_shape(h, w, zoom)
        scale, loc = float(params["scale"]), float(params["loc"])
        seeds = _ops.uniform16(gen, (rows, cols))
        layer: Any = np.take(_ops.scaled_normal_quantiles(scale, loc), seeds)
        layer = cv2.resize(layer, (w, h), interpolation=cv2.INTER_LINEAR)
        # Below the threshold to zero, then clipped to [0, 1] (the threshold is positive).
        _, layer = cv2.threshold(layer, float(params["threshold"]), 0.0, cv2.THRESH_TOZERO)
        np.minimum(layer, np.float32(1.0), out=layer)
        layer = _ops.motion_blur(layer, int(params["radius"]), float(params["sigma"]), float(params["angle"]))
        flakes = cv2.convertScaleAbs(layer, alpha=255.0)  # round(layer * 255) as uint8, as the reference
        fall = cv2.add(flakes, flakes[::-1, ::-1], dtype=cv2.CV_32F)  # the layer and its 180-degree turn
        # The rest on the 0-255 scale: grey lift, blend, snow added, clipped and truncated.
        x: Any = item.astype(np.float32)
        weight = float(params["weight"])
        lifted = _ops.rgb_to_gray(x)
        lifted *= np.float32(1.5)
        lifted += np.float32(127.5)
        brighter = cv2.max(x, _ops.gray_to_rgb(lifted))
        x = cv2.addWeighted(x, weight, brighter, 1.0 - weight, 0.0)
        cv2.add(x, _ops.gray_to_rgb(fall), dst=x)
        return _ops.truncate_u8(x)  # every term is >= 0


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
        # truncated: on the 0-255 scale, the cloud scaled and added, the sum scaled and truncated.
        max_val = float(item.max()) / 255.0
        gain = max_val / (max_val + strength)
        haze = _ops.gray_to_rgb(cloud[:h, :w])
        x = cv2.scaleAdd(haze, 255.0 * strength, item.astype(np.float32))  # both terms are >= 0
        return _ops.truncate_u8(x, gain)


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
        gain, black = _brightness_tables(float(params[0]["offset"]) * 255.0)
        planes = cv2.split(item)
        value = cv2.max(cv2.max(planes[0], planes[1]), planes[2])
        scale = cv2.LUT(value, gain)
        if black[0] and cv2.minMaxLoc(value)[0] == 0:
            # A black pixel's channels are raised from 0 to 1 and its gain is the grey level, so
            # the one multiply makes it grey (a masked add of the grey after it cost as much as
            # the rest of the kernel); an image without black pixels skips this.
            lift = cv2.LUT(value, black)
            planes = tuple(cv2.max(plane, lift) for plane in planes)
        # Rounds where the reference truncates: within one level, for a single fused pass. Plane
        # by plane: a 3-channel float32 copy of the scale cost twice the rest of the kernel.
        return as_u8(cv2.merge([cv2.multiply(plane, scale, dtype=cv2.CV_8U) for plane in planes]))


@lru_cache(maxsize=16)
def _brightness_tables(offset: float) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.uint8]]:
    """V'/V by level V (level 0: the grey a black pixel becomes), and 1 at level 0, 0 elsewhere."""
    levels = np.arange(256, dtype=np.float64)
    gain = (np.minimum(levels + offset, 255.0) / np.maximum(levels, 1.0)).astype(np.float32)
    gain[0] = min(round(offset), 255)
    black = np.zeros(256, np.uint8)
    black[0] = 1 if offset > 0 else 0
    gain.flags.writeable = False
    black.flags.writeable = False
    return gain, black


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
    # ImageNet-C's water (175, 238, 238) and mud (63, 42, 20) colours, as OpenCV per-channel scalars.
    _WATER_255 = (175.0, 238.0, 238.0, 0.0)
    _MUD_255 = (63.0, 42.0, 20.0, 0.0)
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
        # N(loc, scale) per pixel: Gaussian quantiles of 16-bit uniforms (_ops.normal_quantiles).
        table = _ops.scaled_normal_quantiles(float(params["scale"]), float(params["loc"]))
        liquid = _ops.gaussian(np.take(table, _ops.uniform16(gen, (h, w))), float(params["sigma"]))
        threshold = float(params["threshold"])
        _, liquid = cv2.threshold(liquid, threshold, 0.0, cv2.THRESH_TOZERO)  # below it to zero
        # The rest on the 0-255 scale, the image added in float32 by OpenCV (no converted copy).
        if not params["mud"]:
            # uint8(clip(liquid, 0, 1) * 255): liquid is >= 0 past the threshold, 255 saturates.
            dist = 255 - cv2.Canny(_ops.truncate_u8(liquid, 255.0), 50, 150)
            dist = cv2.distanceTransform(dist, cv2.DIST_L2, 5)
            _, dist = cv2.threshold(dist, 20, 20, cv2.THRESH_TRUNC)
            dist = cv2.blur(dist, (3, 3)).astype(np.uint8)
            dist = cv2.equalizeHist(dist)
            dist = cv2.filter2D(dist, cv2.CV_8U, self._EMBOSS)
            m = cv2.blur(dist, (3, 3)).astype(np.float32)
            m *= liquid
            peak = float(m.max())
            # m * strength / peak, times the water colour: one per-channel multiply.
            gain = float(params["strength"]) / peak if peak > 0 else 0.0
            colour = tuple(c * gain for c in self._WATER_255)
            water = _ops.CV.multiply(_ops.gray_to_rgb(m), colour)
            return _ops.truncate_u8(cv2.add(item, water, dtype=cv2.CV_32F))  # every term is >= 0
        m = (liquid > threshold).astype(np.float32)
        m = _ops.gaussian(m, float(params["strength"]))
        _, m = cv2.threshold(m, 0.8, 0.0, cv2.THRESH_TOZERO)
        m3 = _ops.gray_to_rgb(m)
        # x * (1 - m) + m * mud, with m in [0, 1]: a blend of two non-negative terms. (A bare 1.0
        # as an OpenCV scalar may reach the first channel only: four of them.)
        kept = cv2.multiply(item, _ops.CV.subtract((1.0, 1.0, 1.0, 1.0), m3), dtype=cv2.CV_32F)
        return _ops.truncate_u8(cv2.add(kept, _ops.CV.multiply(m3, self._MUD_255)))
