"""``builtin:ppocr``: PP-OCRv4 through the ONNX models that ``rapidocr-onnxruntime`` ships.

Two modes:

* ``PPOCRTarget()`` (``builtin:ppocr``) runs only the recogniser (``ch_PP-OCRv4_rec``) on each
  image, which must be a crop of one text line, as in the built-in ``textlines`` dataset. About
  10-15 ms a line on a laptop CPU.
* ``PPOCRTarget(detect=True)`` (``builtin:ppocr-det``) runs the text detector first, recognises
  every box it finds and joins the texts in reading order (top to bottom, then left to right)
  with single spaces. About 50x slower: use it for whole pages or screenshots.

RapidOCR quirks this adapter deals with:

* An ``ndarray`` given to RapidOCR is taken to be BGR (OpenCV order) and passed through as is;
  only paths, bytes and PIL images are converted from RGB. mmchaos images are RGB, so they are
  reversed to BGR here; the recogniser then sees exactly what it sees for the same picture
  loaded from a file.
* Batching crops of different widths pads them to the widest of the batch, and the padding
  changes what PP-OCRv4 reads (its SVTR neck mixes the whole line), so a line's transcription
  would depend on its batch neighbours. It is not reliably faster on CPU either (2 cores: 11 ms
  a line alone vs 18 ms in batches of 6 when idle, about even under load). ``batch_size`` so
  defaults to 1 (each line alone); a larger value is offered for accelerators, at the cost of
  batch invariance.
* In recognition-only mode RapidOCR applies no score threshold; every line's best path is
  returned (an empty string when the recogniser emits only blanks). With detection, boxes whose
  recognition score is below ``text_score`` (RapidOCR's 0.5) are dropped, as RapidOCR does.
* On tight single-line crops the detector over-segments (overlapping boxes, so letters are read
  twice: ``"card Road"`` -> ``"card F Road"``); detection mode is for pages with margins.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from mmchaos._lazy import require
from mmchaos.errors import TargetCallError
from mmchaos.guard.limits import PILLOW_MAX_IMAGE_PIXELS, SizeLimits, check_declared_size
from mmchaos.targets.base import (
    Capability,
    Fingerprint,
    FloatArray,
    ImageArray,
    Target,
    hash_file,
    hash_files,
)

__all__ = ["PPOCRTarget"]

_MODEL_FILES = (
    "ch_PP-OCRv4_det_infer.onnx",
    "ch_PP-OCRv4_rec_infer.onnx",
    "ch_ppocr_mobile_v2.0_cls_infer.onnx",
)
_VERSIONED = ("rapidocr_onnxruntime", "onnxruntime", "numpy")


def _version(dist: str) -> str:
    for name in (dist, dist.replace("_", "-")):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


MAX_IMAGE_PIXELS = PILLOW_MAX_IMAGE_PIXELS  # a text line is far smaller


def _to_bgr(image: Any, index: int) -> np.ndarray:
    """An RGB uint8 image (gray and RGBA accepted) as a contiguous BGR array for RapidOCR."""
    arr = np.asarray(image)
    if arr.dtype != np.uint8:
        raise TargetCallError(f"image {index}: expected dtype uint8, got {arr.dtype}", code="image_bad_dtype")
    # The declared shape is checked in 64-bit arithmetic before anything is copied: a zero-stride
    # view of 50000x50000 pixels must be refused, not materialised.
    # Grey and RGBA are checked as the (H, W, 3) array they become, like every other decoder.
    shape = (*arr.shape[:2], 3) if arr.ndim in (2, 3) else arr.shape
    problem = check_declared_size(shape, SizeLimits(max_pixels=MAX_IMAGE_PIXELS))
    if problem is not None:
        raise TargetCallError(f"image {index}: {problem.message}", code=problem.code)
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    elif arr.ndim == 3 and arr.shape[2] == 1:
        arr = np.repeat(arr, 3, axis=2)
    elif arr.ndim == 3 and arr.shape[2] == 4:
        arr = arr[:, :, :3]
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise TargetCallError(f"image {index}: expected shape (H, W, 3), got {arr.shape}", code="image_bad_shape")
    return np.ascontiguousarray(arr[:, :, ::-1])


def _reading_order(boxes: Sequence[np.ndarray]) -> list[int]:
    """Indices of quadrilateral boxes, top-to-bottom by line, left-to-right within a line.

    A box joins the current line when its vertical centre lies inside the line's span so far;
    this tolerates the slight skew RapidOCR's own fixed 10-pixel rule does not.
    """
    if not boxes:
        return []
    ys = [(float(b[:, 1].min()), float(b[:, 1].max())) for b in boxes]
    xs = [float(b[:, 0].min()) for b in boxes]
    by_centre = sorted(range(len(boxes)), key=lambda i: ((ys[i][0] + ys[i][1]) / 2, xs[i]))
    lines: list[list[int]] = []
    top = bottom = 0.0
    for i in by_centre:
        centre = (ys[i][0] + ys[i][1]) / 2
        if lines and top <= centre <= bottom:
            lines[-1].append(i)
            bottom = max(bottom, ys[i][1])
        else:
            lines.append([i])
            top, bottom = ys[i]
    return [i for line in lines for i in sorted(line, key=lambda j: xs[j])]


class PPOCRTarget(Target):
    """PP-OCRv4 recognition (and optionally detection) on CPU through ONNX Runtime."""

    capabilities = frozenset({Capability.READ_TEXT, Capability.PREPROCESS})

    def __init__(
        self,
        detect: bool = False,
        *,
        use_cls: bool = False,
        batch_size: int = 1,
        text_score: float = 0.5,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._module = require("rapidocr_onnxruntime")
        self.detect = detect
        self.use_cls = use_cls
        self.batch_size = batch_size
        self.text_score = text_score
        self.uri = "builtin:ppocr-det" if detect else "builtin:ppocr"
        self._package_dir = Path(str(self._module.__file__)).resolve().parent
        self._engine: Any = None
        self._load_lock = threading.Lock()
        self._fingerprint: Fingerprint | None = None

    # -- engine -------------------------------------------------------------------------------

    @property
    def engine(self) -> Any:
        """The ``RapidOCR`` instance, loaded (ONNX sessions created) on first use."""
        if self._engine is None:
            with self._load_lock:
                if self._engine is None:
                    require("onnxruntime")
                    engine = self._module.RapidOCR()
                    engine.text_rec.rec_batch_num = self.batch_size
                    engine.text_score = self.text_score
                    self._engine = engine
        return self._engine

    def close(self) -> None:
        self._engine = None

    # -- capabilities -------------------------------------------------------------------------

    def read_text(self, images: Sequence[ImageArray]) -> list[str]:
        """Recognise the text of each RGB uint8 image; ``""`` when nothing is recognised."""
        bgr = [_to_bgr(img, i) for i, img in enumerate(images)]
        if not bgr:
            return []
        if self.detect:
            return [self._read_page(img) for img in bgr]
        return self._read_lines(bgr)

    def preprocess(self, images: Sequence[ImageArray]) -> list[FloatArray]:
        """The float32 ``(1, 3, H, W)`` tensor the first model sees for each image, alone.

        Recognition-only: the normalised line at height 48, width padded to at least 320, as
        the recogniser gets it with ``batch_size=1``. With ``detect=True``: the detector input.
        """
        engine = self.engine
        out: list[FloatArray] = []
        for i, image in enumerate(images):
            img = _to_bgr(image, i)
            if min(img.shape[:2]) == 0:
                raise TargetCallError(f"image {i} is empty: {img.shape}", code="target_bad_input")
            try:
                img = engine.preprocess(img)[0]
                if self.detect:
                    img, _ = engine.maybe_add_letterbox(img, {})
                    tensor = engine.text_det.get_preprocess(max(img.shape[:2]))(img)
                else:
                    _c, h, w = engine.text_rec.rec_image_shape
                    ratio = max(w / h, img.shape[1] / img.shape[0])
                    tensor = engine.text_rec.resize_norm_img(img, ratio)[np.newaxis]
            except Exception as exc:
                raise TargetCallError(
                    f"PP-OCR cannot preprocess image {i} of shape {image.shape}: {exc!r}",
                    code="target_bad_input",
                ) from exc
            if tensor is None:
                raise TargetCallError(f"PP-OCR rejected image {i}", code="target_bad_input")
            out.append(np.asarray(tensor, dtype=np.float32))
        return out

    def _read_lines(self, images: list[np.ndarray]) -> list[str]:
        engine = self.engine
        texts = [""] * len(images)
        crops: list[np.ndarray] = []
        where: list[int] = []
        for i, img in enumerate(images):
            if min(img.shape[:2]) == 0:
                continue  # an empty image holds no text
            # The resizing RapidOCR's __call__ applies (sides into [30, 2000] pixels).
            try:
                crops.append(engine.preprocess(img)[0])
            except Exception as exc:
                raise TargetCallError(
                    f"PP-OCR cannot resize image {i} of shape {img.shape}: {exc!r}",
                    code="target_bad_input",
                ) from exc
            where.append(i)
        if not crops:
            return texts
        try:
            results, _elapsed = engine.text_rec(crops)
        except Exception as exc:
            raise TargetCallError(f"PP-OCR recognition failed: {exc!r}") from exc
        for i, (text, _score) in zip(where, results, strict=True):
            texts[i] = str(text).strip()
        return texts

    def _read_page(self, img: np.ndarray) -> str:
        if min(img.shape[:2]) == 0:
            return ""
        try:
            result, _elapsed = self.engine(img, use_det=True, use_cls=self.use_cls, use_rec=True)
        except Exception as exc:
            raise TargetCallError(f"PP-OCR detection/recognition failed: {exc!r}") from exc
        if not result:
            return ""
        boxes = [np.asarray(r[0], dtype=np.float32) for r in result]
        texts = [str(r[1]).strip() for r in result]
        return " ".join(texts[i] for i in _reading_order(boxes) if texts[i])

    # -- identity -----------------------------------------------------------------------------

    def fingerprint(self) -> Fingerprint:
        """Hashes of the three ONNX models and RapidOCR's config.yaml, plus versions."""
        if self._fingerprint is None:
            settings = {
                "mode": "det+rec" if self.detect else "rec",
                "use_cls": self.use_cls,
                "batch_size": self.batch_size,
                "text_score": self.text_score,
            }
            config = self._package_dir / "config.yaml"
            self._fingerprint = Fingerprint(
                weights=hash_files([self._package_dir / "models" / f for f in _MODEL_FILES]),
                processor=hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest(),
                config=hash_file(config) if config.is_file() else "",
                versions={name: _version(name) for name in _VERSIONED},
            )
        return self._fingerprint
