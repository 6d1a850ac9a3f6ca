"""Peak RSS and wall time of the robustness sweep over 100, 1,000 and 10,000 samples.

The dataset is a JSONL file of 64x64 PNGs on disk (image, label, caption), as a user's would be;
each size runs in a fresh process, so peak RSS is that run's alone. Flat memory means the peak
at 10,000 samples stays within 10% of the peak at 100; linear time means seconds per sample stay
about constant. CPU seconds (the run's, in the child) are given beside wall seconds: on a shared
machine they say whether time per sample grows with the samples when wall time is load's.

    python benchmarks/sweep_scale.py [--sizes 100 1000 10000] [--target builtin:tiny-clip]
    python benchmarks/sweep_scale.py --pythonpath /path/to/other/src   # compare another checkout
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEP = {
    "perturbations": ["gaussian_noise", "jpeg_compression", "keyboard_typo"],
    "severities": [1, 3],
    "worst_cases": 5,
}


def write_dataset(root: Path, n: int) -> Path:
    """``n`` shapes images as PNG files and a JSONL index (label and caption per row)."""
    from PIL import Image

    from mmchaos.data.shapes import make_shapes

    rows = []
    for s in make_shapes(n, seed=7):
        assert s.image is not None
        path = root / f"{s.id}.png"
        Image.fromarray(s.image).save(path)
        rows.append({"image": path.name, "label": s.label, "caption": s.caption, "id": s.id})
    index = root / f"shapes-{n}.jsonl"
    index.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return index


def _peak_rss_kb() -> int:
    """This process's peak resident set (VmHWM). Not ``ru_maxrss``: Linux keeps that across
    ``execve``, so a child started by a parent holding the dataset's images would report the
    parent's peak (the 171 MB at every size this benchmark once printed)."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise SystemExit("no VmHWM in /proc/self/status: this benchmark reads Linux's peak RSS")


def one(target: str, data: str, samples: int, sharded: bool) -> None:
    """Child process: run the sweep once and print a JSON line with its numbers."""
    import resource

    from mmchaos.runner import RunConfig, run_suite
    from mmchaos.store import RunStore
    from mmchaos.suites import SuiteSpec

    params: dict[str, object] = {**SWEEP, "samples": samples}
    if sharded:
        params["shard_size"] = 64
    checks = [{"check": "robustness", "params": params}]
    before = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before = before.ru_utime + before.ru_stime  # imports and the target's load left out
    suite = SuiteSpec.model_validate({"name": "scale", "seed": 0, "checks": checks})
    with tempfile.TemporaryDirectory() as tmp, RunStore(Path(tmp) / "runs.db") as store:
        start = time.perf_counter()
        result = run_suite(RunConfig(target=target, suite=suite, data=data), store)
        process = time.perf_counter() - start
        (check,) = store.checks(result.run_id)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"samples": samples, "check_wall_s": round(check.wall_seconds, 2),
                      "model_s": round(check.model_seconds, 2), "run_s": round(process, 2),
                      "cpu_s": round(usage.ru_utime + usage.ru_stime - cpu_before, 2),
                      "peak_rss_mb": round(_peak_rss_kb() / 1024, 1)}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=[100, 1000, 10000])
    parser.add_argument("--target", default="builtin:tiny-clip")
    parser.add_argument("--pythonpath", help="run the sweep from this source tree (e.g. an older checkout)")
    parser.add_argument("--one", nargs=2, metavar=("DATA", "SAMPLES"), help=argparse.SUPPRESS)
    parser.add_argument("--unsharded", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.target, args.one[0], int(args.one[1]), not args.unsharded)
        return
    # Units in this process: peak RSS is one process's, and the driver's streaming is what it measures
    # (forked unit workers, mmchaos.executors.forked, each hold one unit at a time).
    env = dict(os.environ, MMCHAOS_UNIT_WORKERS="1")
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    with tempfile.TemporaryDirectory() as tmp:
        data = write_dataset(Path(tmp), max(args.sizes))
        rows = []
        for n in args.sizes:
            argv = [sys.executable, __file__, "--target", args.target, "--one", str(data), str(n)]
            if args.pythonpath:
                argv.append("--unsharded")  # an older checkout has no shard_size
            proc = subprocess.run(argv, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                raise SystemExit(f"sweep over {n} failed: {proc.stderr[-2000:]}")
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    base = rows[0]
    print("\n| samples | check wall s | wall s / 1k | run CPU s | CPU s / 1k | model s | peak RSS MB | RSS vs first |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        per_k = 1000 * r["check_wall_s"] / r["samples"]
        cpu_k = 1000 * r["cpu_s"] / r["samples"]
        rss = r["peak_rss_mb"] / base["peak_rss_mb"] - 1
        print(f"| {r['samples']} | {r['check_wall_s']} | {per_k:.2f} | {r['cpu_s']} | {cpu_k:.2f} | {r['model_s']} | "
              f"{r['peak_rss_mb']} | {rss:+.1%} |")  # fmt: skip


if __name__ == "__main__":
    main()
