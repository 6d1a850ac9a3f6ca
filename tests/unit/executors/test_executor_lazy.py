"""`--executor ray` opens its executor (starts or joins Ray) only when a check first runs work units
on it: a suite without such a check never starts Ray. The executor factory is replaced by a spy that
hands back an in-process executor, so these tests run without Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import mmchaos.runner as runner
from mmchaos.data import load_dataset
from mmchaos.errors import ConfigError
from mmchaos.executors import Executor, ExecutorSpec, LocalExecutor, TargetSpec, Worker
from mmchaos.runner import RunConfig, run_suite
from mmchaos.store import RunStore
from mmchaos.suites import SuiteSpec
from mmchaos.targets import load_target

TARGET = "py:tests.fakes.targets:hash_embed"
DATA = "builtin:shapes?n=24"
SWEEP = {"check": "robustness", "params": {"samples": 16, "shard_size": 8, "severities": [1],
                                            "perturbations": ["gaussian_noise"]}}  # fmt: skip


class FactorySpy:
    """Stands in for ``open_executor``: records each call, answers with an in-process executor."""

    def __init__(self) -> None:
        self.calls: list[tuple[ExecutorSpec, TargetSpec]] = []

    def __call__(self, spec: ExecutorSpec, target: TargetSpec) -> Executor:
        self.calls.append((spec, target))
        return LocalExecutor(Worker(load_target(target.uri, target.options), load_dataset(target.data)))


def _run(tmp_path: Path, checks: list[dict[str, Any]]) -> RunStore:
    suite = SuiteSpec.model_validate({"name": "lazy", "seed": 0, "checks": checks})
    store = RunStore(tmp_path / "runs.db")
    run_suite(RunConfig(target=TARGET, suite=suite, data=DATA), store, executor=ExecutorSpec("ray", workers=2))
    return store


def test_a_suite_without_work_units_never_opens_the_executor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = FactorySpy()
    monkeypatch.setattr(runner, "open_executor", spy)
    with _run(tmp_path, [{"check": "modality_coverage"}, {"check": "missing_modality"}]) as store:
        assert store.get_run(store.resolve("latest")).status == "complete"
    assert spy.calls == []


def test_the_first_check_with_work_units_opens_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = FactorySpy()
    monkeypatch.setattr(runner, "open_executor", spy)
    with _run(tmp_path, [{"check": "modality_coverage"}, SWEEP, {**SWEEP, "id": "robustness_again"}]) as store:
        assert store.get_run(store.resolve("latest")).status == "complete"
    assert len(spy.calls) == 1
    spec, target = spy.calls[0]
    assert spec.kind == "ray" and spec.workers == 2
    assert (target.uri, target.data) == (TARGET, DATA)


def test_an_executor_that_cannot_open_stops_the_run_as_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opened late, a Ray that cannot start is still the run's usage error (exit 2), not a check's finding."""

    def unreachable(spec: ExecutorSpec, target: TargetSpec) -> Executor:
        raise ConfigError("cannot start or reach a local Ray: no", code="executor_ray_unavailable")

    monkeypatch.setattr(runner, "open_executor", unreachable)
    with pytest.raises(ConfigError) as err:
        _run(tmp_path, [{"check": "modality_coverage"}, SWEEP])
    assert err.value.code == "executor_ray_unavailable"
