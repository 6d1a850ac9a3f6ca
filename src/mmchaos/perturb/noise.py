"""ImageNet-C noise corruptions (Hendrycks & Dietterich, 2019), with the reference tables.

Noise fields are recorded as a seed, so a record stays small and replays bit for bit. Gaussian
fields come from a 65536-entry quantile table indexed by uniform 16-bit draws (see
:func:`mmchaos.perturb._ops.normal_noise`), three times faster than NumPy's float32 ziggurat.
"""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from mmchaos.perturb._ops import CV, normal_noise
from mmchaos.perturb.base import ImageArray, ImagePerturbation, as_u8, draw_seed, severity_value

IMAGENET_C = "ImageNet-C (Hendrycks & Dietterich 2019)"
IMAGENET_C_EXTRA = "ImageNet-C validation set (Hendrycks & Dietterich 2019)"


def _truncate(values: Any) -> ImageArray:
    """Clip to 0-255 and truncate, as the reference's ``np.uint8(clip(x, 0, 1) * 255)`` does."""
    np.clip(values, 0.0, 255.0, out=values)
    out: ImageArray = values.astype(np.uint8)
    return out


class GaussianNoise(ImagePerturbation):
    """Additive Gaussian noise, sigma from ImageNet-C's table."""

    name = "gaussian_noise"
    group = "noise"
    source = IMAGENET_C
    TABLE = (0.08, 0.12, 0.18, 0.26, 0.38)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {"sigma": severity_value(self.TABLE, severity), "seed": draw_seed(rng)}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        noise = normal_noise(np.random.default_rng(params["seed"]), item.shape, float(params["sigma"]) * 255.0)
        return _truncate(cv2.add(noise, item, dtype=cv2.CV_32F))


class ShotNoise(ImagePerturbation):
    """Poisson (photon) noise at ImageNet-C's photon counts."""

    name = "shot_noise"
    group = "noise"
    source = IMAGENET_C
    TABLE = (60, 25, 12, 5, 3)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {"photons": severity_value(self.TABLE, severity), "seed": draw_seed(rng)}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        lam = float(params["photons"])
        # The expected count of each of the 256 levels, looked up instead of computed per pixel.
        rates = np.arange(256, dtype=np.float64) * (lam / 255.0)
        counts = np.random.default_rng(params["seed"]).poisson(rates[item])
        return _truncate((counts * (255.0 / lam)).astype(np.float32))


class ImpulseNoise(ImagePerturbation):
    """Salt-and-pepper noise: a share of the values set to 0 or 255 (ImageNet-C's amounts)."""

    name = "impulse_noise"
    group = "noise"
    source = IMAGENET_C
    TABLE = (0.03, 0.06, 0.09, 0.17, 0.27)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {"amount": severity_value(self.TABLE, severity), "seed": draw_seed(rng)}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        # One 16-bit uniform per value: below amount/2 is pepper, amount/2..amount is salt (as
        # scikit-image's random_noise(mode='s&p') with salt_vs_pepper=0.5, in one draw).
        u = np.random.default_rng(params["seed"]).integers(0, 65536, size=item.shape, dtype=np.uint16)
        amount = float(params["amount"]) * 65536.0
        hit = CV.compare(u, amount, cv2.CMP_LT)
        salt = cv2.bitwise_and(hit, CV.compare(u, amount * 0.5, cv2.CMP_GE))
        return as_u8(cv2.bitwise_or(cv2.bitwise_and(item, cv2.bitwise_not(hit)), salt))


class SpeckleNoise(ImagePerturbation):
    """Multiplicative Gaussian noise, x + x * N(0, sigma) (ImageNet-C's validation corruption)."""

    name = "speckle_noise"
    group = "noise"
    source = IMAGENET_C_EXTRA
    TABLE = (0.15, 0.2, 0.35, 0.45, 0.6)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {"sigma": severity_value(self.TABLE, severity), "seed": draw_seed(rng)}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        noise = normal_noise(np.random.default_rng(params["seed"]), item.shape, float(params["sigma"]))
        noise += np.float32(1.0)
        return _truncate(cv2.multiply(noise, item, dtype=cv2.CV_32F))
