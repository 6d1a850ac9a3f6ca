"""Work units for forked unit workers (tests/integration/executors/test_forked_units.py)."""

from __future__ import annotations

import ctypes
import os
from typing import Any

from mmchaos.errors import DataError


def embed_rows(worker: Any, shared: dict[str, Any], unit: tuple[int, int]) -> dict[str, Any]:
    """The worker's pid and the image embeddings of rows ``unit`` of the worker's dataset, scaled by
    ``shared["scale"]`` (so the shared value is seen to arrive)."""
    start, stop = unit
    images = [worker.dataset[i].image for i in range(start, stop)]
    return {"pid": os.getpid(), "embedding": (worker.target.embed_images(images) * shared["scale"]).tolist()}


def misbehave(worker: Any, shared: Any, unit: str) -> Any:
    """``ok``: the pid; ``raise``: a typed error with its code; ``segv``: a crashing C extension;
    ``unpicklable``: a result that cannot cross the pipe."""
    if unit == "raise":
        raise DataError("unit 'raise' refused its rows", code="data_invalid")
    if unit == "segv":
        ctypes.string_at(0)
    if unit == "unpicklable":
        return lambda: None
    return os.getpid()
