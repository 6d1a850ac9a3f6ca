"""Cases/s and time to first failure of ``contract_fuzz`` on the planted-bug targets, default budget.

    PYTHONPATH=src:. python benchmarks/fuzz_planted.py [--seeds 0 1 2] [--targets orientation_table splt_crash]

Each run is the check with its default parameters (3000 cases, 60 s, 2 workers) except that it
stops at the first distinct failure; the table gives the cases and seconds it took, the
throughput, and the minimised reproducer's size. A correct twin (``contract_safe``) is run for
throughput over the whole default case budget with ``--clean``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from mmchaos.checks.base import CheckContext
from mmchaos.checks.contract.fuzz import ContractFuzz, ContractFuzzParams
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Verdict


def _target(name: str) -> object:
    module = "tests.fakes.broken_targets" if name == "contract_safe" else "tests.fakes.fuzz_targets"
    return getattr(importlib.import_module(module), name)()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=["orientation_table", "splt_crash"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--no-novelty", action="store_true", help="mutate the seeds only (guidance off)")
    parser.add_argument("--clean", action="store_true", help="also run the correct twin over the full case budget")
    args = parser.parse_args()
    data = make_shapes(4, seed=1)
    print("| target | run seed | cases to first failure | s to first failure | cases/s | minimised bytes | wall s |")
    print("|---|---|---|---|---|---|---|")
    runs = [(t, s, 1) for t in args.targets for s in args.seeds]
    if args.clean:
        runs.append(("contract_safe", 0, 0))
    for name, seed, stop in runs:
        ctx = CheckContext(target=_target(name), dataset=data, seed=seed, check_id="contract_fuzz")  # type: ignore[arg-type]
        start = time.perf_counter()
        findings = list(
            ContractFuzz(ContractFuzzParams(stop_after_failures=stop, novelty=not args.no_novelty)).run(ctx)
        )
        wall = time.perf_counter() - start
        summary = next(f for f in findings if f.verdict == Verdict.PASS)
        fail = next((f for f in findings if f.verdict == Verdict.FAIL), None)
        m = summary.metrics
        first = f"{m['cases_to_first_failure']:.0f}" if fail else "-"
        first_s = f"{m['time_to_first_failure_s']:.2f}" if fail else "-"
        size = str(fail.evidence["minimised_bytes"]) if fail else "-"
        print(f"| {name} | {seed} | {first} | {first_s} | {m['cases_per_s']:.0f} | {size} | {wall:.1f} |", flush=True)


if __name__ == "__main__":
    main()
