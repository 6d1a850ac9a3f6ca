"""Run store transactions, suite validation and the registries' helpful errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from mmchaos.checks import REGISTRY as CHECKS
from mmchaos.errors import ConfigError, StoreError, UnknownNameError
from mmchaos.findings import Artifact, Finding, Step, Verdict
from mmchaos.report import write_reports
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


def _strict_loads(text: str) -> Any:
    """JSON as Node's JSON.parse reads it: NaN, Infinity and -Infinity are syntax errors."""

    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def _full_record(run_id: str) -> RunRecord:
    suite = {"name": "nan-suite", "description": "", "seed": 5, "checks": [{"check": "a", "id": "a"}]}
    return RunRecord(
        run_id, 1.0, 2.0, "complete", "builtin:x", "nan-suite", {"suite": suite, "seed": None},
        target={"fingerprint": {"digest": "d", "score": math.nan}},
    )  # fmt: skip


def test_results_json_is_strict_json_with_a_reason_for_each_non_finite_number(tmp_path: Path) -> None:
    run_id = "20260101-000000-nannan"
    with RunStore(tmp_path / "runs.db") as store:
        store.create_run(_full_record(run_id), ["a"])
        bad = Finding(
            "a", Step.ENGINE, Verdict.FAIL, "limit not found",
            metrics={"effective_limit": math.nan, "ratio": math.inf, "ok": 1.0},
            evidence={"curve": [1.0, -math.inf]},
        )  # fmt: skip
        store.commit_check(run_id, "a", [bad], wall_seconds=1.0, model_seconds=0.5, model_calls=1)
        results = write_reports(store, run_id, tmp_path / "out")
    doc = _strict_loads((tmp_path / "out" / "results.json").read_text())
    assert doc == json.loads(json.dumps(results, allow_nan=False)), "the returned document is the written one"
    [finding] = doc["findings"]
    assert finding["metrics"] == {"effective_limit": None, "ratio": None, "ok": 1.0}
    assert finding["evidence"]["curve"] == [1.0, None]
    assert finding["non_finite"] == {
        "metrics.effective_limit": "NaN",
        "metrics.ratio": "Infinity",
        "evidence.curve[1]": "-Infinity",
    }
    assert doc["target"]["fingerprint"]["score"] is None
    assert doc["non_finite"] == {"target.fingerprint.score": "NaN"}
    for repro in (tmp_path / "out" / "evidence").glob("*.json"):
        _strict_loads(repro.read_text())
    junit = (tmp_path / "out" / "junit.xml").read_text()
    assert "effective_limit = null (NaN)" in junit
