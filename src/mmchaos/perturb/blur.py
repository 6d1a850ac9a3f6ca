"""Blur corruptions."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from mmchaos.perturb.base import ImageArray, ImagePerturbation, severity_value, to_float, to_uint8
from mmchaos.perturb.noise import IMAGENET_C


def gaussian_kernel(sigma: float, truncate: float = 4.0) -> npt.NDArray[np.float64]:
    radius = int(truncate * sigma + 0.5)
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    k = np.exp(-0.5 * (x / sigma) ** 2)
    return k / k.sum()


def _convolve_axis(img: npt.NDArray[np.float64], kernel: npt.NDArray[np.float64], axis: int) -> npt.NDArray[np.float64]:
    radius = len(kernel) // 2
    pad = [(0, 0)] * img.ndim
    pad[axis] = (radius, radius)
    padded = np.pad(img, pad, mode="edge")
    out = np.zeros_like(img)
    n = img.shape[axis]
    for i, w in enumerate(kernel):
        out += w * np.take(padded, np.arange(i, i + n), axis=axis)
    return out


def gaussian_blur_array(img: npt.NDArray[np.float64], sigma: float) -> npt.NDArray[np.float64]:
    """Separable Gaussian blur with edge replication (scikit-image's ``mode='nearest'``)."""
    kernel = gaussian_kernel(sigma)
    return _convolve_axis(_convolve_axis(img, kernel, 0), kernel, 1)


class GaussianBlur(ImagePerturbation):
    """Gaussian blur with ImageNet-C's sigma table (truncated at 4 sigma, edges replicated)."""

    name = "gaussian_blur"
    group = "blur"
    source = IMAGENET_C
    TABLE = (1, 2, 3, 4, 6)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {"sigma": severity_value(self.TABLE, severity)}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        return to_uint8(gaussian_blur_array(to_float(item).astype(np.float64), params["sigma"]))
