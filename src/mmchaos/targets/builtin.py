"""The targets that ship inside mmchaos and load offline."""

from __future__ import annotations

from pathlib import Path

from mmchaos.targets.base import Target

__all__ = ["BUILTIN_TARGETS", "TINY_CLIP_DIR", "load_builtin"]

TINY_CLIP_DIR = Path(__file__).resolve().parent.parent / "models" / "tiny-clip"
BUILTIN_TARGETS = {
    "tiny-clip": "a 0.4M-parameter CLIPModel trained here on the shapes data (embeds images and texts)",
    "ppocr": "PP-OCRv4 text-line recognizer from rapidocr-onnxruntime (reads text)",
    "ppocr-det": "PP-OCRv4 detection + recognition pipeline (reads text in whole images; slow)",
}


def load_builtin(name: str, *, device: str = "cpu", **_: object) -> Target:
    if name == "tiny-clip":
        from mmchaos.targets.hf import HFContrastiveTarget

        return HFContrastiveTarget(str(TINY_CLIP_DIR), uri="builtin:tiny-clip", device=device)
    from mmchaos.targets.ppocr import PPOCRTarget

    return PPOCRTarget(detect=name == "ppocr-det")
