"""Wall time of one robustness sweep run in process, on Ray with 1 worker and with 2 workers,
and the per-task overhead of Ray for this workload.

Ray starts once and its actors load the target before the clock runs (both reported apart);
each executor then runs the same check and seed warm (after one untimed run), and the findings
are compared (they must be identical). Per-task overhead is measured two ways: a no-op unit sent
through the executor (pure dispatch), and (Ray 1 worker - local) check wall over the units.

    python benchmarks/ray_executor.py [--target builtin:tiny-clip] [--samples 96]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from _ray_bench import start as start_ray
from _ray_bench import torch_threads

from mmchaos.checks.base import CheckContext
from mmchaos.executors import LocalExecutor, Worker
from mmchaos.executors.ray import RayExecutor
from mmchaos.suites import SuiteSpec, build_checks


def _noop(worker: Worker, shared: None, unit: int) -> int:
    return unit


def suite(samples: int, shard: int) -> SuiteSpec:
    params = {
        "samples": samples,
        "shard_size": shard,
        "severities": [1, 3],
        "perturbations": ["gaussian_noise", "defocus_blur", "keyboard_typo"],
        "worst_cases": 3,
    }
    return SuiteSpec.model_validate({"name": "ray-bench", "seed": 0, "checks": [{"check": "robustness",
                                                                                 "params": params}]})  # fmt: skip


def sweep(check: Any, target: Any, dataset: Any, executor: Any) -> tuple[float, list[dict[str, Any]]]:
    """Run the robustness check once on ``executor`` (None: in process); wall seconds and findings."""
    ctx = CheckContext(target=target, dataset=dataset, seed=0, check_id="robustness", executor=executor)
    start = time.perf_counter()
    findings = [f.to_dict() for f in check.run(ctx)]
    return time.perf_counter() - start, findings


def measure(name: str, check: Any, target: Any, dataset: Any, executor: Any, repeats: int) -> dict[str, Any]:
    """The best of ``repeats`` warm runs (the first run of a process pays imports and warm-up)."""
    sweep(check, target, dataset, executor)
    runs = [sweep(check, target, dataset, executor) for _ in range(repeats)]
    return {"executor": name, "check_s": round(min(w for w, _ in runs), 2), "findings": runs[0][1]}


def dispatch_overhead(executor: Any, worker: Worker, n: int) -> tuple[float, float]:
    """Seconds per no-op unit: in process, and through ``executor``."""
    start = time.perf_counter()
    list(LocalExecutor(worker).map(_noop, None, list(range(n))))
    local = (time.perf_counter() - start) / n
    list(executor.map(_noop, None, list(range(10))))  # warm
    start = time.perf_counter()
    list(executor.map(_noop, None, list(range(n))))
    return local, (time.perf_counter() - start) / n


def _dataset(spec: str) -> Any:
    from mmchaos.data import load_dataset

    return load_dataset(spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="builtin:tiny-clip")
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--shard", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    ray, ray_start, target, spec, default_threads = start_ray(args.target)
    dataset = _dataset(spec.data)
    ((_, check),) = build_checks(suite(args.samples, args.shard))
    loaded_threads = torch_threads(default_threads)  # torch's default (the built-ins load at 1 thread)
    rows = [measure("local", check, target, dataset, None, args.repeats)]
    print(json.dumps({k: v for k, v in rows[-1].items() if k != "findings"}), flush=True)
    if torch_threads(1) is not None:  # a Ray actor gets 1 CPU, so torch runs 1 thread there
        rows.append(measure("local-1-thread", check, target, dataset, None, args.repeats))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "findings"}), flush=True)
    torch_threads(loaded_threads)
    starts = {}
    try:
        for workers in (1, 2):
            start = time.perf_counter()
            with RayExecutor(spec, workers=workers) as executor:
                starts[workers] = time.perf_counter() - start
                rows.append(measure(f"ray-{workers}", check, target, dataset, executor, args.repeats))
                if workers == 1:
                    local_noop, ray_noop = dispatch_overhead(executor, Worker(target, dataset), 200)
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "findings"}), flush=True)
    finally:
        ray.shutdown()
        target.close()
    units = _units(args.samples, args.shard)
    same = all(r["findings"] == rows[0]["findings"] for r in rows)
    by = {r["executor"]: r["check_s"] for r in rows}
    local, one, two = by.get("local-1-thread", by["local"]), by["ray-1"], by["ray-2"]
    print(
        f"\nray start-up (local cluster, 2 CPUs): {ray_start:.1f} s; actors up (load the target): "
        f"1 worker {starts[1]:.1f} s, 2 workers {starts[2]:.1f} s"
    )
    print("| executor | robustness check wall s (warm) | speed-up vs local |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['executor']} | {r['check_s']} | {by['local'] / r['check_s']:.2f}x |")
    print(f"\nunits in the sweep: {units}; findings identical across executors: {same}")
    print(f"per-task overhead, (ray-1 - local, both 1 thread) / units: {1000 * (one - local) / units:.1f} ms")
    print(f"per-task dispatch, no-op unit: local {1e6 * local_noop:.1f} us, ray {1000 * ray_noop:.2f} ms")
    print(f"ray-2 vs ray-1: {one / two:.2f}x")


def _units(samples: int, shard: int) -> int:
    """Units of the benchmark sweep: 2 clean tasks + 3 perturbations x 2 severities, per shard."""
    shards = -(-samples // shard)
    return shards * (2 + 3 * 2)


if __name__ == "__main__":
    main()
