"""Work units on workers forked with the run's loaded target, one per core (issue 23).

Defect reproduced: a run's robustness units ran one after another in the run's process, on one
intra-op thread (tiny models run one on purpose), so a 2-core machine kept one core idle through
tiny-vlm's whole sweep (70 s of model time). Now a check that sets ``parallel_units`` runs them on
workers forked from the run's fork server, which holds the target and dataset: the same results in
the same order, the workers' model calls in the check's model time, failures raised at their unit.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mmchaos.data import load_dataset
from mmchaos.errors import ConfigError, DataError, MMChaosError
from mmchaos.executors import LocalExecutor, Worker
from mmchaos.executors.forked import ForkedUnitExecutor, unit_workers
from mmchaos.executors.forkserver import ForkServer
from mmchaos.executors.jobs import shared_spec
from mmchaos.runner import RunConfig, run_suite
from mmchaos.store import RunStore
from mmchaos.suites import SuiteSpec
from mmchaos.timing import ModelClock
from tests.fakes.fork_units import embed_rows, misbehave
from tests.support.workers import no_worker_interpreters

pytestmark = pytest.mark.integration

URI = "builtin:tiny-clip"
DATA = "builtin:shapes?n=24"


@pytest.fixture
def forked(clip: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[ForkedUnitExecutor]:
    """Two unit workers forked from a server holding tiny-clip and the shapes set; no interpreter
    may be started (that would be a second import and load of the target)."""
    no_worker_interpreters(monkeypatch)
    server = ForkServer.start(clip, load_dataset(DATA))
    assert server is not None
    executor = ForkedUnitExecutor(server, shared_spec(clip), workers=2)
    try:
        yield executor
    finally:
        executor.close()
        server.close()


def test_forked_units_equal_the_local_run_in_order_and_their_model_calls_are_model_time(
    clip: Any, forked: ForkedUnitExecutor
) -> None:
    units = [(i, i + 3) for i in range(0, 24, 3)]
    clock = ModelClock()
    remote = list(forked.map(embed_rows, {"scale": 2.0}, units, clock=clock))
    local = list(LocalExecutor(Worker(clip, load_dataset(DATA))).map(embed_rows, {"scale": 2.0}, units))
    for got, want in zip(remote, local, strict=True):
        np.testing.assert_array_equal(got["embedding"], want["embedding"])  # one thread each: the same floats
    pids = {r["pid"] for r in remote}
    assert len(pids) == 2 and os.getpid() not in pids, "both forked workers ran units, none in this process"
    assert clock.calls == len(units), "each unit's one model call reached the check's clock"
    assert clock.seconds > 0, clock.seconds


def test_a_unit_that_raises_is_raised_at_its_place_and_one_that_crashes_its_worker_is_a_coded_error(
    forked: ForkedUnitExecutor,
) -> None:
    results = forked.map(misbehave, None, ["ok", "raise", "ok"])
    assert isinstance(next(results), int)
    with pytest.raises(DataError) as raised:
        next(results)
    assert raised.value.code == "data_invalid" and "refused its rows" in str(raised.value), "the unit's own error"
    with pytest.raises(MMChaosError) as crashed:
        list(forked.map(misbehave, None, ["ok", "segv"]))
    assert crashed.value.code == "executor_worker_lost" and "SIGSEGV" in str(crashed.value), crashed.value
    with pytest.raises(MMChaosError) as unpicklable:
        list(forked.map(misbehave, None, ["unpicklable"]))
    assert unpicklable.value.code == "executor_unit_failed", unpicklable.value
    assert len(set(forked.map(misbehave, None, ["ok"] * 4))) == 2, "the executor works on after each failure"


def test_a_map_left_early_does_not_leave_its_jobs_to_the_next_one(clip: Any, forked: ForkedUnitExecutor) -> None:
    first = forked.map(embed_rows, {"scale": 1.0}, [(i, i + 1) for i in range(12)])
    next(first)
    first.close()  # a consumer that stopped (robustness past max_failed_units): a worker may be busy
    units = [(0, 2), (2, 3), (3, 6)]
    second = list(forked.map(embed_rows, {"scale": -1.0}, units))
    want = list(LocalExecutor(Worker(clip, load_dataset(DATA))).map(embed_rows, {"scale": -1.0}, units))
    for got, expected in zip(second, want, strict=True):
        np.testing.assert_array_equal(got["embedding"], expected["embedding"])  # its own unit's, not a stale answer


def test_unit_workers_follow_the_environment_and_keep_other_targets_in_process(
    clip: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MMCHAOS_UNIT_WORKERS", raising=False)
    cores = len(os.sched_getaffinity(0))
    assert unit_workers(URI) == min(cores, 8), "a one-thread torch target: one worker per core"
    assert unit_workers("py:tests.fakes.targets:hash_embed") == 1, "a py: target may hold what a fork must not share"
    assert unit_workers("builtin:ppocr") == 1, "ONNX Runtime targets stay in process"
    monkeypatch.setenv("MMCHAOS_UNIT_WORKERS", "3")
    assert unit_workers(URI) == 3
    for bad in ("0", "two"):
        monkeypatch.setenv("MMCHAOS_UNIT_WORKERS", bad)
        with pytest.raises(ConfigError) as err:
            unit_workers(URI)
        assert err.value.code == "executor_bad_option"


SUITE = {
    "name": "sweep",
    "seed": 5,
    "checks": [
        {
            "check": "robustness",
            "params": {"samples": 24, "shard_size": 8, "severities": [1, 3], "worst_cases": 3,
                       "perturbations": ["gaussian_noise", "defocus_blur", "keyboard_typo", "caption_mismatch"]},
        }
    ],
}  # fmt: skip


ATTACKS = {
    "name": "attacks",
    "seed": 5,
    "checks": [
        {"check": "adversarial_whitebox", "gate": {"eps": 4},
         "params": {"eps": [1, 4], "steps": 3, "masking_queries": 30, "samples": 9, "batch_size": 3}},
        {"check": "adversarial_blackbox",
         "params": {"eps": [4], "queries_per_sample": 40, "max_queries": 1000, "samples": 9, "batch_size": 3}},
    ],
}  # fmt: skip


def _run(
    tmp_path: Path, name: str, suite: dict[str, Any] = SUITE
) -> tuple[list[dict[str, Any]], dict[str, bytes], float]:
    with RunStore(tmp_path / f"{name}.db") as store:
        config = RunConfig(target=URI, suite=SuiteSpec.model_validate(suite), data=DATA)
        result = run_suite(config, store)
        model = sum(c.model_seconds for c in store.checks(result.run_id))
        findings = [f.to_dict() for f in store.findings(result.run_id)]
        return findings, {a.name: a.data for a in store.artifacts(result.run_id)}, model


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The worker counts of the unit executors that started their workers."""
    calls: list[int] = []
    real_open = ForkedUnitExecutor._open

    def spy(self: ForkedUnitExecutor) -> Any:
        calls.append(self.workers)
        return real_open(self)

    monkeypatch.setattr(ForkedUnitExecutor, "_open", spy)
    return calls


@pytest.mark.parametrize("suite", [SUITE, ATTACKS], ids=["robustness", "attacks"])
def test_a_run_gives_the_same_findings_on_forked_workers_as_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opened: list[int], suite: dict[str, Any]
) -> None:
    monkeypatch.setenv("MMCHAOS_UNIT_WORKERS", "1")
    here, here_cases, here_model = _run(tmp_path, "here", suite)
    assert opened == [], "one worker: the units run in this process"
    monkeypatch.setenv("MMCHAOS_UNIT_WORKERS", "2")
    there, there_cases, there_model = _run(tmp_path, "there", suite)
    assert opened and set(opened) == {2}, "the units went to two forked workers"
    assert len(here) >= 3 and here_cases, "the checks measured and saved worst cases"
    assert there == here and there_cases == here_cases, "the same seed gives the same findings wherever units ran"
    assert there_model > 0 and here_model > 0, "the workers' model calls are the checks' model time"


def test_workers_that_cannot_start_leave_the_units_in_process_with_a_warning(
    clip: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from mmchaos.checks.base import CheckContext

    server = ForkServer.start(clip, load_dataset(DATA))
    assert server is not None
    executor = ForkedUnitExecutor(server, shared_spec(clip), workers=2)
    server.close()  # gone before the check's first map
    ctx = CheckContext(target=clip, dataset=load_dataset(DATA), seed=0, check_id="c", unit_executor=executor)
    with caplog.at_level("WARNING", logger="mmchaos.executors.forked"):
        [result] = ctx.map_units(embed_rows, {"scale": 1.0}, [(0, 2)], keys=["u"], encode=dict, decode=dict)
    assert result["pid"] == os.getpid(), "the unit ran in this process"
    assert not executor.available() and "cannot start" in caplog.text, caplog.text
