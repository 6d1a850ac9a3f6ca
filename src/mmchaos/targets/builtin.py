"""The targets that ship inside mmchaos and load offline."""

from __future__ import annotations

from pathlib import Path

from mmchaos.targets.base import Target

__all__ = ["BUILTIN_TARGETS", "TINY_CLIP_DIR", "TINY_VLM_DIR", "TORCH_BUILTINS", "load_builtin"]

TINY_CLIP_DIR = Path(__file__).resolve().parent.parent / "models" / "tiny-clip"
TINY_VLM_DIR = Path(__file__).resolve().parent.parent / "models" / "tiny-vlm"
BUILTIN_TARGETS = {
    "tiny-clip": "a 0.4M-parameter CLIPModel trained here on the shapes data (embeds images and texts)",
    "tiny-vlm": "a LLaVA VLM (tiny-clip's vision tower, a tiny Llama) trained here to answer questions about "
    "the shapes data (generates)",
    "ppocr": "PP-OCRv4 text-line recognizer from rapidocr-onnxruntime (reads text)",
    "ppocr-det": "PP-OCRv4 detection + recognition pipeline (reads text in whole images; slow)",
}
TORCH_BUILTINS = frozenset({"tiny-clip", "tiny-vlm"})
"""The built-ins that run on torch (and so take ``device`` and ``threads``); the others run on ONNX Runtime."""


def load_builtin(name: str, *, device: str = "cpu", threads: int | None = None, **_: object) -> Target:
    """Load a built-in target. The tiny torch models set torch to ``threads`` intra-op threads
    (default :data:`~mmchaos.targets.threads.TINY_MODEL_THREADS`: one; see :mod:`mmchaos.targets.threads`)."""
    from mmchaos.targets.threads import TINY_MODEL_THREADS, apply_threads

    if name == "tiny-clip":
        from mmchaos.targets.hf import HFContrastiveTarget

        clip = HFContrastiveTarget(str(TINY_CLIP_DIR), uri="builtin:tiny-clip", device=device)
        apply_threads(threads, TINY_MODEL_THREADS)
        return clip
    if name == "tiny-vlm":
        from mmchaos.targets.hf_vlm import HFVisionLanguageTarget

        vlm = HFVisionLanguageTarget(TINY_VLM_DIR, uri="builtin:tiny-vlm", device=device)
        apply_threads(threads, TINY_MODEL_THREADS)
        return vlm
    from mmchaos.targets.ppocr import PPOCRTarget

    return PPOCRTarget(detect=name == "ppocr-det")
