"""Ctrl-C during a run: the CLI says which run to resume and how, the finished checks stay stored,
no forked worker outlives it, and the printed command finishes the run."""

from __future__ import annotations

import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.runs import TWO_CHECK_SUITE, check_statuses

UNITS_SUITE = """
name: interruptible-units
seed: 1
checks:
  - check: robustness
    params:
      samples: 400
      severities: [1, 2, 3, 4, 5]
      perturbations: [gaussian_noise, defocus_blur, frost, jpeg_compression, zoom_blur, elastic_transform]
"""


def _run_status(db: Path) -> str:
    with sqlite3.connect(db) as con:
        return str(con.execute("SELECT status FROM runs").fetchone()[0])


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (Linux /proc: each task's ``children``)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = {int(k) for k in (task / "children").read_text().split()}
            except OSError:
                continue
            todo += sorted(kids - found)
            found |= kids
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _interrupt_when(
    argv: list[str], env: dict[str, str], db: Path, check_id: str, processes: int = 0
) -> tuple[subprocess.CompletedProcess[str], set[int]]:
    """Start ``argv``, SIGINT it (the process alone, as ``kill -INT`` does) once ``check_id`` runs
    with at least ``processes`` processes below it, and return what it printed and those processes."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while (
            check_statuses(db).get(check_id) != "running"
            or _run_status(db) != "running"  # a resumed run: once it is under way again
            or len(below := _descendants(proc.pid)) < processes
        ):
            assert proc.poll() is None, "the run ended before it could be interrupted"
            assert time.monotonic() < deadline, f"{check_id} never ran with {processes} processes below it"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), below


def _validate(tmp_path: Path, suite_text: str, target: str, data: str) -> tuple[list[str], Path]:
    """The argv of ``mmchaos validate`` of ``suite_text`` on ``target`` and ``data``, and its store."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(suite_text)
    db = tmp_path / "runs.db"
    argv = [sys.executable, "-m", "mmchaos.cli", "validate", "--target", target, "--suite", str(suite),
            "--data", data, "--store", str(db), "--out", str(tmp_path / "out")]  # fmt: skip
    return argv, db


def _resume_command(stderr: str) -> list[str]:
    found = re.search(r"go on with `(mmchaos validate --resume [^`]+)`", stderr)
    assert found, stderr
    return shlex.split(found.group(1))


@pytest.mark.integration
def test_ctrl_c_says_which_run_to_resume_and_the_printed_command_finishes_it(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    argv, db = _validate(tmp_path, TWO_CHECK_SUITE, "py:tests.fakes.targets:slow", "builtin:shapes?n=12")
    env = dict(subprocess_env, MMCHAOS_TEST_DELAY="0.2")
    done, _ = _interrupt_when(argv, env, db, "slow-batch")

    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr
    with sqlite3.connect(db) as con:
        (run_id,) = con.execute("SELECT run_id FROM runs").fetchone()
        first = con.execute("SELECT body FROM findings WHERE check_id='missing_modality' ORDER BY idx").fetchall()
    assert f"interrupted: run {run_id} keeps its finished checks in {db}" in done.stderr
    assert check_statuses(db) == {"missing_modality": "done", "slow-batch": "running"}
    assert _run_status(db) == "interrupted"

    command = _resume_command(done.stderr)
    assert command[3:] == [run_id, "--store", str(db)]
    resume_argv = [sys.executable, "-m", "mmchaos.cli", *command[1:], "--out", str(tmp_path / "out")]
    second, _ = _interrupt_when(resume_argv, env, db, "slow-batch")  # the resumed run, interrupted in turn
    assert second.returncode == 130 and _resume_command(second.stderr) == command, second.stderr
    assert _run_status(db) == "interrupted"
    env["MMCHAOS_TEST_DELAY"] = "0"
    resumed = subprocess.run(resume_argv, env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    with sqlite3.connect(db) as con:
        again = con.execute("SELECT body FROM findings WHERE check_id='missing_modality' ORDER BY idx").fetchall()
    assert again == first, "the finished check was kept, not run again"
    assert check_statuses(db) == {"missing_modality": "done", "slow-batch": "done"}
    assert _run_status(db) == "complete"


@pytest.mark.integration
def test_ctrl_c_during_forked_units_leaves_no_worker_behind(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    argv, db = _validate(tmp_path, UNITS_SUITE, "builtin:tiny-clip", "builtin:shapes?n=400")
    env = dict(subprocess_env, MMCHAOS_UNIT_WORKERS="2")
    # the fork server and its two unit workers are up: the units are in flight
    done, below = _interrupt_when(argv, env, db, "robustness", processes=3)

    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr
    assert "interrupted: run " in done.stderr and "go on with `mmchaos validate --resume" in done.stderr
    deadline = time.monotonic() + 10
    while (left := {p for p in below if _alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes outlived the run: {sorted(left)}"
    assert _run_status(db) == "interrupted" and check_statuses(db) == {"robustness": "running"}
