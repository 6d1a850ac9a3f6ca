"""A run records how long loading its target took (importing the framework, reading the weights),
apart from the checks' wall and model time: the floor any script running the model pays, which
``benchmarks/validate_overhead.py`` puts the harness against."""

from __future__ import annotations

import time
from pathlib import Path

from mmchaos.report.results import build_results
from mmchaos.runner import RunConfig, run_suite
from mmchaos.store import RunStore
from mmchaos.suites import SuiteSpec
from mmchaos.targets.base import Target
from tests.fakes import targets as fakes

LOAD_S = 0.3


def slow_to_load() -> Target:
    """The hash-embed target behind a loader that takes ``LOAD_S`` (a framework's import, say)."""
    time.sleep(LOAD_S)
    return fakes.HashEmbedTarget()


def test_the_target_load_time_is_recorded_apart_from_the_checks(tmp_path: Path) -> None:
    suite = SuiteSpec.model_validate({"name": "load", "seed": 0, "checks": [{"check": "modality_coverage"}]})
    config = RunConfig(target=f"py:{__name__}:slow_to_load", suite=suite, data="builtin:shapes?n=8")
    with RunStore(tmp_path / "runs.db") as store:
        run_suite(config, store)
        summary = build_results(store, store.resolve("latest"))["summary"]
    assert summary["target_load_seconds"] >= LOAD_S, "the loader's time is in it"
    assert summary["wall_seconds"] < LOAD_S, "and not in the checks' wall time"
