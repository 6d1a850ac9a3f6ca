"""Build the executor a run asked for (kept apart from base so base never imports Ray's module)."""

from __future__ import annotations

from mmchaos.executors.base import Executor, ExecutorSpec, TargetSpec

__all__ = ["open_executor"]


def open_executor(spec: ExecutorSpec, target: TargetSpec) -> Executor | None:
    """The executor for a run; None for ``local`` (checks then run units on their own target)."""
    if spec.kind == "local":
        return None
    from mmchaos.executors.ray import RayExecutor

    return RayExecutor(target, workers=spec.workers, address=spec.address)
