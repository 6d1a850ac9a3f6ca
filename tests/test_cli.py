"""CLI exit codes (0 pass, 1 gate failed, 2 bad input) and the report files it writes."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

SUITE = """
name: tiny
seed: 3
checks:
  - check: batch_invariance
    params: {samples: 4, batch_sizes: [1, 3]}
  - check: missing_modality
    params: {image_size: 16}
"""


@pytest.fixture()
def suite_file(tmp_path: Path) -> Path:
    f = tmp_path / "suite.yaml"
    f.write_text(SUITE)
    return f


def _validate(run_cli, tmp_path: Path, suite: Path, target: str, *extra: str):  # type: ignore[no-untyped-def]
    return run_cli(
        "validate", "--target", target, "--suite", str(suite), "--data", "builtin:shapes?n=6",
        "--out", str(tmp_path / "out"), "--store", str(tmp_path / "runs.db"), *extra,
    )  # fmt: skip


def test_validate_exit_0_and_reports(run_cli, tmp_path: Path, suite_file: Path) -> None:
    code, out, err = _validate(run_cli, tmp_path, suite_file, "py:tests.fakes:hash_embed")
    assert code == 0, err
    assert "ALL GATES PASS" in out
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    for key in ("run_id", "target", "suite", "findings"):
        assert key in results
    assert results["target"]["uri"] == "py:tests.fakes:hash_embed"
    assert results["target"]["fingerprint"]["digest"]
    for f in results["findings"]:
        assert {"check", "step", "verdict", "severity", "metrics", "evidence"} <= set(f)
        assert f["verdict"] in ("pass", "fail", "error", "skipped")
        assert all(isinstance(v, float) for v in f["metrics"].values())
    steps = {s["name"]: s["status"] for s in results["steps"]}
    assert steps["adversarial"] == "not available in this version", "no fake pass for unbuilt steps"
    assert steps["contract"] == "not in this suite"
    assert steps["engine"] == "pass" and steps["robustness"] == "pass"
    junit = ET.parse(tmp_path / "out" / "junit.xml").getroot()
    assert len(junit.findall(".//testcase")) == len(results["findings"])
    html = (tmp_path / "out" / "report.html").read_text()
    assert results["run_id"] in html and "not available in this version" in html


def test_validate_exit_1_when_a_gate_fails_and_evidence_is_saved(run_cli, tmp_path: Path, suite_file: Path) -> None:
    code, out, _ = _validate(run_cli, tmp_path, suite_file, "py:tests.fakes:padding_leak")
    assert code == 1 and "GATES FAILED" in out
    evidence = list((tmp_path / "out" / "evidence").glob("*batch_invariance.json"))
    assert evidence, "every failure leaves a repro record"
    repro = json.loads(evidence[0].read_text())
    assert repro["seed"] == 3 and repro["evidence"]["worst"]["batch"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["validate", "--target", "nonsense"], "target must be a URI"),
        (["validate", "--target", "builtin:tiny-clp"], "did you mean builtin:tiny-clip"),
        (["validate", "--suite", "nope"], "unknown suite"),
        pytest.param(  # loads torch and transformers before it can refuse: not the fast tier
            ["validate", "--target", "hf:/nonexistent/model"],
            "neither a directory nor in the local hub cache",
            marks=pytest.mark.integration,
        ),
        (["validate", "--target", "py:tests.fakes:hash_embed", "--data", "/no/such.jsonl"], "dataset not found"),
        (["report", "nope"], "no run store"),
        (["list", "bogus"], "unknown kind"),
        (["validate", "--bogus-flag"], "No such option"),
    ],
)
def test_bad_input_exits_2_with_one_line(run_cli, tmp_path: Path, argv: list[str], message: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(*argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err + out


def test_runs_and_report_rerender(run_cli, tmp_path: Path, suite_file: Path) -> None:
    code, _, _ = _validate(run_cli, tmp_path, suite_file, "py:tests.fakes:padding_leak")
    assert code == 1
    run_id = json.loads((tmp_path / "out" / "results.json").read_text())["run_id"]
    code, out, _ = run_cli("runs", "--store", str(tmp_path / "runs.db"))
    assert code == 0 and run_id[:15] in out
    code, _, _ = run_cli("report", run_id[:18], "--store", str(tmp_path / "runs.db"), "--out", str(tmp_path / "again"))
    assert code == 1
    a = json.loads((tmp_path / "out" / "results.json").read_text())
    b = json.loads((tmp_path / "again" / "results.json").read_text())
    assert a == b


@pytest.mark.parametrize("kind", ["checks", "perturbations", "targets", "suites", "datasets"])
def test_list(run_cli, kind: str) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run_cli("list", kind)
    assert code == 0 and out.strip()
