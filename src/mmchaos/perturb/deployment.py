"""Deployment-reality image perturbations from the incident write-ups."""

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


class LowLight(ImagePerturbation):
    """A camera in low light: exposure cut, gamma darkening, then photon (Poisson) and read noise."""

    name = "low_light"
    group = "deployment"
    source = "mmchaos (camera noise model: exposure x gamma, Poisson shot + Gaussian read noise)"
    # (exposure factor, gamma, full-well photons at the new exposure, read-noise sigma in [0,1])
    TABLE = (
        (0.80, 1.10, 400.0, 0.004),
        (0.60, 1.25, 150.0, 0.008),
        (0.40, 1.45, 60.0, 0.012),
        (0.25, 1.70, 25.0, 0.020),
        (0.12, 2.00, 10.0, 0.030),
    )

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        exposure, gamma, photons, read = severity_value(self.TABLE, severity)
        return {"exposure": exposure, "gamma": gamma, "photons": photons, "read_sigma": read, "seed": draw_seed(rng)}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        gen = np.random.default_rng(params["seed"])
        dark = (to_float(item).astype(np.float64) ** params["gamma"]) * params["exposure"]
        lam = params["photons"]
        shot = gen.poisson(dark * lam) / lam
        return to_uint8(shot + gen.normal(0.0, params["read_sigma"], item.shape))


class BlockOcclusion(ImagePerturbation):
    """One solid block covering a growing share of the image at a random place."""

    name = "block_occlusion"
    group = "deployment"
    source = "mmchaos (random-erasing style occlusion)"
    TABLE = (0.05, 0.10, 0.20, 0.30, 0.45)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        h, w = item.shape[:2]
        area = severity_value(self.TABLE, severity)
        aspect = float(np.exp(rng.uniform(np.log(0.5), np.log(2.0))))
        bh = int(round(min(h, max(1.0, np.sqrt(area * h * w / aspect)))))
        bw = int(round(min(w, max(1.0, area * h * w / bh))))
        top = int(rng.integers(0, h - bh + 1))
        left = int(rng.integers(0, w - bw + 1))
        fill = [int(v) for v in rng.integers(0, 256, size=3)]
        return {"area": area, "top": top, "left": left, "height": bh, "width": bw, "fill": fill}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        out = item.copy()
        t, l_ = params["top"], params["left"]
        out[t : t + params["height"], l_ : l_ + params["width"]] = np.asarray(params["fill"], dtype=np.uint8)
        return out
