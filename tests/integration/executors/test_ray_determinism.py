"""`determinism` on `--executor ray`, and resumed from its journal after the driver was killed.

Before: determinism took the run's local worker pool directly (``run_pool``), so on a Ray run its
work never reached the actors and nothing of it was journaled: a killed run did it all again.
Now its in-process pass and generation pairs are work units and its cross-process batches are
journaled jobs: the same seed gives the same findings locally and on a local Ray of 2 workers (a
process-salted target still fails across processes there, a greedy answer that changes once seen
still fails), and a run killed mid-way reads back what it had committed. Skipped without Ray.
"""

from __future__ import annotations

import logging
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mmchaos.executors import ExecutorSpec
from mmchaos.runner import RunConfig, run_suite
from mmchaos.store import RunStore
from mmchaos.suites import SuiteSpec

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.integration

DATA = "builtin:shapes?n=8"
CHECKS = [{"check": "determinism", "params": {"samples": 8, "batch_size": 4, "generate_requests": 3, "seeds": [0, 1]}}]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One local Ray of 2 CPUs for the module (starting one takes seconds)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _run(tmp_path: Path, name: str, target: str, executor: ExecutorSpec | None) -> list[dict[str, Any]]:
    suite = SuiteSpec.model_validate({"name": "determinism", "seed": 0, "checks": CHECKS})
    with RunStore(tmp_path / f"{name}.db") as store:
        result = run_suite(RunConfig(target=target, suite=suite, data=DATA), store, executor=executor)
        findings = [f.to_dict() for f in store.findings(result.run_id)]
    with sqlite3.connect(tmp_path / f"{name}.db") as con:
        assert con.execute("SELECT COUNT(*) FROM units").fetchone()[0] == 0, "a finished check drops its units"
    return findings


@pytest.mark.parametrize(
    ("target", "verdicts"),
    [
        ("py:tests.fakes.broken_targets:contract_safe", ["pass", "pass"]),
        ("py:tests.fakes.broken_targets:process_salted", ["pass", "fail"]),
        ("py:tests.fakes.generative:WarmCacheTarget", ["fail", "pass"]),
    ],
)
def test_determinism_on_ray_gives_the_local_findings(
    tmp_path: Path, local_ray: None, target: str, verdicts: list[str]
) -> None:
    local = _run(tmp_path, "local", target, None)
    assert [f["verdict"] for f in local] == verdicts, [f["title"] for f in local]
    on_ray = _run(tmp_path, "ray", target, ExecutorSpec("ray", workers=2))
    if "salted" not in target:
        assert on_ray == local
        return
    # Each process salts hash() at random: how far two workers part differs from run to run.
    decided = [(f["verdict"], f["evidence"]["mode"], f["evidence"].get("worst", {}).get("method")) for f in local]
    assert [(f["verdict"], f["evidence"]["mode"], f["evidence"].get("worst", {}).get("method")) for f in on_ray] == (
        decided
    )
    assert decided[1] == ("fail", "cross_process", "embed_texts")


def test_a_determinism_run_whose_driver_was_killed_resumes_on_ray_from_its_journal(
    tmp_path: Path, local_ray: None, subprocess_env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(SuiteSpec.model_validate({"name": "determinism", "seed": 0, "checks": CHECKS}).model_dump_json())
    db = tmp_path / "killed.db"
    target = "py:tests.fakes.sweep:kills_the_driver_from_a_worker"
    argv = [sys.executable, "-m", "mmchaos.cli", "validate", "--target", target, "--suite", str(suite),
            "--data", DATA, "--store", str(db), "--out", str(tmp_path / "out")]  # fmt: skip
    # 8 samples in batches of 4: 2 image and 2 text batches; each worker's 3rd call kills the driver.
    env = dict(subprocess_env, MMCHAOS_TEST_KILL_PARENT_AT="3")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    with sqlite3.connect(db) as con:
        (run_id,) = con.execute("SELECT run_id FROM runs").fetchone()
        keys = {k for (k,) in con.execute("SELECT key FROM units")}
    assert keys == {"in_process", "cross_process/0", "cross_process/1"}, "each part committed as it finished"

    loggers = ("mmchaos.executors.journal", "mmchaos.executors.isolated")
    with RunStore(db) as store:
        with caplog.at_level(logging.INFO, logger=loggers[0]), caplog.at_level(logging.INFO, logger=loggers[1]):
            result = run_suite(None, store, resume=run_id, executor=ExecutorSpec("ray", workers=2))
        resumed = [f.to_dict() for f in store.findings(result.run_id)]
    assert "resume: 1 of 1 determinism units read back" in caplog.text, "the in-process pass did not run again"
    assert "determinism jobs cross_process/0 read back" in caplog.text
    assert "determinism jobs cross_process/1 read back" in caplog.text
    assert "cross_process/2 read back" not in caplog.text
    assert resumed == _run(tmp_path, "fresh", target, None)
    assert [f["verdict"] for f in resumed] == ["pass", "pass"]
