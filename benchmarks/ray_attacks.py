"""Wall time of the step-3 attack checks (white-box PGD, black-box Square Attack) run in process,
on Ray with 1 worker and with 2 workers, and the per-unit overhead of Ray for these attack batches.

Ray starts once and its actors load the target before the clock runs (both reported apart); each
executor then runs the same checks and seed warm (after one untimed run), and the findings are
compared (they must be identical). Per-unit overhead: (Ray 1 worker - local 1 thread) / units.

    PYTHONPATH=src python benchmarks/ray_attacks.py [--target builtin:tiny-clip] [--samples 16] [--default-threads]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from _ray_bench import start as start_ray
from _ray_bench import torch_threads

from mmchaos.checks.base import CheckContext
from mmchaos.executors.ray import RayExecutor
from mmchaos.suites import SuiteSpec, build_checks


def suite(samples: int, batch: int, steps: int) -> SuiteSpec:
    whitebox = {"samples": samples, "batch_size": batch, "eps": [2, 8], "steps": steps, "masking_queries": 20}
    blackbox = {"samples": samples, "batch_size": batch, "eps": [4], "queries_per_sample": 40}
    return SuiteSpec.model_validate({"name": "ray-attacks", "seed": 0, "checks": [
        {"check": "adversarial_whitebox", "params": whitebox},
        {"check": "adversarial_blackbox", "params": blackbox},
    ]})  # fmt: skip


def units(samples: int, batch: int) -> dict[str, int]:
    """Attack batches per check (one shape): whitebox 2 eps + the masking comparison, blackbox 1 eps."""
    batches = -(-samples // batch)
    return {"adversarial_whitebox": 3 * batches, "adversarial_blackbox": batches}


def run_checks(checks: Any, target: Any, dataset: Any, executor: Any) -> tuple[dict[str, float], list[Any]]:
    walls, findings = {}, []
    for check_id, check in checks:
        ctx = CheckContext(target=target, dataset=dataset, seed=0, check_id=check_id, executor=executor)
        start = time.perf_counter()
        findings += [f.to_dict() for f in check.run(ctx)]
        walls[check_id] = round(time.perf_counter() - start, 2)
    return walls, findings


def measure(
    name: str, checks: Any, target: Any, dataset: Any, executor: Any, *, repeats: int = 1, warm: bool = True
) -> dict[str, Any]:
    """The best of ``repeats`` runs of the checks (after one untimed run when ``warm``)."""
    if warm:  # imports, the image path, the actors' first calls
        run_checks(checks, target, dataset, executor)
    runs = [run_checks(checks, target, dataset, executor) for _ in range(repeats)]
    walls = {check_id: min(w[check_id] for w, _ in runs) for check_id in runs[0][0]}
    row = {"executor": name, **walls, "findings": runs[0][1]}
    assert all(f == runs[0][1] for _, f in runs), "a check gave different findings on a second run"
    print(json.dumps({k: v for k, v in row.items() if k != "findings"}), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="builtin:tiny-clip")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per executor (the best is kept)")
    parser.add_argument("--default-threads", action="store_true", help="also time local with torch's default threads")
    args = parser.parse_args()
    ray, ray_start, target, spec, default_threads = start_ray(args.target)
    from mmchaos.data import load_dataset

    dataset = load_dataset(spec.data)
    checks = build_checks(suite(args.samples, args.batch, args.steps))
    before = torch_threads(1)  # a Ray actor gets 1 CPU, so torch runs 1 thread there
    name = "local-1-thread" if before is not None else "local"
    rows = [measure(name, checks, target, dataset, None, repeats=args.repeats)]
    if before is not None and args.default_threads:  # warm already; slow on a loaded machine: timed once
        torch_threads(default_threads)  # torch's default (the built-ins load at 1 thread)
        rows.insert(0, measure("local", checks, target, dataset, None, warm=False))
    starts = {}
    try:
        for workers in (1, 2):
            start = time.perf_counter()
            with RayExecutor(spec, workers=workers) as executor:
                starts[workers] = time.perf_counter() - start
                rows.append(measure(f"ray-{workers}", checks, target, dataset, executor, repeats=args.repeats))
    finally:
        ray.shutdown()
        target.close()
    same = all(r["findings"] == rows[0]["findings"] for r in rows)
    n_units = units(args.samples, args.batch)
    print(f"\nray start-up (local, 2 CPUs): {ray_start:.1f} s; actors up (load the target): "
          f"1 worker {starts[1]:.1f} s, 2 workers {starts[2]:.1f} s")  # fmt: skip
    names = list(n_units)
    print("| executor | " + " | ".join(f"{n} wall s" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for r in rows:
        print(f"| {r['executor']} | " + " | ".join(str(r[n]) for n in names) + " |")
    by = {r["executor"]: r for r in rows}
    base = by["local-1-thread"] if "local-1-thread" in by else by["local"]
    for n in names:
        per = 1000 * (by["ray-1"][n] - base[n]) / n_units[n]
        print(f"{n}: {n_units[n]} units; per-unit Ray overhead (ray-1 - local 1 thread) {per:.1f} ms; "
              f"ray-2 vs ray-1 {by['ray-1'][n] / by['ray-2'][n]:.2f}x")  # fmt: skip
    print(f"findings identical across executors: {same}")


if __name__ == "__main__":
    main()
