"""A run whose checks did not all finish (Ctrl-C, kill -9) never reads as passing: not in its exit
code, the terminal banner, the HTML banner or junit.xml, while the same run finished passes."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mmchaos.findings import Finding, Step, Verdict
from mmchaos.report import build_results, render_junit
from mmchaos.report.html import render_html
from mmchaos.store import RunRecord, RunStore
from tests.paths import TEST_DATA

RUN_ID = "20260101-000000-unfini"


def _run(tmp_path: Path, *, finish_b: bool) -> Path:
    """Checks ``a`` (passed) and ``b``: started and left running, or finished passing too."""
    db = tmp_path / "runs.db"
    suite = {"name": "two", "description": "", "seed": 1, "checks": []}
    status = "complete" if finish_b else "interrupted"
    with RunStore(db) as store:
        store.create_run(RunRecord(RUN_ID, 1.0, None, status, "builtin:x", "two", {"suite": suite}), ["a", "b"])
        store.commit_check(RUN_ID, "a", [Finding("a", Step.CONTRACT, Verdict.PASS, "a passes")],
                           wall_seconds=1.0, model_seconds=0.5, model_calls=1)  # fmt: skip
        store.mark_started(RUN_ID, "b")
        if finish_b:
            store.commit_check(RUN_ID, "b", [Finding("b", Step.ENGINE, Verdict.PASS, "b passes")],
                               wall_seconds=1.0, model_seconds=0.5, model_calls=1)  # fmt: skip
    return db


@pytest.mark.parametrize("strict", [False, True])
def test_an_unfinished_run_exits_1_and_no_report_says_it_passed(tmp_path: Path, strict: bool) -> None:
    db = _run(tmp_path, finish_b=False)
    with RunStore(db) as store:
        results = build_results(store, RUN_ID, strict=strict)
    summary = results["summary"]
    assert summary["incomplete_checks"] == ["b"] and results["status"] == "interrupted"
    assert summary["exit_code"] == 1 and summary["gates_passed"] is False
    page = render_html(results, {})
    assert '<div class="banner fail"><b>INCOMPLETE</b>' in page and "not finished: b" in page
    xml = render_junit(results)
    xmlschema = pytest.importorskip("xmlschema", reason="pip install xmlschema (in the dev extra)")
    xmlschema.XMLSchema(str(TEST_DATA / "junit-10.xsd")).validate(xml)
    root = ET.fromstring(xml)
    assert root.get("tests") == "2" and root.get("errors") == "1"
    [case] = [c for c in root.iter("testcase") if c.find("error") is not None]
    assert case.get("classname") == "mmchaos.b" and f"--resume {RUN_ID}" in (case.findtext("error") or "")


def test_the_same_run_finished_passes(tmp_path: Path) -> None:
    db = _run(tmp_path, finish_b=True)
    with RunStore(db) as store:
        results = build_results(store, RUN_ID)
    assert results["summary"]["exit_code"] == 0 and results["summary"]["gates_passed"] is True
    assert '<div class="banner pass"><b>PASS</b>' in render_html(results, {})
    root = ET.fromstring(render_junit(results))
    assert root.get("errors") == "0" and not [s for s in root.iter("testsuite") if s.get("name") == "incomplete"]


def test_mmchaos_report_on_an_unfinished_run_says_so_and_exits_1(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = _run(tmp_path, finish_b=False)
    code, out, _ = run_cli("report", RUN_ID, "--store", str(db), "--out", str(tmp_path / "out"))
    assert code == 1
    assert "ALL GATES PASS" not in out and "RUN INCOMPLETE" in out and "not finished: b" in out
    assert f"mmchaos validate --resume {RUN_ID} --store {db}" in " ".join(out.split())
    (tmp_path / "done").mkdir()
    finished = _run(tmp_path / "done", finish_b=True)
    code, out, _ = run_cli("report", RUN_ID, "--store", str(finished), "--out", str(tmp_path / "out2"))
    assert code == 0 and "ALL GATES PASS" in out
