"""Import heavy optional dependencies on first use, with an install hint when missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from mmchaos.errors import MissingDependencyError

_EXTRA_OF = {
    "torch": "torch",
    "transformers": "torch",
    "safetensors": "torch",
    "tokenizers": "torch",
    "rapidocr_onnxruntime": "ocr",
    "onnxruntime": "onnx",
    "onnx": "onnx",
}


def require(module: str) -> ModuleType:
    """Import ``module`` or raise a MissingDependencyError naming the extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        extra = _EXTRA_OF.get(top)
        hint = f'pip install "mmchaos[{extra}]"' if extra else f"pip install {top}"
        if top == "torch":
            hint = 'pip install torch==2.13.0 && pip install "mmchaos[torch]"'
        raise MissingDependencyError(f"{module} is not installed ({exc}); install it with: {hint}") from exc
