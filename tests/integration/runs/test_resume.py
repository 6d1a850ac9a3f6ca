"""A run killed with SIGKILL mid-check resumes without recomputing or losing finished checks."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.runs import TWO_CHECK_SUITE, check_statuses


@pytest.mark.integration
def test_resume_after_sigkill(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(TWO_CHECK_SUITE)
    db = tmp_path / "runs.db"
    argv = [sys.executable, "-m", "mmchaos.cli", "validate", "--target", "py:tests.fakes.targets:slow",
            "--suite", str(suite),
            "--data", "builtin:shapes?n=12", "--store", str(db), "--out", str(tmp_path / "out")]  # fmt: skip
    env = dict(subprocess_env, MMCHAOS_TEST_DELAY="0.2")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while check_statuses(db).get("slow-batch") != "running":
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "the slow check never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert check_statuses(db) == {"missing_modality": "done", "slow-batch": "running"}
    with sqlite3.connect(db) as con:
        (run_id,) = con.execute("SELECT run_id FROM runs").fetchone()
        before = con.execute("SELECT finished FROM checks WHERE check_id='missing_modality'").fetchone()
        first = con.execute("SELECT body FROM findings WHERE check_id='missing_modality' ORDER BY idx").fetchall()

    env["MMCHAOS_TEST_DELAY"] = "0"
    resumed = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmchaos.cli",
            "validate",
            "--resume",
            run_id[:17],
            "--store",
            str(db),
            "--out",
            str(tmp_path / "out"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    with sqlite3.connect(db) as con:
        after = con.execute("SELECT finished FROM checks WHERE check_id='missing_modality'").fetchone()
        again = con.execute("SELECT body FROM findings WHERE check_id='missing_modality' ORDER BY idx").fetchall()
        status = con.execute("SELECT status FROM runs").fetchone()[0]
    assert after == before, "the finished check was not recomputed"
    assert again == first, "and its findings were kept"
    assert check_statuses(db) == {"missing_modality": "done", "slow-batch": "done"} and status == "complete"
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {f["check"] for f in results["findings"]} == {"missing_modality", "slow-batch"}
