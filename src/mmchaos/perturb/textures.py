"""Procedural textures, so nothing is downloaded: frost crystals in place of ImageNet-C's photos.

ImageNet-C's ``frost`` blends a random crop of one of five photographs of frosted glass
(``frost1.png`` ... ``frost5.jpg``, shipped with the reference code) into the image. Here a
texture is grown instead: dendritic ice needles (a stem with side branches at +-60 degrees, the
hexagonal habit of ice) of random length and orientation, drawn with anti-aliasing, softened,
over a low-frequency plasma cloud and a little grain, then tinted and standardised to the per-channel mean and
standard deviation measured on the corresponding reference photograph. So the mean brightness
and contrast that a frost layer adds match the reference (and with them PSNR and SSIM against
clean, see ``benchmarks/perturb_calibration.md``), but the crystals are synthetic: straighter,
more regular and without the photographs' depth-of-field and glare.
"""

from __future__ import annotations

import math
from typing import Any

import cv2
import numpy as np

from mmchaos.perturb import _ops

F32 = Any

# Per-channel (R, G, B) mean and standard deviation of the five reference frost photographs, in
# the order the reference draws them (``np.random.randint(5)`` never picks its sixth file; the
# second and third photographs are the same picture).
FROST_STYLES: tuple[tuple[tuple[float, float, float], tuple[float, float, float]], ...] = (
    ((77.7, 149.1, 165.7), (26.9, 16.5, 15.3)),  # teal glass
    ((200.8, 205.4, 214.5), (21.4, 22.1, 22.6)),  # white needles
    ((200.8, 205.4, 214.5), (21.4, 22.1, 22.6)),  # white needles (same photograph)
    ((137.6, 152.8, 165.2), (28.5, 28.5, 29.9)),  # grey-blue dendrites
    ((112.4, 123.4, 134.8), (44.4, 43.3, 41.7)),  # dark feathers
)


def frost_texture(height: int, width: int, style: int, seed: int) -> F32:
    """An ``(H, W, 3)`` float32 frost texture on the 0-255 scale, deterministic in (style, seed)."""
    rng = np.random.default_rng(seed)
    scale = max(1.0, max(height, width) / 400.0)  # the reference upsamples its photos for large images
    canvas = np.zeros((height, width), dtype=np.uint8)
    n_stems = int(height * width / (900.0 * scale * scale)) + 4
    _draw_dendrites(canvas, n_stems, scale, rng)
    crystals = cv2.GaussianBlur(canvas.astype(np.float32) / 255.0, (0, 0), 0.6 * scale)
    side = _ops.next_power_of_2(max(height, width))
    cloud = _ops.plasma_fractal(side, 2.0, rng)[:height, :width].astype(np.float32)
    grain = rng.standard_normal((height, width), dtype=np.float32)
    # Weights fitted so that SSIM against clean matches the photographs (fine structure matters).
    luminance = 0.75 * crystals + 0.15 * cloud + 0.03 * grain
    luminance -= luminance.mean()
    luminance /= max(float(luminance.std()), 1e-6)
    means, stds = FROST_STYLES[style % len(FROST_STYLES)]
    out = np.empty((height, width, 3), dtype=np.float32)
    for c in range(3):
        out[..., c] = means[c] + stds[c] * luminance
    np.clip(out, 0.0, 255.0, out=out)
    return out


def _draw_dendrites(canvas: Any, n_stems: int, scale: float, rng: np.random.Generator) -> None:
    """Stems with side branches at +-60 degrees, drawn as anti-aliased polylines in few calls."""
    h, w = canvas.shape
    x0 = rng.uniform(0, w, size=n_stems)
    y0 = rng.uniform(0, h, size=n_stems)
    angle = rng.uniform(0, math.pi, size=n_stems)
    length = rng.uniform(12, 60, size=n_stems) * scale
    level = rng.integers(0, 3, size=n_stems)
    dx, dy = np.cos(angle), np.sin(angle)
    # Branch j of stem i sits at t = j / n_i (j = 1 .. n_i - 1) and shrinks towards the tip.
    n_branch = np.maximum((length / (6 * scale)).astype(np.int64), 1)
    owner = np.repeat(np.arange(n_stems), n_branch - 1)
    first = np.repeat(np.cumsum(n_branch - 1) - (n_branch - 1), n_branch - 1)
    t = (np.arange(owner.size) - first + 1) / n_branch[owner]
    bx = x0[owner] + dx[owner] * length[owner] * t
    by = y0[owner] + dy[owner] * length[owner] * t
    blen = length[owner] * (1.0 - t) * 0.45
    starts = [np.stack([x0, y0], 1)]
    ends = [np.stack([x0 + dx * length, y0 + dy * length], 1)]
    levels = [level]
    for side in (-1.0, 1.0):
        ba = angle[owner] + side * math.pi / 3
        starts.append(np.stack([bx, by], 1))
        ends.append(np.stack([bx + np.cos(ba) * blen, by + np.sin(ba) * blen], 1))
        levels.append(level[owner])
    segs = np.round(np.stack([np.concatenate(starts), np.concatenate(ends)], 1) * 16).astype(np.int32)
    lev = np.concatenate(levels)
    for k in range(3):
        chosen = segs[lev == k]
        if len(chosen):
            cv2.polylines(canvas, list(chosen), False, 255 - 60 * k, 1, cv2.LINE_AA, shift=4)  # 4 fractional bits
