"""Deployment-reality image perturbations: what phones, scanners and serving stacks do to images.

They come from the incident write-ups: screenshots of screens, OCR ghosting, low light, resizes
in the serving path, EXIF orientation and colour-space slips, occlusions. Binary slips (a
channel swap, an ignored EXIF tag) hit a share of the batch that grows with severity, as a bug
on one code path hits a share of the traffic; the draw is nested, so what is hit at severity
``s`` is also hit at every higher severity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np

from mmchaos.perturb import _ops
from mmchaos.perturb._slic import slic
from mmchaos.perturb.base import (
    GeometricMixin,
    ImageArray,
    ImagePerturbation,
    as_u8,
    draw_seed,
    severity_value,
)

SHARE = (0.2, 0.4, 0.6, 0.8, 1.0)
AREA = (0.05, 0.10, 0.20, 0.30, 0.45)
_INV255 = np.float32(1.0 / 255.0)


def _as_rgb(item: ImageArray) -> ImageArray:
    if item.ndim == 2:
        return np.ascontiguousarray(np.repeat(item[..., None], 3, axis=2))
    if item.shape[2] == 1:
        return np.ascontiguousarray(np.repeat(item, 3, axis=2))
    return np.ascontiguousarray(item[..., :3])


def _fill_boxes(item: ImageArray, boxes: Sequence[Sequence[int]], fill: Sequence[int]) -> ImageArray:
    out = item.copy()
    colour = np.asarray(fill, dtype=np.uint8)
    for top, left, height, width in boxes:
        out[top : top + height, left : left + width] = colour
    return out


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
        lam = float(params["photons"])
        levels = np.arange(256, dtype=np.float64) / 255.0
        rates = (levels ** float(params["gamma"])) * float(params["exposure"]) * lam
        shot = gen.poisson(rates[item]).astype(np.float32) * np.float32(255.0 / lam)
        read = gen.standard_normal(item.shape, dtype=np.float32) * np.float32(float(params["read_sigma"]) * 255.0)
        shot += read
        np.clip(shot, 0, 255, out=shot)
        out: ImageArray = shot.astype(np.uint8)
        return out


class BlockOcclusion(ImagePerturbation):
    """One solid block covering a growing share of the image at a random place."""

    name = "block_occlusion"
    group = "deployment"
    source = "mmchaos (random-erasing style occlusion)"
    TABLE = AREA

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        h, w = item.shape[:2]
        area = severity_value(self.TABLE, severity)
        u = rng.random(6).tolist()  # one draw: aspect, position, fill colour
        aspect = math.exp(math.log(0.5) + u[0] * math.log(4.0))
        bh = round(min(h, max(1.0, math.sqrt(area * h * w / aspect))))
        bw = round(min(w, max(1.0, area * h * w / bh)))
        top, left = int(u[1] * (h - bh + 1)), int(u[2] * (w - bw + 1))
        fill = [int(v * 256) for v in u[3:]]
        return {"area": area, "top": top, "left": left, "height": bh, "width": bw, "fill": fill}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        box = [params["top"], params["left"], params["height"], params["width"]]
        return _fill_boxes(item, [box], params["fill"])


class ScreenshotMoire(ImagePerturbation):
    """A phone photo of a screen: perspective warp, moire fringes and screen glare."""

    name = "screenshot_moire"
    group = "deployment"
    source = "mmchaos (incident write-ups: phone photos of screens)"
    # (corner jitter as a share of the side, moire amplitude, glare strength)
    TABLE = ((0.02, 0.05, 0.15), (0.04, 0.09, 0.25), (0.06, 0.13, 0.35), (0.08, 0.18, 0.45), (0.11, 0.24, 0.55))

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        jitter, amplitude, glare = severity_value(self.TABLE, severity)
        return {
            "corners": [[round(float(v), 5) for v in row] for row in rng.uniform(-jitter, jitter, size=(4, 2))],
            "period": float(rng.uniform(5.0, 14.0)),  # fringe period in pixels
            "angle": float(rng.uniform(0.0, math.pi)),
            "curvature": float(rng.uniform(-1.5, 1.5)),
            "phase": float(rng.uniform(0.0, 2 * math.pi)),
            "chroma": float(rng.uniform(0.3, 1.0)),  # colour fringing: RGB sub-pixels beat separately
            "amplitude": amplitude,
            "glare_center": [float(rng.uniform(0.1, 0.9)), float(rng.uniform(0.1, 0.9))],
            "glare_radius": [float(rng.uniform(0.15, 0.45)), float(rng.uniform(0.15, 0.45))],
            "glare": glare,
        }

    def _warp(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        h, w = item.shape[:2]
        src = np.array([[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]], dtype=np.float32)
        # Each corner moves by its own offset; where the screen shrinks, the black bezel shows.
        dst = src + np.asarray(params["corners"], dtype=np.float32) * np.array([w, h], dtype=np.float32)
        matrix = cv2.getPerspectiveTransform(src, dst)
        return as_u8(
            cv2.warpPerspective(
                item, matrix, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=0
            )
        )

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        h, w = item.shape[:2]
        warped = self._warp(item, params).astype(np.float32)
        ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
        side = float(max(h, w))
        angle = float(params["angle"])
        along = xs * math.cos(angle) + ys * math.sin(angle)
        bend = float(params["curvature"]) * ((xs - w / 2) ** 2 + (ys - h / 2) ** 2) / side
        phase = (along + bend) * np.float32(2 * math.pi / float(params["period"])) + np.float32(params["phase"])
        chroma = float(params["chroma"])
        amplitude = np.float32(params["amplitude"])
        for c in range(3):
            warped[..., c] *= 1.0 + amplitude * np.cos(phase + np.float32(chroma * c * 2 * math.pi / 3))
        cy, cx = params["glare_center"][1] * h, params["glare_center"][0] * w
        ry, rx = params["glare_radius"][1] * h, params["glare_radius"][0] * w
        glare = np.exp(-(((ys - cy) / ry) ** 2 + ((xs - cx) / rx) ** 2)) * np.float32(params["glare"] * 255.0)
        warped += glare[..., None]
        np.clip(warped, 0, 255, out=warped)
        out: ImageArray = warped.astype(np.uint8)
        return out

    def transform_alpha(self, alpha: ImageArray, params: dict[str, Any]) -> ImageArray:
        return self._warp(alpha, params)


class OCRGhosting(ImagePerturbation):
    """Scanner/camera ghosting: the previous frame blended in (~15% at severity 3), text boxes dropped.

    Items of a batch are taken as consecutive frames: item ``i`` gets a faint, slightly shifted
    copy of item ``i - 1`` (the first item an echo of itself), and a share of its text boxes
    (dark or light connected strokes, merged into words) erased to the background colour, as a
    detector that misses boxes would leave them.
    """

    name = "ocr_ghosting"
    group = "deployment"
    source = "mmchaos (incident write-ups: OCR ghosting and dropped text boxes)"
    # (ghost opacity, share of text boxes dropped)
    TABLE = ((0.06, 0.05), (0.10, 0.10), (0.15, 0.20), (0.22, 0.30), (0.30, 0.40))

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        opacity, drop = severity_value(self.TABLE, severity)
        h, w = item.shape[:2]
        boxes = text_boxes(_as_rgb(item))
        dropped = [b for b, u in zip(boxes, rng.random(len(boxes)), strict=True) if u < drop]
        return {
            "opacity": opacity,
            "shift": [int(rng.integers(-max(1, w // 25), max(1, w // 25) + 1)),
                      int(rng.integers(-max(1, h // 25), max(1, h // 25) + 1))],
            "dropped_boxes": dropped,
            "fill": _background(_as_rgb(item)),
        }  # fmt: skip

    def sample_batch(
        self, batch: Sequence[ImageArray], severity: int, rng: np.random.Generator
    ) -> list[dict[str, Any]]:
        params = [self.sample(item, severity, rng) for item in batch]
        for i, p in enumerate(params):
            p["ghost_of"] = i - 1 if i > 0 else i
        return params

    def apply_batch(self, batch: Sequence[ImageArray], params: Sequence[dict[str, Any]]) -> list[ImageArray]:
        out = []
        for item, p in zip(batch, params, strict=True):
            ghost = _as_rgb(batch[int(p["ghost_of"])])
            if ghost.shape[:2] != item.shape[:2]:
                ghost = _ops.resize(ghost, item.shape[1], item.shape[0], cv2.INTER_AREA)
            out.append(self._apply_any_layout(item, {**p, "_ghost": ghost}))
        return out

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        cleaned = _fill_boxes(item, params["dropped_boxes"], params["fill"])
        ghost = params.get("_ghost", item)
        dx, dy = params["shift"]
        move = np.array([[1, 0, dx], [0, 1, dy]], dtype=np.float32)
        shifted = cv2.warpAffine(ghost, move, (item.shape[1], item.shape[0]), borderMode=cv2.BORDER_REPLICATE)
        opacity = float(params["opacity"])
        return as_u8(cv2.addWeighted(cleaned, 1.0 - opacity, shifted, opacity, 0.0))


def _background(rgb: ImageArray) -> list[int]:
    border = np.concatenate([rgb[0], rgb[-1], rgb[:, 0], rgb[:, -1]])
    return [int(v) for v in np.median(border, axis=0)]


def text_boxes(rgb: ImageArray, max_boxes: int = 64) -> list[list[int]]:
    """Word-like boxes ``[top, left, height, width]``: the minority ink (Otsu) merged horizontally."""
    gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    _, ink = cv2.threshold(gray, 0, 1, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    if ink.mean() > 0.5:  # ink is the minority class: dark on light or light on dark
        ink = 1 - ink
    n, _, stats, _ = cv2.connectedComponentsWithStats(ink.astype(np.uint8), connectivity=8)
    if n <= 1:
        return []
    heights = stats[1:, cv2.CC_STAT_HEIGHT]
    gap = max(2, round(0.35 * float(np.median(heights))))
    merged = cv2.dilate(ink.astype(np.uint8), np.ones((1, gap), np.uint8))
    n, _, stats, _ = cv2.connectedComponentsWithStats(merged, connectivity=8)
    h, w = gray.shape
    boxes = []
    for top, left, height, width, area in (
        (int(s[cv2.CC_STAT_TOP]), int(s[cv2.CC_STAT_LEFT]), int(s[cv2.CC_STAT_HEIGHT]),
         int(s[cv2.CC_STAT_WIDTH]), int(s[cv2.CC_STAT_AREA])) for s in stats[1:]
    ):  # fmt: skip
        if area < 4 or height * width > 0.5 * h * w:
            continue
        pad = max(1, height // 8)
        t, lft = max(0, top - pad), max(0, left - pad)
        boxes.append([t, lft, min(h, top + height + pad) - t, min(w, left + width + pad) - lft])
    boxes.sort()
    return boxes[:max_boxes]


class ResolutionCollapse(GeometricMixin, ImagePerturbation):
    """Down- then up-sampling as serving stacks do it: thumbnails, non-square model inputs, no antialias."""

    name = "resolution_collapse"
    group = "deployment"
    source = "mmchaos (incident write-ups: resize chains in the serving path)"
    TABLE = (0.75, 0.5, 0.35, 0.25, 0.15)  # linear scale of the intermediate image
    DOWN = ("nearest", "bilinear", "area", "bicubic")
    UP = ("nearest", "bilinear", "bicubic")

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        non_square = bool(rng.random() < 0.5)
        squeeze = float(rng.uniform(0.6, 0.85))
        axis = int(rng.integers(2))
        down = self.DOWN[int(rng.integers(len(self.DOWN)))]
        up = self.UP[int(rng.integers(len(self.UP)))]
        scale = float(severity_value(self.TABLE, severity))
        sx = scale * (squeeze if non_square and axis == 1 else 1.0)
        sy = scale * (squeeze if non_square and axis == 0 else 1.0)
        return {"scale_x": round(sx, 5), "scale_y": round(sy, 5), "down": down, "up": up}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        h, w = item.shape[:2]
        small = _ops.resize(
            item, round(w * params["scale_x"]), round(h * params["scale_y"]), _ops.INTERPOLATIONS[params["down"]]
        )
        out: ImageArray = _ops.resize(small, w, h, _ops.INTERPOLATIONS[params["up"]])
        return out


class AspectSquash(GeometricMixin, ImagePerturbation):
    """A wrong aspect ratio: squashed with letterbox bars, or centre-cropped and stretched."""

    name = "aspect_squash"
    group = "deployment"
    source = "mmchaos (incident write-ups: non-square resize to the model input)"
    TABLE = (1.1, 1.25, 1.45, 1.7, 2.0)  # aspect distortion factor

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        mode = ("squash", "crop_stretch")[int(rng.integers(2))]
        axis = ("x", "y")[int(rng.integers(2))]
        return {"factor": severity_value(self.TABLE, severity), "mode": mode, "axis": axis}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        h, w = item.shape[:2]
        factor = float(params["factor"])
        horizontal = params["axis"] == "x"
        if params["mode"] == "crop_stretch":
            if horizontal:
                keep = max(1, round(w / factor))
                left = (w - keep) // 2
                crop = item[:, left : left + keep]
            else:
                keep = max(1, round(h / factor))
                top = (h - keep) // 2
                crop = item[top : top + keep]
            stretched: ImageArray = _ops.resize(crop, w, h, cv2.INTER_LINEAR)
            return stretched
        out = np.zeros_like(item)
        if horizontal:
            new_w = max(1, round(w / factor))
            left = (w - new_w) // 2
            out[:, left : left + new_w] = _ops.resize(item, new_w, h, cv2.INTER_AREA).reshape(h, new_w, -1)
        else:
            new_h = max(1, round(h / factor))
            top = (h - new_h) // 2
            out[top : top + new_h] = _ops.resize(item, w, new_h, cv2.INTER_AREA).reshape(new_h, w, -1)
        return out


# EXIF orientation codes 2-8 and the transform a pipeline that ignores the tag leaves in place.
_EXIF_WEIGHTS = {6: 0.35, 8: 0.35, 3: 0.2, 2: 0.025, 4: 0.025, 5: 0.025, 7: 0.025}


def exif_transform(item: ImageArray, orientation: int) -> ImageArray:
    """The pixels as stored for EXIF ``orientation``, i.e. what a reader that ignores the tag sees."""
    ops = {
        1: lambda a: a,
        2: lambda a: a[:, ::-1],
        3: lambda a: a[::-1, ::-1],
        4: lambda a: a[::-1],
        5: lambda a: np.swapaxes(a, 0, 1),
        6: lambda a: np.rot90(a, 1),
        7: lambda a: np.rot90(a, 2).swapaxes(0, 1),
        8: lambda a: np.rot90(a, -1),
    }
    return np.ascontiguousarray(ops[orientation](item))


class ExifRotation(GeometricMixin, ImagePerturbation):
    """EXIF orientation ignored: a share of the images arrive rotated or mirrored."""

    name = "exif_rotation"
    group = "deployment"
    source = "mmchaos (incident write-ups: EXIF orientation mislabelled)"
    preserves_shape = False  # a 90-degree turn swaps height and width
    TABLE = SHARE

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        u = float(rng.random())
        codes = list(_EXIF_WEIGHTS)
        orientation = int(rng.choice(codes, p=list(_EXIF_WEIGHTS.values())))
        hit = u < severity_value(self.TABLE, severity)
        return {"share": severity_value(self.TABLE, severity), "orientation": orientation if hit else 1}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        return exif_transform(item, int(params["orientation"]))


class ChannelSwap(ImagePerturbation):
    """BGR/RGB slip: a share of the images arrive with red and blue swapped (OpenCV decode path)."""

    name = "channel_swap"
    group = "deployment"
    source = "mmchaos (incident write-ups: colour-space slips)"
    TABLE = SHARE

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        share = severity_value(self.TABLE, severity)
        return {"share": share, "swapped": bool(rng.random() < share)}

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        return as_u8(cv2.cvtColor(item, cv2.COLOR_RGB2BGR)) if params["swapped"] else item.copy()


class PremultipliedAlpha(ImagePerturbation):
    """Transparency flattened on black: colours multiplied by an alpha that was then dropped.

    RGB inputs get a smooth synthetic alpha whose minimum falls with severity; RGBA inputs use
    their own alpha times that field, and come back opaque (the slip flattens them).
    """

    name = "premultiplied_alpha"
    group = "deployment"
    source = "mmchaos (incident write-ups: colour-space slips)"
    TABLE = (0.85, 0.7, 0.55, 0.4, 0.25)  # lowest alpha of the synthetic field

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {"min_alpha": severity_value(self.TABLE, severity), "seed": draw_seed(rng)}

    def _alpha(self, h: int, w: int, params: dict[str, Any]) -> Any:
        gen = np.random.default_rng(params["seed"])
        coarse = gen.random((4, 4)).astype(np.float32)
        field = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC)
        lo, hi = float(field.min()), float(field.max())
        field = (field - lo) / (hi - lo) if hi > lo else np.zeros_like(field)
        return 1.0 - (1.0 - float(params["min_alpha"])) * field

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        alpha = self._alpha(item.shape[0], item.shape[1], params)
        out: ImageArray = (item.astype(np.float32) * alpha[..., None]).astype(np.uint8)
        return out

    def _apply_any_layout(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        if isinstance(item, np.ndarray) and item.dtype == np.uint8 and item.ndim == 3 and item.shape[2] == 4:
            alpha = self._alpha(item.shape[0], item.shape[1], params) * (item[..., 3].astype(np.float32) * _INV255)
            rgb = (item[..., :3].astype(np.float32) * alpha[..., None]).astype(np.uint8)
            return np.concatenate([rgb, np.full((*item.shape[:2], 1), 255, np.uint8)], axis=2)
        return super()._apply_any_layout(item, params)


class SuperpixelOcclusion(ImagePerturbation):
    """SLIC superpixels blanked out until a growing share of the image is covered."""

    name = "superpixel_occlusion"
    group = "deployment"
    source = "mmchaos (SLIC, Achanta et al. 2012; vectorised NumPy implementation)"
    TABLE = AREA
    N_SEGMENTS = 64
    COMPACTNESS = 10.0

    @staticmethod
    def _segments(rgb: ImageArray, n_segments: int, compactness: float) -> Any:
        """SLIC labels; memoised by image bytes in :data:`mmchaos.perturb._slic.SEGMENTS`, so
        sampling, applying and every severity after the first reuse one segmentation."""
        return slic(rgb, n_segments, compactness)

    def sample(self, item: ImageArray, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        labels = self._segments(_as_rgb(item), self.N_SEGMENTS, self.COMPACTNESS)
        counts = np.bincount(labels.ravel())
        order = rng.permutation(len(counts))
        share = float(severity_value(self.TABLE, severity))
        target = share * labels.size
        chosen, covered = [], 0
        for seg in order:
            if covered >= target:
                break
            if counts[seg]:
                chosen.append(int(seg))
                covered += int(counts[seg])
        return {
            "area": share,
            "segments": sorted(chosen),
            "n_segments": self.N_SEGMENTS,
            "compactness": self.COMPACTNESS,
            "fill": [int(v) for v in rng.integers(0, 256, size=3)],
        }

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        labels = self._segments(item, int(params["n_segments"]), float(params["compactness"]))
        mask = np.isin(labels, np.asarray(params["segments"], dtype=labels.dtype))
        out = item.copy()
        out[mask] = np.asarray(params["fill"], dtype=np.uint8)
        return out
