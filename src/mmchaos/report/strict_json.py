"""Strict JSON for every report file: no ``NaN``/``Infinity`` tokens, which JSON.parse rejects.

A non-finite number becomes ``null`` and its path is recorded with the value it had, so a reader
can tell "not measured" from "the measurement was NaN".
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["dumps", "replace_non_finite"]


def _spell(x: float) -> str:
    return "NaN" if math.isnan(x) else "Infinity" if x > 0 else "-Infinity"


def replace_non_finite(value: Any, path: str = "") -> tuple[Any, dict[str, str]]:
    """``value`` with every NaN/±Inf float replaced by None, and ``{path: "NaN"|"Infinity"|"-Infinity"}``."""
    reasons: dict[str, str] = {}

    def walk(v: Any, at: str) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            reasons[at] = _spell(v)
            return None
        if isinstance(v, dict):
            return {k: walk(x, f"{at}.{k}" if at else str(k)) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x, f"{at}[{i}]") for i, x in enumerate(v)]
        return v

    return walk(value, path), reasons


def dumps(doc: Any, *, indent: int | None = 2) -> str:
    """``json.dumps`` that refuses non-finite numbers instead of writing invalid JSON."""
    return json.dumps(doc, indent=indent, allow_nan=False)
