"""Where low precision's error grows: each leaf module's output error against fp32, for one input.

An fp16/bf16 deployment can drift without a single NaN: a layer that adds a large offset and a
later one that takes it away again (catastrophic cancellation), or a LayerNorm over activations
whose small differences fp16 cannot hold. The embedding's cosine to fp32 says *that* it drifted;
this says *where*: the same input runs once in fp32 and once in the low precision under forward
hooks on every leaf module, and each module's output is compared with its fp32 twin. The module
whose output error exceeds its input's by the most is where the error grows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mmchaos._lazy import require

__all__ = ["ModuleTrace", "layer_errors", "tensors_in", "trace_leaf_modules"]

MAX_TRACE_BYTES = 256 << 20
"""Activations kept per pass; past it later modules are not traced (the trace says so)."""


@dataclass
class ModuleTrace:
    """One leaf module call: its name, type, and first floating input and output (as fp32)."""

    name: str
    module_type: str
    input: Any
    output: Any


def tensors_in(obj: Any) -> list[Any]:
    torch = require("torch")
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_in(v)]
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in tensors_in(v)]
    if hasattr(obj, "to_tuple"):
        return tensors_in(obj.to_tuple())
    return []


def trace_leaf_modules(module: Any, call: Callable[[], Any]) -> tuple[list[ModuleTrace], bool]:
    """Run ``call`` with hooks on every leaf module; (the calls in execution order, truncated?)."""
    kept: list[ModuleTrace] = []
    size = [0, False]

    def first_float(obj: Any) -> Any:
        floats = [t for t in tensors_in(obj) if t.is_floating_point()]
        return floats[0].detach().float().clone() if floats else None

    def hook(name: str) -> Callable[[Any, Any, Any], None]:
        def fn(mod: Any, inputs: Any, output: Any) -> None:
            if size[1]:
                return
            x, y = first_float(inputs), first_float(output)
            size[0] += sum(int(t.numel()) * 4 for t in (x, y) if t is not None)
            if size[0] > MAX_TRACE_BYTES:
                size[1] = True
                return
            kept.append(ModuleTrace(name, type(mod).__name__, x, y))

        return fn

    leaves = [(n, m) for n, m in module.named_modules() if n and next(iter(m.children()), None) is None]
    handles = [m.register_forward_hook(hook(n)) for n, m in leaves]
    try:
        call()
    finally:
        for h in handles:
            h.remove()
    return kept, bool(size[1])


def _relative_error(low: Any, ref: Any) -> float | None:
    """||low - ref|| / ||ref|| (None when either is absent, shapes differ or low is not finite)."""
    torch = require("torch")
    if low is None or ref is None or low.shape != ref.shape or not bool(torch.isfinite(low).all()):
        return None
    denom = float(ref.norm())
    return float((low - ref).norm()) / denom if denom > 0 else float((low - ref).norm())


def layer_errors(reference: list[ModuleTrace], low: list[ModuleTrace], top: int = 5) -> dict[str, Any]:
    """Each module's output error against fp32 and the module where it grows most (JSON-able).

    The two traces come from the same input, so the same modules ran in the same order; where they
    differ in length (a data-dependent branch) only the common prefix is compared.
    """
    rows: list[dict[str, Any]] = []
    for ref, lo in zip(reference, low, strict=False):
        if ref.name != lo.name:
            break
        out_err = _relative_error(lo.output, ref.output)
        if out_err is None:
            continue
        in_err = _relative_error(lo.input, ref.input) or 0.0  # integer inputs (token ids) are exact
        rows.append({"module": ref.name, "type": ref.module_type, "input_error": in_err, "output_error": out_err})
    if not rows:
        return {"modules_compared": 0}
    growth = max(rows, key=lambda r: r["output_error"] - r["input_error"])
    worst = sorted(rows, key=lambda r: r["output_error"] - r["input_error"], reverse=True)[:top]
    return {
        "modules_compared": len(rows),
        "final_output_error": rows[-1]["output_error"],
        "growth": growth,
        "largest_growth": worst,
    }
