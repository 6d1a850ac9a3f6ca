"""mmchaos: find out how a multimodal inference deployment breaks before its users do."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
