"""SLIC superpixels (Achanta et al., 2012) in vectorised NumPy: no scikit-image, no contrib OpenCV.

Centres start on a regular grid of step ``S``; each pixel compares itself with the centres of the
3 x 3 grid cells around its own cell (the paper's 2S x 2S search window), using the paper's
distance ``d_lab^2 + (d_xy / S)^2 * m^2`` in CIELAB. Centres are then moved to the mean of their
pixels. Connectivity is not enforced: a label may cover a few disconnected fragments, which is
harmless for occlusion.

Segmentations are memoised in :data:`SEGMENTS`, a bounded LRU cache keyed on a hash of the
(downscaled) image bytes: a sweep asks for the same image's superpixels at every severity, and
callers such as the drift check or a Ray work unit build a new perturbation per severity, so the
cache cannot live on the instance. It is a pure memo (same bytes in, same labels out).
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt


class SegmentCache:
    """A thread-safe LRU of label maps, bounded in bytes; counts its hits and misses."""

    def __init__(self, max_bytes: int = 16 << 20) -> None:
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[bytes, npt.NDArray[np.int32]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: bytes) -> npt.NDArray[np.int32] | None:
        with self._lock:
            labels = self._items.get(key)
            if labels is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return labels

    def put(self, key: bytes, labels: npt.NDArray[np.int32]) -> None:
        labels.flags.writeable = False
        with self._lock:
            if key in self._items:
                return
            self._items[key] = labels
            self._bytes += labels.nbytes
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._bytes -= old.nbytes

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._items)


SEGMENTS = SegmentCache()
"""The process's superpixel memo (about 900 segmentations at the default 96-pixel working size)."""


def slic(
    rgb: npt.NDArray[np.uint8],
    n_segments: int = 64,
    compactness: float = 10.0,
    iterations: int = 5,
    max_side: int = 96,
    cache: SegmentCache | None = SEGMENTS,
) -> Any:
    """``(H, W)`` int32 labels of about ``n_segments`` superpixels of an RGB uint8 image.

    Images larger than ``max_side`` are segmented at that size and the labels scaled back (as
    albumentations' ``Superpixels`` does): a few dozen superpixels do not need every pixel. The
    segmentation at the working size is memoised in ``cache`` (None: always compute).
    """
    h, w = rgb.shape[:2]
    small = rgb
    if max(h, w) > max_side:
        scale = max_side / max(h, w)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        small = np.asarray(cv2.resize(rgb, size, interpolation=cv2.INTER_AREA), dtype=np.uint8)
    labels = None
    key = b""
    if cache is not None:
        digest = hashlib.blake2b(np.ascontiguousarray(small).tobytes(), digest_size=16)
        digest.update(f"{small.shape}/{n_segments}/{compactness}/{iterations}".encode())
        key = digest.digest()
        labels = cache.get(key)
    if labels is None:
        labels = _slic(small, n_segments, compactness, iterations)
        if cache is not None:
            cache.put(key, labels)
    if small is rgb:
        return labels.copy()
    return cv2.resize(labels, (w, h), interpolation=cv2.INTER_NEAREST)


def _slic(rgb: npt.NDArray[np.uint8], n_segments: int, compactness: float, iterations: int) -> npt.NDArray[np.int32]:
    h, w = rgb.shape[:2]
    lab = cv2.cvtColor(rgb.astype(np.float32) * np.float32(1 / 255), cv2.COLOR_RGB2LAB)
    step = max(1.0, math.sqrt(h * w / max(1, n_segments)))
    ny, nx = max(1, round(h / step)), max(1, round(w / step))
    cell_h, cell_w = h / ny, w / nx
    cy, cx = np.meshgrid((np.arange(ny) + 0.5) * cell_h, (np.arange(nx) + 0.5) * cell_w, indexing="ij")
    centres = np.concatenate(
        [lab[cy.astype(int).ravel(), cx.astype(int).ravel()], cy.reshape(-1, 1), cx.reshape(-1, 1)], axis=1
    ).astype(np.float32)
    ys, xs = np.mgrid[0:h, 0:w]
    iy = np.minimum((ys / cell_h).astype(np.int64), ny - 1)
    ix = np.minimum((xs / cell_w).astype(np.int64), nx - 1)
    # The 9 candidate centres of every pixel (clamped at the border; duplicates are harmless).
    cand = np.stack(
        [np.clip(iy + dy, 0, ny - 1) * nx + np.clip(ix + dx, 0, nx - 1) for dy in (-1, 0, 1) for dx in (-1, 0, 1)],
        axis=-1,
    ).reshape(h * w, 9)
    feats = np.concatenate([lab.reshape(-1, 3), ys.reshape(-1, 1), xs.reshape(-1, 1)], axis=1).astype(np.float32)
    weight = np.float32((compactness / step) ** 2)
    pixel = [np.ascontiguousarray(feats[:, k]) for k in range(5)]
    columns = np.ascontiguousarray(cand.T)  # (9, P): one candidate of every pixel a row
    labels = cand[:, 4]
    for _ in range(iterations):
        labels = _nearest(centres, columns, pixel, weight)
        counts = np.bincount(labels, minlength=len(centres)).astype(np.float32)
        present = counts > 0
        for k in range(5):
            sums = np.bincount(labels, weights=feats[:, k], minlength=len(centres))
            centres[present, k] = (sums[present] / counts[present]).astype(np.float32)
    out: npt.NDArray[np.int32] = labels.reshape(h, w).astype(np.int32)
    return out


def _nearest(
    centres: npt.NDArray[np.float32],
    columns: npt.NDArray[np.int64],
    pixel: list[npt.NDArray[np.float32]],
    weight: np.float32,
) -> npt.NDArray[np.int64]:
    """Each pixel's nearest candidate centre under SLIC's distance, the first of equals.

    One candidate column at a time and one feature at a time, on flat arrays: the same float32
    operations in the same order as the distance of a ``(pixels, 9, 5)`` gather summed over its
    small last axes, so the same labels, at a fifth of the time (NumPy reduces three- and two-long
    axes and gathers ``(9, 5)`` blocks slowly). Ties keep the earlier candidate, as ``argmin`` does.
    """
    table = [np.ascontiguousarray(centres[:, k]) for k in range(5)]

    def distance(ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        d = [table[k][ids] - pixel[k] for k in range(5)]
        colour = d[0] * d[0]
        colour += d[1] * d[1]
        colour += d[2] * d[2]
        place = d[3] * d[3]
        place += d[4] * d[4]
        place *= weight
        colour += place
        return colour

    best = distance(columns[0])
    labels: npt.NDArray[np.int64] = columns[0].copy()
    for ids in columns[1:]:
        here = distance(ids)
        closer = here < best
        np.copyto(best, here, where=closer)
        np.copyto(labels, ids, where=closer)
    return labels
