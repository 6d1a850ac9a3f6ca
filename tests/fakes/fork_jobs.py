"""Jobs for pool workers forked from a fork server (tests/integration/executors/test_fork_server.py)."""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any


def job(target: Any, spec: Any, payload: str) -> Any:
    """``embed``: the worker's pid and an embedding; ``segv``: a crashing C extension; ``hang``: no answer."""
    if payload == "segv":
        ctypes.string_at(0)
    if payload == "hang":
        time.sleep(600)
    import torch

    return {
        "pid": os.getpid(),
        "threads": torch.get_num_threads(),
        "embedding": target.embed_texts(["a red circle"]).tolist(),
    }
