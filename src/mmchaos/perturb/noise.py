"""ImageNet-C noise corruptions (Hendrycks & Dietterich, 2019), with the reference tables."""

from __future__ import annotations

from typing import Any

import numpy as np

from mmchaos.perturb.base import (
    ImageArray,
    ImagePerturbation,
    draw_seed,
    severity_value,
    to_float,
    to_uint8,
)

IMAGENET_C = "ImageNet-C (Hendrycks & Dietterich 2019)"


class GaussianNoise(ImagePerturbation):
    """Additive Gaussian noise, sigma from ImageNet-C's table."""

    name = "gaussian_noise"
    group = "noise"
    source = IMAGENET_C
    TABLE = (0.08, 0.12, 0.18, 0.26, 0.38)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {"sigma": severity_value(self.TABLE, severity), "seed": draw_seed(rng)}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        noise = np.random.default_rng(params["seed"]).normal(0.0, params["sigma"], item.shape)
        return to_uint8(to_float(item) + noise)


class ShotNoise(ImagePerturbation):
    """Poisson (photon) noise at ImageNet-C's photon counts."""

    name = "shot_noise"
    group = "noise"
    source = IMAGENET_C
    TABLE = (60, 25, 12, 5, 3)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {"photons": severity_value(self.TABLE, severity), "seed": draw_seed(rng)}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        lam = params["photons"]
        counts = np.random.default_rng(params["seed"]).poisson(to_float(item) * lam)
        return to_uint8(counts / lam)
