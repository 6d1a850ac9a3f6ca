"""`--executor ray` for contract cases and fuzz batches: the same seed gives the same findings on a
local Ray with 2 workers as locally, for a target whose cases crash and hang (each actor's worker
dies or is killed and replaced, as the local pool's is) and for a correct one; a Ray actor that
dies or stops answering mid-job costs that job alone, within a bounded wait; and finished jobs are
journaled, so a run resumed on another executor reads them back. Skipped without Ray installed."""

from __future__ import annotations

import logging
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mmchaos.executors import ExecutorSpec, TargetSpec
from mmchaos.executors.jobs import WorkerSpec
from mmchaos.runner import RunConfig, run_suite
from mmchaos.store import RunStore
from mmchaos.suites import SuiteSpec
from mmchaos.targets import TargetOptions
from tests.fakes.fuzz_targets import kill_or_stop_the_actor
from tests.fakes.journal import DictJournal

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.integration

DATA = "builtin:shapes?n=8"
#: The hang case never ends; 30 s is the time a crash or a correct case must take to be read as a
#: hang. At 3 s, a CMYK crash on Ray under a CPU hog (load 8 on 2 cores) was read as a hang; at 10 s,
#: the correct exif_orientation_3 on Ray, right after a crashed worker was replaced, at load 10.
CONTRACT = {"check": "contract", "params": {"cases": ["mode_CMYK_*", "size_1x1", "mode_RGBA", "exif_orientation_3"],
                                            "timeout_s": 30.0}}  # fmt: skip
FUZZ = {"check": "contract_fuzz", "params": {"max_cases": 160, "stop_after_failures": 1, "max_seconds": 600,
                                             "minimise_tests": 6, "minimise_seconds": 600}}  # fmt: skip


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One local Ray of 2 CPUs for the module (starting one takes seconds)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


_MEASURED = re.compile(r"seconds|_s$|per_s|rss_growth|load_seconds")


def _stable(finding: dict[str, Any]) -> dict[str, Any]:
    """A finding without what is measured rather than decided (wall times, memory peaks, thread
    addresses in a native trace, the extension modules the crashed worker had imported for the jobs
    it ran before): those differ between any two runs, local ones included."""
    out = dict(finding)
    out["metrics"] = {k: v for k, v in finding["metrics"].items() if not _MEASURED.search(k)}
    out["evidence"] = {k: v for k, v in finding["evidence"].items() if k != "found_after_s"}
    if "worker_stderr" in out["evidence"]:  # the worker's history: which extensions earlier jobs imported
        trace = re.sub(r"0x[0-9a-f]+", "0x?", out["evidence"]["worker_stderr"])
        out["evidence"]["worker_stderr"] = re.sub(r"\nExtension modules: [^\n]*", "", trace)
    out["title"] = re.sub(r" in [\d.]+ s \(\d+/s\)", "", finding["title"])
    return out


def _run(tmp_path: Path, name: str, target: str, checks: list[Any], executor: ExecutorSpec | None) -> list[Any]:
    suite = SuiteSpec.model_validate({"name": "units", "seed": 0, "checks": checks})
    with RunStore(tmp_path / f"{name}.db") as store:
        result = run_suite(RunConfig(target=target, suite=suite, data=DATA), store, executor=executor)
        findings = [_stable(f.to_dict()) for f in store.findings(result.run_id)]
    with sqlite3.connect(tmp_path / f"{name}.db") as con:
        assert con.execute("SELECT COUNT(*) FROM units").fetchone()[0] == 0, "a finished check drops its units"
    return findings


def _diff(a: list[Any], b: list[Any]) -> list[tuple[int, str, Any, Any]]:
    """Where two finding lists differ (index, field, and the two values), for the assertion message."""
    out = [(-1, "len", len(a), len(b))] if len(a) != len(b) else []
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        for key in sorted(set(x) | set(y)):
            if x.get(key) != y.get(key):
                if isinstance(x.get(key), dict) and isinstance(y.get(key), dict):
                    out += [(i, f"{key}.{k}", x[key].get(k), y[key].get(k)) for k in sorted(set(x[key]) | set(y[key]))
                            if x[key].get(k) != y[key].get(k)]  # fmt: skip
                else:
                    out.append((i, key, x.get(key), y.get(key)))
    return out


def test_crashing_and_hanging_contract_cases_and_a_fuzzed_segfault_match_between_local_and_ray(
    tmp_path: Path, local_ray: None
) -> None:
    target = "py:tests.fakes.fuzz_targets:crash_or_hang"
    local = _run(tmp_path, "local", target, [CONTRACT], None)
    on_ray = _run(tmp_path, "ray", target, [CONTRACT], ExecutorSpec("ray", workers=2))
    failed = {f["evidence"]["case"]: f["title"] for f in local if f["verdict"] == "fail"}
    assert sorted(failed) == ["mode_CMYK_jpeg", "mode_CMYK_tiff", "size_1x1"]
    assert "SIGSEGV" in failed["mode_CMYK_jpeg"] and "no answer within 30 s" in failed["size_1x1"]
    assert local[-1]["metrics"]["worker_replacements"] == 3 and local[-1]["metrics"]["n_passed"] == 2
    assert on_ray == local, _diff(on_ray, local)

    fuzz_target = "py:tests.fakes.fuzz_targets:splt_crash"
    local = _run(tmp_path, "fuzz-local", fuzz_target, [FUZZ], None)
    on_ray = _run(tmp_path, "fuzz-ray", fuzz_target, [FUZZ], ExecutorSpec("ray", workers=2))
    [fail] = [f for f in local if f["verdict"] == "fail"]
    assert fail["evidence"]["signature"] == "image_bytes:crashed:SIGSEGV@__init__.py:string_at"
    assert fail["evidence"]["minimise_runs"] > 0
    assert on_ray == local, _diff(on_ray, local)


def test_a_correct_target_passes_contract_and_fuzzing_on_ray(tmp_path: Path, local_ray: None) -> None:
    # A correct target never hangs, so a long case timeout costs nothing here; at 10 s the 400 M-pixel
    # cases ran past it under a CPU hog (load 5 on 2 cores) and a correct target failed on speed.
    checks = [{**CONTRACT, "params": {"timeout_s": 120.0}}, {**FUZZ, "params": {"max_cases": 96}}]
    target = "py:tests.fakes.broken_targets:contract_safe"
    on_ray = _run(tmp_path, "clean-ray", target, checks, ExecutorSpec("ray", workers=2))
    assert [f["verdict"] for f in on_ray] == ["pass", "pass"]
    assert on_ray[0]["metrics"]["n_cases"] >= 50 and on_ray[1]["metrics"]["cases"] == 96


def test_an_actor_that_dies_or_freezes_costs_its_job_alone(local_ray: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from mmchaos.executors import ray as ray_executor
    from mmchaos.executors.ray import RayExecutor

    monkeypatch.setattr(ray_executor, "ACTOR_GRACE_S", 1.0)  # the driver's wait past timeout + restart
    spec = WorkerSpec(uri="py:tests.fakes.targets:hash_embed")
    with RayExecutor(TargetSpec(spec.uri, TargetOptions(), DATA), workers=2) as executor:
        # Under a CPU hog (load 5 on 2 cores) a worker took 13-15 s to start: at 12 s the warm-up failed.
        pool = executor.isolated(spec, kill_or_stop_the_actor, start_timeout=45.0)
        assert [job.value for _, job in pool.map(["warm", "warm"], 60.0)] == ["warm", "warm"]
        start = time.monotonic()
        results = dict(pool.map(["a", "kill", "b", "stop", "c", "d"], 1.0))
        assert time.monotonic() - start < 240, "every wait is bounded"
        assert [results[i].value for i in (0, 2, 4, 5)] == ["a", "b", "c", "d"], {
            i: (r.status, r.detail, r.error) for i, r in results.items()
        }
        assert results[1].status == "crashed" and "the Ray actor died" in results[1].detail
        assert results[3].status == "hung" and "no answer from the Ray actor within 47 s" in results[3].detail
        assert pool.replacements == 2
        # No job here hangs: a long timeout costs nothing, and at 1 s a hogged machine timed them out.
        after = dict(pool.map(["e", "f"], 30.0))
        assert [after[i].value for i in (0, 1)] == ["e", "f"], {i: (r.status, r.detail) for i, r in after.items()}
        # Both actors work again (a replacement that missed its start on a starved machine is
        # started again at this map).
        assert pool.workers == 2


def test_a_replacement_that_failed_to_start_its_worker_is_started_again_at_the_next_map(
    local_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a CPU hog a replacement actor's worker missed its start timeout, and the pool ran one
    worker short for the rest of the run. Here the first replacement's start is made to fail (the
    starved machine is not reproducible on demand); the next map starts that pool again."""
    from mmchaos.executors.ray import RayExecutor, RayIsolatedPool

    start = RayIsolatedPool._start
    failed: list[int] = []

    def first_replacement_fails(self: RayIsolatedPool, index: int, **kwargs: Any) -> bool:
        if kwargs.get("replacing") and not failed:
            failed.append(index)
            return False
        return start(self, index, **kwargs)

    monkeypatch.setattr(RayIsolatedPool, "_start", first_replacement_fails)
    spec = WorkerSpec(uri="py:tests.fakes.targets:hash_embed")
    with RayExecutor(TargetSpec(spec.uri, TargetOptions(), DATA), workers=2) as executor:
        pool = executor.isolated(spec, kill_or_stop_the_actor, start_timeout=45.0)
        results = dict(pool.map(["warm", "warm", "kill"], 30.0))
        assert results[2].status == "crashed" and failed and pool.workers == 1
        after = dict(pool.map(["a", "b", "c", "d"], 30.0))
        assert [after[i].value for i in range(4)] == ["a", "b", "c", "d"]
        assert pool.workers == 2, "the failed replacement was started again"


def test_contract_cases_run_on_ray_are_journaled_and_a_local_resume_reads_them_back(
    local_ray: None, caplog: pytest.LogCaptureFixture
) -> None:
    from mmchaos.checks.base import CheckContext
    from mmchaos.checks.contract.contract import Contract, ContractParams
    from mmchaos.data import load_dataset
    from mmchaos.executors import LazyExecutor, open_executor
    from mmchaos.runner import TimedTarget
    from tests.fakes.fuzz_targets import crash_or_hang

    journal = DictJournal()
    check = Contract(ContractParams.model_validate(CONTRACT["params"]))
    dataset = load_dataset(DATA)
    uri = "py:tests.fakes.fuzz_targets:crash_or_hang"
    executor = LazyExecutor(
        "ray", lambda: open_executor(ExecutorSpec("ray", workers=2), TargetSpec(uri, TargetOptions(), DATA))
    )

    def run(executor: Any) -> list[Any]:
        ctx = CheckContext(target=TimedTarget(crash_or_hang()), dataset=dataset, seed=0, check_id="contract",
                           executor=executor, journal=journal)  # fmt: skip
        return [_stable(f.to_dict()) for f in check.run(ctx)]

    try:
        on_ray = run(executor)
    finally:
        executor.close()
    assert sorted(journal.units) == sorted(f"case:{c}" for c in ["mode_CMYK_jpeg", "mode_CMYK_tiff", "size_1x1",
                                                                "mode_RGBA", "exif_orientation_3"])  # fmt: skip
    del journal.units["case:mode_RGBA"]  # the driver died before this one arrived
    with caplog.at_level(logging.INFO, logger="mmchaos.executors.isolated"):
        resumed = run(None)
    assert "resume: 4 of 5 contract jobs read back" in caplog.text, "the crash and the hang did not run again"
    assert resumed[:-1] == on_ray[:-1]
    replaced = resumed[-1]["metrics"].pop("worker_replacements")
    assert replaced == 0 and on_ray[-1]["metrics"].pop("worker_replacements") == 3
    assert resumed[-1] == on_ray[-1]


def test_a_contract_run_whose_driver_was_killed_resumes_on_ray_without_running_its_cases_again(
    tmp_path: Path, local_ray: None, subprocess_env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    checks = [{"check": "contract", "params": {"cases": ["zero_byte", "mode_L", "mode_P", "mode_RGBA", "mode_CMYK_tiff",
                                                         "exif_orientation_3"]}}]  # fmt: skip
    suite = tmp_path / "suite.yaml"
    suite.write_text(SuiteSpec.model_validate({"name": "units", "seed": 0, "checks": checks}).model_dump_json())
    db = tmp_path / "killed.db"
    target = "py:tests.fakes.fuzz_targets:kills_its_parent_on_tiff"
    argv = [sys.executable, "-m", "mmchaos.cli", "validate", "--target", target, "--suite", str(suite),
            "--data", DATA, "--store", str(db), "--out", str(tmp_path / "out")]  # fmt: skip
    env = dict(subprocess_env, MMCHAOS_TEST_KILL_PARENT_ON_TIFF="1")  # the TIFF case (5th of 6) kills the driver
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    with sqlite3.connect(db) as con:
        (run_id,) = con.execute("SELECT run_id FROM runs").fetchone()
        committed = int(con.execute("SELECT COUNT(*) FROM units").fetchone()[0])
    assert committed >= 3, "the cases that had answered were committed as they arrived"

    with RunStore(db) as store, caplog.at_level(logging.INFO, logger="mmchaos.executors.isolated"):
        result = run_suite(None, store, resume=run_id, executor=ExecutorSpec("ray", workers=2))
        resumed = [_stable(f.to_dict()) for f in store.findings(result.run_id)]
    assert f"resume: {committed} of 6 contract jobs read back" in caplog.text
    assert resumed == _run(tmp_path, "fresh", target, checks, None)
    assert resumed[-1]["verdict"] == "pass" and resumed[-1]["metrics"]["n_passed"] == 6
