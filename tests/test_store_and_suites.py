"""Run store transactions, suite validation and the registries' helpful errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmchaos.checks import REGISTRY as CHECKS
from mmchaos.errors import ConfigError, StoreError, UnknownNameError
from mmchaos.findings import Artifact, Finding, Step, Verdict
from mmchaos.store import RunRecord, RunStore
from mmchaos.suites import BUILTIN_SUITES, load_suite


def _record(run_id: str) -> RunRecord:
    return RunRecord(run_id, 1.0, None, "running", "builtin:x", "quick", {"suite": {"seed": 0}})


def test_store_commits_checks_atomically_and_resolves_ids(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with RunStore(path) as store:
        store.create_run(_record("20260101-000000-aaaaaa"), ["a", "b"])
        f = Finding("a", Step.ROBUSTNESS, Verdict.FAIL, "t", metrics={"x": 1.0}, artifacts=[Artifact("e.png", b"png")])
        store.commit_check("20260101-000000-aaaaaa", "a", [f], wall_seconds=1.0, model_seconds=0.5, model_calls=3)
    with RunStore(path) as store:  # a new connection sees the committed check
        assert store.resolve("2026") == "20260101-000000-aaaaaa" == store.resolve("latest")
        assert [c.status for c in store.checks("20260101-000000-aaaaaa")] == ["done", "pending"]
        [back] = store.findings("20260101-000000-aaaaaa")
        assert back.to_dict() == f.to_dict()
        assert store.artifact("20260101-000000-aaaaaa", "e.png").data == b"png"
        with pytest.raises(StoreError, match="no run"):
            store.resolve("1999")


def test_store_rejects_a_file_that_is_not_sqlite(tmp_path: Path) -> None:
    bad = tmp_path / "runs.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="cannot open run store"):
        RunStore(bad)


@pytest.mark.parametrize("name", BUILTIN_SUITES)
def test_builtin_suites_validate(name: str) -> None:
    spec = load_suite(name)
    assert spec.name == name and spec.checks


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("name: x\nchecks:\n  - check: robustnes\n", "did you mean robustness"),
        ("name: x\nchecks:\n  - check: robustness\n    params: {samples: 0}\n", "check robustness: samples"),
        ("name: x\nchecks:\n  - check: robustness\n    params: {severities: [9]}\n", "severities must be"),
        ("name: x\nchecks:\n  - check: robustness\n    gate: {min_relative: 2}\n", "min_relative"),
        ("name: x\nchecks:\n  - check: robustness\n    params: {perturbations: [gausian_noise]}\n", "gaussian_noise"),
        ("name: x\nchecks:\n  - check: robustness\n    bogus: 1\n", "bogus"),
        ("name: x\nchecks:\n  - check: robustness\n  - check: robustness\n", "appears twice"),
        ("- a list\n", "must be a mapping"),
        ("name: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_suite_files_are_one_line_config_errors(tmp_path: Path, yaml_text: str, message: str) -> None:
    f = tmp_path / "suite.yaml"
    f.write_text(yaml_text)
    with pytest.raises((ConfigError, UnknownNameError), match=message) as info:
        load_suite(str(f))
    assert "\n" not in str(info.value)


def test_unknown_suite_name() -> None:
    with pytest.raises(UnknownNameError, match="prelaunch"):
        load_suite("prelanch")


@pytest.mark.parametrize("name", CHECKS.names())
def test_registered_check_meets_contract(name: str) -> None:
    cls = CHECKS.get(name)
    assert cls.name == name and isinstance(cls.step, Step)
    assert (cls.__doc__ or "").strip().splitlines()[0]
    check = cls()  # builds with defaults
    assert cls.Params.model_validate(check.params.model_dump()) == check.params  # config round-trips
    assert cls.Gate.model_validate(check.gate.model_dump()) == check.gate
