"""ImageNet-C noise corruptions (Hendrycks & Dietterich, 2019), with the reference tables.

Noise fields are recorded as a seed and an offset into its stream (see :class:`NoiseKernel`), so
a record stays small and replays bit for bit. Each field is drawn as uniform 16-bit integers and
looked up in a table: whole-level Gaussian offsets for additive noise
(:func:`mmchaos.perturb._ops.normal_level_offsets`), the quantiles of N(0, 1) for speckle, the
quantiles of the Poisson counts for shot noise (:func:`mmchaos.perturb._ops.poisson_levels`).
The kernels work on a whole ``(N, H, W, 3)`` stack at once (``apply_stack``); one image is a
stack of one, so batched and per-image results are the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import cv2
import numpy as np

from mmchaos.perturb import _ops
from mmchaos.perturb._ops import CV
from mmchaos.perturb._stack import StackKernel, rows
from mmchaos.perturb.base import ImageArray, draw_seed, severity_value

IMAGENET_C = "ImageNet-C (Hendrycks & Dietterich 2019)"
IMAGENET_C_EXTRA = "ImageNet-C validation set (Hendrycks & Dietterich 2019)"


def _fields(params: Sequence[dict[str, Any]], shape: tuple[int, ...]) -> Any:
    """The uniform 16-bit noise fields of the items, from their recorded seeds and offsets."""
    return _ops.uniform16_stack([int(p["seed"]) for p in params], shape, [int(p.get("offset", 0)) for p in params])


class NoiseKernel(StackKernel):
    """A noise kernel: one parameter from ``TABLE`` (named ``PARAM``) and a recorded noise field.

    A batch is sampled with one seed: item ``i``'s field is the stretch of that seed's stream
    after the fields of items ``0 .. i-1`` (``offset``, in 64-bit outputs), so the batch draws
    its noise in one call while each record still replays alone. A record without an offset
    (made one item at a time, or before offsets) reads its stream from the start.
    """

    TABLE: tuple[Any, ...] = ()
    PARAM = ""

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {self.PARAM: severity_value(self.TABLE, severity), "seed": draw_seed(rng)}

    def sample_batch(
        self, batch: Sequence[ImageArray], severity: int, rng: np.random.Generator
    ) -> list[dict[str, Any]]:
        seed, offset, params = draw_seed(rng), 0, []
        value = severity_value(self.TABLE, severity)
        for item in batch:
            params.append({self.PARAM: value, "seed": seed, "offset": offset})
            # The kernel sees three channels whatever the layout (grey is widened, alpha kept aside).
            offset += _ops.uniform16_words((*np.shape(item)[:2], 3))
        return params


class GaussianNoise(NoiseKernel):
    """Additive Gaussian noise, sigma from ImageNet-C's table."""

    name = "gaussian_noise"
    group = "noise"
    source = IMAGENET_C
    TABLE = (0.08, 0.12, 0.18, 0.26, 0.38)
    KEYS = ("sigma",)

    PARAM = "sigma"

    def kernel(self, images: ImageArray, params: Sequence[dict[str, Any]]) -> Any:
        fields = _fields(params, images.shape[1:])
        # Whole-level offsets added with saturation: the reference's trunc(clip(x + n)) for
        # integer x (see _ops.normal_level_offsets), with no float pass over the image.
        noise = np.take(_ops.normal_level_offsets(float(params[0]["sigma"]) * 255.0), fields)
        noise += images
        return np.clip(noise, 0, 255, out=noise).astype(np.uint8)


class ShotNoise(NoiseKernel):
    """Poisson (photon) noise at ImageNet-C's photon counts."""

    name = "shot_noise"
    group = "noise"
    source = IMAGENET_C + " (Poisson counts drawn by inverse CDF)"
    TABLE = (60, 25, 12, 5, 3)
    KEYS = ("photons",)

    PARAM = "photons"

    def kernel(self, images: ImageArray, params: Sequence[dict[str, Any]]) -> Any:
        fields = _fields(params, images.shape[1:])
        # Each output level is a function of (input level, uniform draw): one table, one gather.
        return _ops.poisson_levels(images, fields, float(params[0]["photons"]))


class ImpulseNoise(NoiseKernel):
    """Salt-and-pepper noise: a share of the values set to 0 or 255 (ImageNet-C's amounts)."""

    name = "impulse_noise"
    group = "noise"
    source = IMAGENET_C
    TABLE = (0.03, 0.06, 0.09, 0.17, 0.27)
    KEYS = ("amount",)

    PARAM = "amount"

    def kernel(self, images: ImageArray, params: Sequence[dict[str, Any]]) -> Any:
        fields = _fields(params, images.shape[1:])
        # One 16-bit uniform per value: below amount/2 is pepper, amount/2..amount is salt (as
        # scikit-image's random_noise(mode='s&p') with salt_vs_pepper=0.5, in one draw).
        u, item = rows(fields), rows(images)
        amount = float(params[0]["amount"]) * 65536.0
        # A scalar spelled for every channel: OpenCV 5.1 reads a bare number as (v, 0, 0, 0).
        hit = CV.compare(u, (amount,) * 4, cv2.CMP_LT)
        salt = cv2.bitwise_and(hit, CV.compare(u, (amount * 0.5,) * 4, cv2.CMP_GE))
        return cv2.bitwise_or(cv2.bitwise_and(item, cv2.bitwise_not(hit)), salt)


class SpeckleNoise(NoiseKernel):
    """Multiplicative Gaussian noise, x + x * N(0, sigma) (ImageNet-C's validation corruption)."""

    name = "speckle_noise"
    group = "noise"
    source = IMAGENET_C_EXTRA
    TABLE = (0.15, 0.2, 0.35, 0.45, 0.6)
    KEYS = ("sigma",)

    PARAM = "sigma"

    def kernel(self, images: ImageArray, params: Sequence[dict[str, Any]]) -> Any:
        fields = _fields(params, images.shape[1:])
        factor = np.take(_speckle_factors(float(params[0]["sigma"])), fields)
        return _ops.truncate_u8(cv2.multiply(rows(factor), rows(images), dtype=cv2.CV_32F))


@lru_cache(maxsize=8)
def _speckle_factors(sigma: float) -> Any:
    """``1 + sigma * z`` for the normal quantiles ``z``, floored at 0.

    A negative factor makes a negative product, which the reference clips to 0; a factor of 0
    gives that 0 directly, so every product is >= 0 and one truncating conversion finishes the
    kernel (:func:`mmchaos.perturb._ops.truncate_u8`).
    """
    factors = np.maximum(_ops.scaled_normal_quantiles(sigma, 1.0), np.float32(0.0))
    factors.flags.writeable = False
    return factors
