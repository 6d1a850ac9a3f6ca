"""Wall time of `validate --suite quick` and `--suite prelaunch`, and the harness overhead.

Baseline: the time spent inside the target's forward passes (embed/read calls), measured by the
runner's TimedTarget in the same run. Overhead = 1 - model time / wall time.

    python benchmarks/validate_overhead.py [--target builtin:tiny-clip] [--suites quick prelaunch]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def measure(target: str, suite: str, workdir: Path) -> dict[str, float | str]:
    out, store = workdir / f"{suite}-report", workdir / "runs.db"
    argv = [sys.executable, "-m", "mmchaos.cli", "validate", "--target", target, "--suite", suite,
            "--out", str(out), "--store", str(store)]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"validate failed ({proc.returncode}): {proc.stderr[-2000:]}")
    results = json.loads((out / "results.json").read_text())
    print(f"\n{suite}: per check (wall s / model s)")
    for c in results["checks"]:
        print(f"  {c['id']:<22} {c['wall_seconds']:7.2f} {c['model_seconds']:7.2f}")
    checks = results["summary"]["wall_seconds"]
    model = results["summary"]["model_seconds"]
    return {
        "suite": suite,
        "process_wall_s": round(wall, 2),
        "checks_wall_s": round(checks, 2),
        "model_s": round(model, 2),
        "overhead_vs_process": round(1 - model / wall, 3),
        "overhead_vs_checks": round(1 - model / checks, 3) if checks else 0.0,
        "exit_code": proc.returncode,
        "verdicts": json.dumps(results["summary"]["verdicts"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="builtin:tiny-clip")
    parser.add_argument("--suites", nargs="+", default=["quick", "prelaunch"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(args.target, s, Path(tmp)) for s in args.suites]
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
