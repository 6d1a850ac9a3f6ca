"""`--executor ray`: the same seed gives the same findings on a local Ray with 2 workers as in
process, and a run whose driver was killed mid-sweep resumes on Ray without recomputing the
units it had committed. Skipped where Ray (the mmchaos[ray] extra) is not installed."""

from __future__ import annotations

import json
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

SUITE = {
    "name": "sweep",
    "seed": 3,
    "checks": [
        {
            "check": "robustness",
            "params": {
                "samples": 40,
                "shard_size": 16,
                "severities": [1, 3],
                "perturbations": ["gaussian_noise", "defocus_blur", "keyboard_typo", "attribute_swap",
                                  "caption_mismatch", "missing_modality", "typographic"],
                "worst_cases": 4,
            },
        }
    ],
}  # fmt: skip
DATA = "builtin:shapes?n=60"


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One local Ray of 2 CPUs for the module (starting one takes seconds)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _findings(store: RunStore, run_id: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    return [f.to_dict() for f in store.findings(run_id)], {a.name: a.data for a in store.artifacts(run_id)}


def _run(tmp_path: Path, name: str, target: str, executor: ExecutorSpec | None) -> tuple[Any, Any]:
    with RunStore(tmp_path / f"{name}.db") as store:
        config = RunConfig(target=target, suite=SuiteSpec.model_validate(SUITE), data=DATA)
        result = run_suite(config, store, executor=executor)
        return _findings(store, result.run_id)


def test_local_and_ray_with_two_workers_give_identical_findings(tmp_path: Path, local_ray: None) -> None:
    local = _run(tmp_path, "local", "py:tests.fakes.targets:hash_embed", None)
    on_ray = _run(tmp_path, "ray", "py:tests.fakes.targets:hash_embed", ExecutorSpec("ray", workers=2))
    findings, artifacts = local
    assert len(findings) >= 7 and artifacts, "the sweep measured and saved worst cases"
    assert any(f["verdict"] == "fail" for f in findings) and any(f["verdict"] == "pass" for f in findings)
    assert on_ray == local


def _units(db: Path) -> int:
    with sqlite3.connect(db) as con:
        return int(con.execute("SELECT COUNT(*) FROM units").fetchone()[0])


def test_a_run_whose_driver_was_killed_resumes_on_ray_without_recomputing(
    tmp_path: Path, local_ray: None, subprocess_env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(SuiteSpec.model_validate(SUITE).model_dump_json())
    db = tmp_path / "killed.db"
    argv = [sys.executable, "-m", "mmchaos.cli", "validate", "--target", "py:tests.fakes.sweep:dying",
            "--suite", str(suite), "--data", DATA, "--store", str(db), "--out", str(tmp_path / "out")]  # fmt: skip
    env = dict(subprocess_env, MMCHAOS_TEST_DIE_AFTER="12")  # SIGKILLed at its 12th image batch
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    committed = _units(db)
    assert committed > 0
    with sqlite3.connect(db) as con:
        (run_id,) = con.execute("SELECT run_id FROM runs").fetchone()
        assert con.execute("SELECT status FROM checks").fetchall() == [("running",)]

    with RunStore(db) as store, caplog.at_level(logging.INFO, logger="mmchaos.executors.journal"):
        result = run_suite(None, store, resume=run_id, executor=ExecutorSpec("ray", workers=2))
        resumed = _findings(store, result.run_id)
    assert f"{committed} of " in caplog.text, "the committed units were read back, not recomputed"
    assert _units(db) == 0, "a finished check drops its units"
    fresh = _run(tmp_path, "fresh", "py:tests.fakes.sweep:dying", None)
    assert resumed == fresh


def test_validate_executor_ray_from_the_cli(tmp_path: Path, local_ray: None, run_cli: Any) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(SuiteSpec.model_validate(SUITE).model_dump_json())
    code, out, err = run_cli("validate", "--executor", "ray", "--workers", "2",
                             "--target", "py:tests.fakes.targets:hash_embed",
                             "--suite", str(suite), "--data", DATA, "--store", str(tmp_path / "runs.db"),
                             "--out", str(tmp_path / "out"))  # fmt: skip
    assert code == 1, err[-2000:]  # attribute_swap fails its gate on the bag-of-words target
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    with RunStore(tmp_path / "runs.db", read_only=True) as store:
        run_id = store.resolve("latest")
        assert _findings(store, run_id) == _run(tmp_path, "local", "py:tests.fakes.targets:hash_embed", None)
    assert results["summary"]["exit_code"] == 1


def _fails_at_two(worker: Any, shared: int, unit: int) -> int:
    if unit == 2:
        raise ValueError("unit 2 broke")
    return unit + shared


def test_ray_yields_in_unit_order_and_raises_a_failed_unit_at_its_place(local_ray: None) -> None:
    from mmchaos.executors import TargetSpec
    from mmchaos.executors.ray import RayExecutor
    from mmchaos.targets import TargetOptions

    with RayExecutor(TargetSpec("py:tests.fakes.targets:hash_embed", TargetOptions(), DATA), workers=2) as executor:
        assert list(executor.map(_fails_at_two, 10, [5, 1, 0, 4, 3, 6])) == [15, 11, 10, 14, 13, 16]
        got = executor.map(_fails_at_two, 10, [0, 1, 2, 3])
        assert [next(got), next(got)] == [10, 11]
        with pytest.raises(ValueError, match="unit 2 broke"):
            next(got)


def _model_time(tmp_path: Path, name: str, executor: ExecutorSpec | None) -> tuple[float, int]:
    with RunStore(tmp_path / f"{name}.db") as store:
        config = RunConfig(target="py:tests.fakes.targets:hash_embed", suite=SuiteSpec.model_validate(SUITE), data=DATA)
        result = run_suite(config, store, executor=executor)
        (check,) = store.checks(result.run_id)
        return check.model_seconds, check.model_calls


def test_model_calls_on_ray_actors_count_in_the_checks_model_time(tmp_path: Path, local_ray: None) -> None:
    """The units' model calls happen on the actors; they come back with the results (before: the
    check reported only the driver's own calls, so a Ray run showed next to no model time)."""
    _, local_calls = _model_time(tmp_path, "local", None)
    seconds, calls = _model_time(tmp_path, "ray", ExecutorSpec("ray", workers=2))
    assert local_calls > 0
    # Each actor embeds the clean set for itself (its memo), so a Ray run makes at least as many calls.
    assert calls >= local_calls
    assert seconds > 0


def _dies_once_at_three(worker: Any, shared: str, unit: int) -> int:
    """Unit 3 kills its actor the first time it runs (a lost node), then runs normally."""
    import os

    marker = Path(shared) / "died"
    if unit == 3 and not marker.exists():
        marker.write_text("x")
        os._exit(1)
    return unit * 10


def _always_kills_at_one(worker: Any, shared: str, unit: int) -> int:
    import os

    if unit == 1:
        os._exit(1)
    return unit * 10


def test_a_unit_whose_actor_dies_runs_again_on_a_fresh_actor(tmp_path: Path, local_ray: None) -> None:
    """Before: the actor's death was raised as the unit's error, so a lost node ended the check in an
    error finding although the unit itself was fine."""
    from mmchaos.executors import TargetSpec
    from mmchaos.executors.ray import RayExecutor
    from mmchaos.targets import TargetOptions

    with RayExecutor(TargetSpec("py:tests.fakes.targets:hash_embed", TargetOptions(), DATA), workers=2) as executor:
        assert list(executor.map(_dies_once_at_three, str(tmp_path), list(range(8)))) == [u * 10 for u in range(8)]
        assert (tmp_path / "died").exists(), "unit 3 did take its actor down once"


def test_a_unit_that_kills_every_actor_fails_at_its_place_instead_of_retrying_forever(local_ray: None) -> None:
    from mmchaos.errors import MMChaosError
    from mmchaos.executors import TargetSpec
    from mmchaos.executors.ray import RayExecutor
    from mmchaos.targets import TargetOptions

    with RayExecutor(TargetSpec("py:tests.fakes.targets:hash_embed", TargetOptions(), DATA), workers=2) as executor:
        got = executor.map(_always_kills_at_one, "", [0, 1, 2, 3])
        assert next(got) == 0
        with pytest.raises(MMChaosError, match="took down 3 Ray actors") as info:
            next(got)
        assert info.value.code == "executor_actor_lost"
        assert list(executor.map(_always_kills_at_one, "", [2, 3])) == [20, 30], "the replaced actors serve on"
