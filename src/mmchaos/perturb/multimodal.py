"""Multimodal perturbations: a modality goes missing, pairs get mixed up, sequences and boxes slip.

They work on :class:`~mmchaos.perturb.base.MultimodalSample` items and leave the fields they do
not know alone. Binary faults (a missing modality, a swapped caption) hit a share of the batch
that grows with severity; the draw is nested, so what is hit at severity ``s`` is also hit at
every higher severity.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from mmchaos.perturb.base import (
    MultimodalPerturbation,
    MultimodalSample,
    draw_seed,
    severity_value,
)

SHARE = (0.1, 0.25, 0.5, 0.75, 1.0)
IMAGE_FILLS = ("black", "white", "gray", "uniform", "noise")
TEXT_FILLS = ("", " ", "\t\n", "   ")


def missing_image(shape: tuple[int, ...], fill: str, seed: int) -> Any:
    """A stand-in for an image that did not arrive: blank, uniform colour or noise, same shape."""
    gen = np.random.default_rng(seed)
    if fill == "black":
        return np.zeros(shape, np.uint8)
    if fill == "white":
        return np.full(shape, 255, np.uint8)
    if fill == "gray":
        return np.full(shape, 128, np.uint8)
    if fill == "uniform":
        colour = gen.integers(0, 256, size=shape[2:] or (1,), dtype=np.uint8)
        return np.broadcast_to(colour, shape).copy()
    return gen.integers(0, 256, size=shape, dtype=np.uint8)


class MissingModality(MultimodalPerturbation):
    """A share of the samples lose their image (blank, uniform or noise) or their text (empty/whitespace)."""

    name = "missing_modality"
    source = "mmchaos (design: missing modality), MMRobustness-style share of the batch"
    removes_content = True
    TABLE = SHARE

    def hit(self, params: dict[str, Any]) -> bool:
        return params.get("drop") is not None

    def sample(self, item: MultimodalSample, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        u = float(rng.random())
        present = [f for f in ("image", "text") if getattr(item, f) is not None]
        which = present[int(rng.integers(len(present)))] if present else None
        image_fill = IMAGE_FILLS[int(rng.integers(len(IMAGE_FILLS)))]
        text_fill = TEXT_FILLS[int(rng.integers(len(TEXT_FILLS)))]
        seed = draw_seed(rng)
        hit = which is not None and u < severity_value(self.TABLE, severity)
        if not hit:
            return {"drop": None}
        if which == "image":
            return {"drop": "image", "fill": image_fill, "seed": seed}
        return {"drop": "text", "fill": text_fill}

    def apply(self, item: MultimodalSample, params: dict[str, Any]) -> MultimodalSample:
        if params["drop"] == "image" and item.image is not None:
            blank = missing_image(item.image.shape, params["fill"], int(params["seed"]))
            return dataclasses.replace(item, image=blank)
        if params["drop"] == "text":
            return dataclasses.replace(item, text=params["fill"])
        return item


class CaptionMismatch(MultimodalPerturbation):
    """A share of the captions swapped between samples: each such image now carries another's text."""

    name = "caption_mismatch"
    source = "mmchaos (image-caption mismatch injection)"
    expects_change = True
    needs = frozenset({"image", "text"})
    TABLE = SHARE

    def sample_batch(
        self, batch: Sequence[MultimodalSample], severity: int, rng: np.random.Generator
    ) -> list[dict[str, Any]]:
        n = len(batch)
        u = rng.random(n)
        chosen = [i for i in range(n) if u[i] < severity_value(self.TABLE, severity) and batch[i].text is not None]
        params: list[dict[str, Any]] = [{"caption_of": None} for _ in range(n)]
        if len(chosen) < 2:
            return params
        # A derangement of the chosen items: rotate a random order by one, so none keeps its own.
        order = [chosen[int(i)] for i in rng.permutation(len(chosen))]
        for a, b in zip(order, order[1:] + order[:1], strict=True):
            params[a] = {"caption_of": b}
        return params

    def sample(self, item: MultimodalSample, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        return {"caption_of": None}  # one item alone has nobody to swap with

    def apply_batch(
        self, batch: Sequence[MultimodalSample], params: Sequence[dict[str, Any]]
    ) -> list[MultimodalSample]:
        out = []
        for item, p in zip(batch, params, strict=True):
            src = p["caption_of"]
            out.append(item if src is None else dataclasses.replace(item, text=batch[int(src)].text))
        return out

    def apply(self, item: MultimodalSample, params: dict[str, Any]) -> MultimodalSample:
        return item


class FrameOffset(MultimodalPerturbation):
    """The frame sequence shifted in time against the rest of the sample (edges held)."""

    name = "frame_offset"
    source = "mmchaos (temporal misalignment of sequence inputs)"
    needs = frozenset({"frames"})
    TABLE = (1, 2, 3, 5, 8)  # offset in frames

    def sample(self, item: MultimodalSample, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        sign = 1 if rng.random() < 0.5 else -1
        return {"offset": sign * int(severity_value(self.TABLE, severity))}

    def apply(self, item: MultimodalSample, params: dict[str, Any]) -> MultimodalSample:
        if not item.frames:
            return item
        n = len(item.frames)
        k = int(params["offset"])
        frames = tuple(item.frames[min(n - 1, max(0, i - k))].copy() for i in range(n))
        return dataclasses.replace(item, frames=frames)


class FrameDrop(MultimodalPerturbation):
    """Dropped frames: a share of the frames replaced by the last delivered one (a stalled stream)."""

    name = "frame_drop"
    source = "mmchaos (dropped frames of sequence inputs)"
    needs = frozenset({"frames"})
    TABLE = (0.1, 0.2, 0.35, 0.5, 0.7)

    def sample(self, item: MultimodalSample, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        n = len(item.frames or ())
        u = rng.random(n)
        # The first frame always arrives; a dropped frame repeats the previous delivered one.
        dropped = [i for i in range(1, n) if u[i] < severity_value(self.TABLE, severity)]
        return {"dropped": dropped}

    def apply(self, item: MultimodalSample, params: dict[str, Any]) -> MultimodalSample:
        if not item.frames:
            return item
        dropped = set(params["dropped"])
        frames: list[Any] = []
        for i, frame in enumerate(item.frames):
            frames.append(frames[-1].copy() if i in dropped and frames else frame.copy())
        return dataclasses.replace(item, frames=tuple(frames))


class BBoxShift(MultimodalPerturbation):
    """Bounding boxes shifted and rescaled by a share of their size (coordinate slips, off-by-a-resize)."""

    name = "bbox_shift"
    source = "mmchaos (coordinate shift of boxes)"
    needs = frozenset({"boxes"})
    TABLE = (0.05, 0.1, 0.2, 0.3, 0.5)  # largest shift as a share of the box side

    def sample(self, item: MultimodalSample, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        n = len(item.boxes or ())
        jitter = float(severity_value(self.TABLE, severity))
        moves = rng.uniform(-jitter, jitter, size=(n, 4))
        return {"jitter": jitter, "moves": [[round(float(v), 6) for v in row] for row in moves]}

    def apply(self, item: MultimodalSample, params: dict[str, Any]) -> MultimodalSample:
        if not item.boxes:
            return item
        limit = (item.image.shape[1], item.image.shape[0]) if item.image is not None else None
        boxes = []
        for (x0, y0, x1, y1), (m0, m1, m2, m3) in zip(item.boxes, params["moves"], strict=True):
            bw, bh = x1 - x0, y1 - y0
            nx0, ny0, nx1, ny1 = x0 + m0 * bw, y0 + m1 * bh, x1 + m2 * bw, y1 + m3 * bh
            nx0, nx1 = min(nx0, nx1), max(nx0, nx1)
            ny0, ny1 = min(ny0, ny1), max(ny0, ny1)
            if limit is not None:
                nx0, nx1 = (min(max(v, 0.0), float(limit[0])) for v in (nx0, nx1))
                ny0, ny1 = (min(max(v, 0.0), float(limit[1])) for v in (ny0, ny1))
            boxes.append((float(nx0), float(ny0), float(nx1), float(ny1)))
        return dataclasses.replace(item, boxes=tuple(boxes))
