"""What the Ray benchmarks share: a local Ray of 2 CPUs, the target loaded once in this process,
and torch's intra-op thread count (a Ray actor gets one CPU, so torch runs one thread there).

The built-in tiny models set torch to one thread when they load (``mmchaos.targets.threads``), so
a row that measures "torch's default threads" must set the default back explicitly: the default
is read here before the target loads.
"""

from __future__ import annotations

import time
from typing import Any

from mmchaos.executors import TargetSpec
from mmchaos.executors.ray import require_ray
from mmchaos.runner import default_data
from mmchaos.targets import TargetOptions, load_target


def torch_threads(n: int | None) -> int | None:
    """Set torch's intra-op threads to ``n`` (None: leave them); the previous count (None without torch)."""
    try:
        import torch
    except ImportError:
        return None
    before = int(torch.get_num_threads())
    if n is not None:
        torch.set_num_threads(n)
    return before


def start(target_uri: str) -> tuple[Any, float, Any, TargetSpec, int | None]:
    """(ray, its start-up seconds, the target loaded here, its spec, torch's default thread count)."""
    ray = require_ray()
    began = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray_start = time.perf_counter() - began
    default_threads = torch_threads(None)
    target = load_target(target_uri)
    return ray, ray_start, target, TargetSpec(target_uri, TargetOptions(), default_data(target)), default_threads
