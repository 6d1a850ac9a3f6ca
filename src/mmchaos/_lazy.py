"""Import heavy optional dependencies on first use, with an install hint when missing."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from mmchaos.errors import MissingDependencyError

_EXTRA_OF = {
    "torch": "torch",
    "transformers": "torch",
    "safetensors": "torch",
    "tokenizers": "torch",
    "rapidocr_onnxruntime": "ocr",
    "onnxruntime": "onnx",
    "onnx": "onnx",
    "pypdfium2": "pdf",
    "reportlab": "pdf",
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


def lazy_exports(
    package: str, module_of: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` that import each exported name on first use.

    ``module_of`` maps exported names to the module that defines them; ``namespace`` is the
    package's ``globals()``, where a loaded name is cached so the import happens once.
    """

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
