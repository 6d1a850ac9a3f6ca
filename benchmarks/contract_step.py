"""Wall time of step 1 (the contract check over the whole hostile-input corpus) per built-in target.

    python benchmarks/contract_step.py [--targets builtin:tiny-clip builtin:ppocr]

The issue's budget: under 2 minutes on 2 cores for builtin:tiny-clip (worker pool, not one
process per input).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from mmchaos.checks.base import CheckContext
from mmchaos.checks.contract.contract import Contract
from mmchaos.data import load_dataset
from mmchaos.findings import Verdict
from mmchaos.runner import default_data
from mmchaos.targets import load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=["builtin:tiny-clip", "builtin:ppocr"])
    args = parser.parse_args()
    print("| target | cases | failed | seconds |")
    print("|---|---|---|---|")
    for uri in args.targets:
        target = load_target(uri)
        data = load_dataset(default_data(target) + "?n=8")
        ctx = CheckContext(target=target, dataset=data, seed=0, check_id="contract")
        start = time.perf_counter()
        findings = list(Contract().run(ctx))
        seconds = time.perf_counter() - start
        failed = sum(f.verdict == Verdict.FAIL for f in findings[:-1])
        print(f"| {uri} | {int(findings[-1].metrics['n_cases'])} | {failed} | {seconds:.1f} |")


if __name__ == "__main__":
    main()
