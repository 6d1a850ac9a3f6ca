"""The worker side: run one fuzzed input through the target's decoding path and describe what happened.

Runs inside the isolated worker processes of :mod:`mmchaos.executors.pool`. Besides the target's
answer (summarised: shape, finiteness, constancy -- not the vectors), it returns *features*: what
Pillow's reference decoder makes of the input (format, mode, size class, which metadata it
parsed, or which error it raised) and what the target did (typed rejection code, output shape).
A feature never seen before is the novelty signal that keeps an input in the fuzzing queue.
"""

from __future__ import annotations

import io
import re
import time
import unicodedata
import warnings
from typing import Any

import numpy as np

from mmchaos.executors.jobs import WorkerSpec, describe_exception
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import GenerationParams

__all__ = ["ROUTES", "fuzz_job", "method_for", "normalise_message", "probe_features", "summarise_output"]

ROUTES: dict[str, tuple[tuple[Capability, str], ...]] = {
    "image_bytes": (
        (Capability.EMBED_IMAGE, "embed_encoded_images"),
        (Capability.READ_TEXT, "read_encoded_images"),
        (Capability.GENERATE, "generate_encoded_images"),
    ),
    "text_bytes": ((Capability.EMBED_TEXT, "embed_encoded_texts"),),
}

GENERATE_PROMPT = "Describe the image in a few words."
"""What a generative target is asked about each fuzzed image (one greedy request per image)."""


def _generate_encoded_images(target: Target, blobs: list[bytes]) -> list[str]:
    params = GenerationParams(max_new_tokens=16, temperature=0.0)
    return [target.generate_encoded(GENERATE_PROMPT, [blob], params).text for blob in blobs]


_PROBE_MAX_PIXELS = 4_000_000
"""The reference probe decodes pixels only below this many (a fuzzed header may declare billions)."""


def method_for(capabilities: frozenset[Capability], kind: str) -> str | None:
    """The target method that takes inputs of ``kind``, or None when the target has none."""
    for cap, method in ROUTES.get(kind, ()):
        if cap in capabilities:
            return method
    return None


def normalise_message(message: str, limit: int = 60) -> str:
    """An error message with its numbers and quoted values blanked, so one bug gives one signature."""
    text = re.sub(r"0x[0-9a-fA-F]+", "X", message)
    text = re.sub(r"\d+", "N", text)
    text = re.sub(r"'[^']{0,40}'|\"[^\"]{0,40}\"", "'…'", text)
    text = re.sub(r"b'…'", "'…'", text)
    return " ".join(text.split())[:limit]


def _bucket(n: int) -> int:
    return int(n).bit_length()


def probe_features(kind: str, data: bytes) -> list[str]:
    """What the reference decoder sees in ``data`` (cheap: pixels only for small declared sizes)."""
    if kind == "text_bytes":
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return [f"utf8:{exc.reason}", f"len:{_bucket(len(data))}"]
        cats = sorted({unicodedata.category(c) for c in text[:4096]})
        return ["utf8:ok", f"len:{_bucket(len(text))}", *(f"cat:{c}" for c in cats)]
    from PIL import Image

    feats: list[str] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as img:
                w, h = img.size
                feats += [f"fmt:{img.format}:{img.mode}", f"size:{_bucket(w)}x{_bucket(h)}"]
                feats += [f"info:{img.format}:{k}" for k in sorted(img.info) if isinstance(k, str)]
                if getattr(img, "n_frames", 1) > 1:
                    feats.append("animated")
                orientation = img.getexif().get(0x0112)
                if orientation is not None:
                    feats.append(f"orientation:{orientation if 1 <= int(orientation) <= 8 else 'out_of_range'}")
                if w * h <= _PROBE_MAX_PIXELS:
                    img.load()
                    feats.append(f"decoded:{img.format}")
                else:
                    feats.append("declared_large")
    except Exception as exc:  # every way of failing is a feature
        feats.append(f"pil_error:{type(exc).__name__}:{normalise_message(str(exc), 40)}")
    return feats


def summarise_output(out: Any) -> dict[str, Any]:
    """The facts about an answer that judge it (shape, finiteness, constancy), not the answer."""
    if isinstance(out, list | tuple) and all(isinstance(x, str) for x in out):
        return {"type": "texts", "n": len(out), "lengths": [len(x) for x in out][:4]}
    try:
        arr = np.asarray(out)
    except Exception:
        return {"type": "other", "repr": repr(out)[:200]}
    summary: dict[str, Any] = {"type": "array", "shape": list(arr.shape), "dtype": str(arr.dtype)}
    if np.issubdtype(arr.dtype, np.number) and arr.size:
        vec = arr.astype(np.float64).reshape(arr.shape[0] if arr.ndim else 1, -1)
        summary["nonfinite"] = int((~np.isfinite(vec)).sum())
        finite = np.where(np.isfinite(vec), vec, 0.0)
        summary["all_zero"] = bool(not np.any(finite)) and summary["nonfinite"] == 0
        summary["constant"] = bool(vec.shape[1] > 1 and np.all(np.ptp(finite, axis=1) == 0.0))
    return summary


def fuzz_job(target: Target, spec: WorkerSpec, payload: tuple[str, Any]) -> dict[str, Any]:
    """Worker handler: ``("warmup", None)``, or ``(kind, bytes)`` run through the decoding path."""
    kind, data = payload
    if kind == "warmup":
        return {"warmup": True}
    method = method_for(target.capabilities, kind)
    if method is None:
        return {"not_applicable": True}
    feats = probe_features(kind, data)
    start = time.perf_counter()
    try:
        if method == "generate_encoded_images":
            out: Any = _generate_encoded_images(target, [data])
        else:
            out = getattr(target, method)([data])
    except Exception as exc:
        err = describe_exception(exc, spec.accepted_errors)
        feats.append(f"target:{'rejected' if err.typed else 'raised'}:{err.type}:{err.code}")
        return {"status": "raised", "error": err, "seconds": time.perf_counter() - start, "method": method,
                "features": feats}  # fmt: skip
    summary = summarise_output(out)
    feats.append(f"target:ok:{summary.get('type')}:{summary.get('shape', summary.get('n'))}")
    return {"status": "ok", "summary": summary, "seconds": time.perf_counter() - start, "method": method,
            "features": feats}  # fmt: skip
