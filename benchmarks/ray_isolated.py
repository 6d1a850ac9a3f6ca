"""Wall time of the contract check (the whole hostile-input corpus) and of contract_fuzz (a fixed case
budget) run locally and on Ray with 1 and 2 workers, the per-job overhead of Ray, and whether the
findings are identical.

Locally the jobs run in the run's worker pool (1 or 2 processes); on Ray each actor runs them in a
one-worker pool of its own. Every executor runs each check once untimed (pools start, workers load
the target and warm up), then timed. Per-job overhead: (Ray 1 worker - local 1 worker) / jobs.

    PYTHONPATH=src:. python benchmarks/ray_isolated.py [--target URI] [--fuzz-cases 400]

(default target: py:tests.fakes.broken_targets:contract_safe, a numpy target: the harness's cost shows.)
"""

from __future__ import annotations

import argparse
import json
import re
import time
from typing import Any

from _ray_bench import start as start_ray

from mmchaos.checks.base import CheckContext
from mmchaos.checks.contract.contract import Contract, ContractParams
from mmchaos.checks.contract.fuzz import ContractFuzz, ContractFuzzParams
from mmchaos.data import load_dataset
from mmchaos.executors.ray import RayExecutor
from mmchaos.executors.resources import RunResources
from mmchaos.runner import TimedTarget

_MEASURED = re.compile(r"seconds|_s$|per_s|rss_growth|load_seconds")


def stable(finding: dict[str, Any]) -> dict[str, Any]:
    """A finding without its measured values (wall times, memory peaks): what must match across executors."""
    out = dict(finding)
    out["metrics"] = {k: v for k, v in finding["metrics"].items() if not _MEASURED.search(k)}
    out["evidence"] = {k: v for k, v in finding["evidence"].items() if k not in ("found_after_s", "worker_stderr")}
    out["title"] = re.sub(r" in [\d.]+ s \(\d+/s\)", "", finding["title"])
    return out


def timed_run(check: Any, check_id: str, target: Any, dataset: Any, executor: Any, resources: Any) -> tuple[float, Any]:
    ctx = CheckContext(target=TimedTarget(target), dataset=dataset, seed=0, check_id=check_id, executor=executor,
                       resources=resources)  # fmt: skip
    start = time.perf_counter()
    findings = [f.to_dict() for f in check.run(ctx)]
    return time.perf_counter() - start, findings


def measure(
    name: str, checks: dict[str, Any], target: Any, dataset: Any, executor: Any, resources: Any
) -> dict[str, Any]:
    row: dict[str, Any] = {"executor": name}
    for check_id, check in checks.items():
        timed_run(check, check_id, target, dataset, executor, resources)  # pools start, workers warm up
        wall, findings = timed_run(check, check_id, target, dataset, executor, resources)
        row[check_id] = round(wall, 2)
        row[f"{check_id}_jobs"] = int(findings[-1]["metrics"].get("n_cases", findings[-1]["metrics"].get("cases", 0)))
        row[f"{check_id}_findings"] = [stable(f) for f in findings]
    print(json.dumps({k: v for k, v in row.items() if not k.endswith("_findings")}), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="py:tests.fakes.broken_targets:contract_safe")
    parser.add_argument("--fuzz-cases", type=int, default=400)
    args = parser.parse_args()
    ray, ray_start, target, spec, _ = start_ray(args.target)
    dataset = load_dataset(spec.data)
    fuzz = {"max_cases": args.fuzz_cases, "max_seconds": 600, "minimise": False}

    def checks(workers: int) -> dict[str, Any]:
        return {
            "contract": Contract(ContractParams(workers=workers)),
            "contract_fuzz": ContractFuzz(ContractFuzzParams(workers=workers, **fuzz)),
        }

    rows = []
    try:
        for workers in (1, 2):
            resources = RunResources()  # the run's shared pool, started once per pool size
            try:
                rows.append(measure(f"local-{workers}", checks(workers), target, dataset, None, resources))
            finally:
                resources.close()
        starts = {}
        for workers in (1, 2):
            start = time.perf_counter()
            with RayExecutor(spec, workers=workers) as executor:
                starts[workers] = time.perf_counter() - start
                rows.append(measure(f"ray-{workers}", checks(workers), target, dataset, executor, None))
    finally:
        ray.shutdown()
        target.close()
    by = {r["executor"]: r for r in rows}
    print(f"\nray start-up (local, 2 CPUs): {ray_start:.1f} s; actors up: 1 worker {starts[1]:.1f} s, "
          f"2 workers {starts[2]:.1f} s (plus each actor's worker process, started on first use)")  # fmt: skip
    print("| executor | contract wall s | contract_fuzz wall s |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['executor']} | {r['contract']} | {r['contract_fuzz']} |")
    for check_id in ("contract", "contract_fuzz"):
        jobs = by["local-1"][f"{check_id}_jobs"]
        same = all(by[f"ray-{w}"][f"{check_id}_findings"] == by[f"local-{w}"][f"{check_id}_findings"] for w in (1, 2))
        over = 1000 * (by["ray-1"][check_id] - by["local-1"][check_id]) / max(1, jobs)
        print(f"{check_id}: {jobs} jobs; findings identical, local vs Ray (same workers): {same}; "
              f"per-job overhead of Ray (ray-1 - local-1) / jobs: {over:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
