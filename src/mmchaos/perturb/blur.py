"""ImageNet-C blur corruptions, with the reference tables, as OpenCV filters."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from mmchaos.perturb import _ops
from mmchaos.perturb.base import ImageArray, ImagePerturbation, draw_seed, severity_value
from mmchaos.perturb.noise import IMAGENET_C, IMAGENET_C_EXTRA


class GaussianBlur(ImagePerturbation):
    """Gaussian blur with ImageNet-C's sigma table (truncated at 4 sigma, edges replicated)."""

    name = "gaussian_blur"
    group = "blur"
    source = IMAGENET_C_EXTRA
    TABLE = (1, 2, 3, 4, 6)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {"sigma": severity_value(self.TABLE, severity)}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        out: ImageArray = _ops.gaussian(item, float(params["sigma"]))
        return out


class DefocusBlur(ImagePerturbation):
    """Out-of-focus lens: convolution with an anti-aliased disk (ImageNet-C's radius table)."""

    name = "defocus_blur"
    group = "blur"
    source = IMAGENET_C
    TABLE = ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5))

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        radius, alias = severity_value(self.TABLE, severity)
        return {"radius": radius, "alias_blur": alias}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        kernel = _ops.disk(float(params["radius"]), float(params["alias_blur"]))
        out: ImageArray = _ops.filter2d(item, kernel)  # default border (reflect 101), as the reference
        return out


class GlassBlur(ImagePerturbation):
    """Frosted glass: blur, move each pixel to a random nearby place, blur again (ImageNet-C's table).

    The reference swaps pixels one at a time in a Python loop (about a second an image): for
    every interior pixel, bottom-right to top-left, ``iterations`` times, a swap with a neighbour
    at an offset in ``[-max_delta, max_delta)``. Pixels carried along by later swaps make a
    random walk: the net displacement per axis is close to a rounded zero-mean Gaussian (std
    1.8, 1.8, 3.2, 3.6 and 4.7 pixels by severity, measured by running the reference loop on
    index images). Here every pixel takes the value at such a displacement in one vectorised
    gather. A gather is not a permutation and its moves are independent, so ``SHIFT`` holds
    standard deviations fitted to the reference's PSNR and SSIM against clean (12 natural images;
    benchmarks/perturb_calibration.md) rather than the measured ones.
    """

    name = "glass_blur"
    group = "blur"
    source = IMAGENET_C + ", vectorised pixel shuffle"
    TABLE = ((0.7, 1, 2), (0.9, 2, 1), (1.0, 2, 3), (1.1, 3, 2), (1.5, 4, 2))  # sigma, max_delta, iterations
    SHIFT = (1.5, 1.6, 4.0, 3.6, 4.7)  # per-axis std of the displacement, fitted (see above)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        sigma, delta, iterations = severity_value(self.TABLE, severity)
        return {
            "sigma": sigma,
            "max_delta": delta,
            "iterations": iterations,
            "shift_std": severity_value(self.SHIFT, severity),
            "seed": draw_seed(rng),
        }

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        sigma = float(params["sigma"])
        h, w = item.shape[:2]
        x = _ops.gaussian(item.astype(np.float32) * np.float32(1 / 255), sigma)
        x = (x * 255).astype(np.uint8)  # the reference truncates between the two blurs
        gen = np.random.default_rng(params["seed"])
        std = np.float32(params["shift_std"])
        rows = np.rint(gen.standard_normal((h, w), dtype=np.float32) * std).astype(np.int32)
        cols = np.rint(gen.standard_normal((h, w), dtype=np.float32) * std).astype(np.int32)
        rows += np.arange(h, dtype=np.int32)[:, None]
        cols += np.arange(w, dtype=np.int32)[None, :]
        np.clip(rows, 0, h - 1, out=rows)
        np.clip(cols, 0, w - 1, out=cols)
        shuffled = x.reshape(h * w, -1)[(rows * w + cols).ravel()].reshape(x.shape)
        out = _ops.gaussian(shuffled.astype(np.float32) * np.float32(1 / 255), sigma)
        np.clip(out, 0, 1, out=out)
        result: ImageArray = (out * 255).astype(np.uint8)
        return result


class MotionBlur(ImagePerturbation):
    """Camera shake: a one-sided Gaussian streak at a random angle in [-45, 45] degrees (ImageNet-C)."""

    name = "motion_blur"
    group = "blur"
    source = IMAGENET_C + " (imagecorruptions' shift-and-add form)"
    TABLE = ((10, 3), (15, 5), (15, 8), (15, 12), (20, 15))

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        radius, sigma = severity_value(self.TABLE, severity)
        return {"radius": radius, "sigma": sigma, "angle": float(rng.uniform(-45, 45))}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        out: ImageArray = _ops.motion_blur(item, int(params["radius"]), float(params["sigma"]), float(params["angle"]))
        return out


class ZoomBlur(ImagePerturbation):
    """Zooming during exposure: the mean of centre zooms over ImageNet-C's zoom-factor ranges."""

    name = "zoom_blur"
    group = "blur"
    source = IMAGENET_C
    # (start, stop, step) of numpy.arange, as in the reference.
    TABLE = ((1.0, 1.11, 0.01), (1.0, 1.16, 0.01), (1.0, 1.21, 0.02), (1.0, 1.26, 0.02), (1.0, 1.31, 0.03))

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        start, stop, step = severity_value(self.TABLE, severity)
        return {"zooms": [round(float(z), 4) for z in np.arange(start, stop, step)]}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        x = item.astype(np.float32)  # OpenCV resizes float32 faster than uint8
        acc = x.copy()
        for z in params["zooms"]:
            cv2.add(acc, _ops.clipped_zoom(x, float(z)), dst=acc)
        acc *= np.float32(1.0 / (len(params["zooms"]) + 1))
        return np.clip(acc, 0, 255).astype(np.uint8)
