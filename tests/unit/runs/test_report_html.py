"""report.html: one self-contained, well-formed page, every string from results escaped; junit.xml
that Jenkins' junit-10.xsd accepts."""

from __future__ import annotations

import io
import math
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from mmchaos.findings import Finding, Step, Verdict
from mmchaos.report import build_results, render_junit
from mmchaos.report.html import render_html
from mmchaos.store import RunRecord, RunStore
from tests.paths import TEST_DATA

HOSTILE = "<script>alert(1)</script>"
DIGEST = "0123456789abcdef"
RUN_ID = "run-20240101-abcdef"
Json = dict[str, Any]
VOID = {"meta", "img", "br", "hr", "input", "link", "source", "wbr", "col", "area", "base"}


def _png(colour: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), colour).save(buf, format="PNG")
    return buf.getvalue()


def _robustness(name: str, metric: str, values: list[float], verdict: str, **ev: Any) -> Json:
    metrics = {"clean": values[0], "mean_relative": sum(values[1:]) / values[0] / 5}
    for s, v in enumerate(values[1:], start=1):
        metrics[f"s{s}"] = v
        metrics[f"relative_s{s}"] = v / values[0]
    evidence = {
        "perturbation": name,
        "group": "noise",
        "source": "builtin",
        "metric": metric,
        "higher_is_better": True,
        "samples": 32,
        "dataset": "builtin:shapes",
        "seed": 7,
        "severities": [1, 2, 3, 4, 5],
        **ev,
    }
    return _finding(
        "robustness",
        2,
        verdict,
        f"{name}: {metric}",
        metrics=metrics,
        evidence=evidence,
        severity="high" if verdict == "fail" else "info",
        gate=f"relative {metric} >= 0.8 at severities <= 3",
        suggestion="augment",
    )


def _finding(check: str, step: int, verdict: str, title: str, **kw: Any) -> Json:
    names = ["contract", "robustness", "adversarial", "engine", "integration", "serving"]
    base = {"severity": "info", "metrics": {}, "gate": "", "message": "", "suggestion": ""}
    return {
        "check": check,
        "step": step,
        "step_name": names[step - 1],
        "verdict": verdict,
        "title": title,
        "evidence": {},
        **base,
        **kw,
    }


IMAGE_CASE = {
    "sample": "shape-3",
    "index": 3,
    "severity": 3,
    "clean_score": 1.0,
    "perturbed_score": 0.0,
    "params": {"sigma": 0.12},
    "truth": "circle",
    "clean_output": "circle",
    "perturbed_output": "square",
    "clean_artifact": "n-clean.png",
    "perturbed_artifact": "n-perturbed.png",
}
TEXT_CASE = {
    "sample": "cap-1",
    "index": 1,
    "severity": 3,
    "clean_score": 1.0,
    "perturbed_score": 0.0,
    "params": {"swaps": 2},
    "truth": "a red circle",
    "clean_text": "a red circle",
    "perturbed_text": "a rde cirlce <b>",
}
NA = "not available in this version"
STEPS = [
    ("contract", "skipped"),
    ("robustness", "fail"),
    ("adversarial", NA),
    ("engine", "fail"),
    ("integration", NA),
    ("serving", NA),
    ("observability", "not in this suite"),
]


def make_results() -> tuple[Json, dict[str, bytes]]:
    """A synthetic run: robustness sweeps (image, text), a batch fail, a skip, a hostile title."""
    findings = [
        _robustness(
            "gaussian_noise",
            "accuracy",
            [0.9, 0.85, 0.6, 0.4, 0.3, 0.2],
            "fail",
            task="zero-shot",
            worst_cases=[IMAGE_CASE],
        ),
        _robustness(
            "typos",
            "recall@1",
            [0.8, 0.78, 0.75, 0.7, 0.6, 0.5],
            "pass",
            task="retrieval",
            worst_cases=[TEXT_CASE],
        ),
        _finding(
            "batch_invariance",
            4,
            "fail",
            HOSTILE,
            severity="high",
            metrics={"max_deviation": 0.02},
            message="sample 3 deviates",
            evidence={
                "worst": {"deviation": 0.02, "batch_size": 8},
                "input_artifact": "n-clean.png",
                "traceback": "Traceback:\n  <boom>",
            },
        ),
        _finding("missing_modality", 1, "skipped", "target lacks embed_texts"),
    ]
    fingerprint = {
        "weights": "f" * 64,
        "tokenizer": "e" * 64,
        "processor": None,
        "config": "d" * 64,
        "versions": {"torch": "2.3"},
        "digest": DIGEST,
    }
    results = {
        "schema_version": 1,
        "run_id": RUN_ID,
        "status": "done",
        "created": "2024-01-01T00:00:00+00:00",
        "finished": "2024-01-01T00:05:00+00:00",
        "seed": 7,
        "target": {
            "uri": "builtin:tiny-clip",
            "capabilities": ["embed_images"],
            "fingerprint": fingerprint,
        },
        "suite": {"name": "quick", "description": "Fast smoke suite", "seed": 7, "checks": []},
        "config": {},
        "environment": {"mmchaos": "0.1.0", "python": "3.11"},
        "dataset": {
            "name": "shapes",
            "source": "builtin:shapes",
            "size": 32,
            "classes": 4,
            "fields": ["image", "label"],
        },
        "summary": {
            "verdicts": {"pass": 1, "fail": 2, "error": 0, "skipped": 1},
            "gates_passed": False,
            "exit_code": 1,
            "incomplete_checks": [],
            "wall_seconds": 12.5,
            "model_seconds": 9.0,
        },
        "steps": [{"step": i, "name": n, "status": s, "verdicts": {}} for i, (n, s) in enumerate(STEPS, 1)],
        "checks": [
            {
                "id": "robustness",
                "status": "done",
                "wall_seconds": 10.0,
                "model_seconds": 8.0,
                "model_calls": 120,
            },
        ],
        "findings": findings,
    }
    artifacts = {"n-clean.png": _png((200, 30, 30)), "n-perturbed.png": _png((90, 90, 90))}
    return results, artifacts


class _Strict(HTMLParser):
    """Fails on unbalanced or mis-nested tags (HTMLParser alone accepts anything)."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()


@pytest.fixture(scope="module")
def page() -> str:
    results, artifacts = make_results()
    return render_html(results, artifacts)


def test_well_formed(page: str) -> None:
    parser = _Strict()
    parser.feed(page)
    parser.close()
    assert parser.stack == []
    assert page.startswith("<!DOCTYPE html>")


def test_self_contained(page: str) -> None:
    assert 'src="http' not in page and "<link" not in page and "<script" not in page
    assert "<svg" in page and "<polyline" in page
    assert "data:image/png;base64," in page
    assert "image-rendering:pixelated" in page and 'class="px" width="128"' in page


def test_hostile_text_escaped(page: str) -> None:
    assert HOSTILE not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<boom>" not in page and "rde cirlce <b>" not in page


def test_content(page: str) -> None:
    wanted = [NA, RUN_ID, DIGEST, "builtin:tiny-clip", "quick", "FAIL", "gaussian_noise", "typos"]
    for text in [*wanted, "recall@1", "a rde cirlce", "&quot;sigma&quot;", "not in this suite"]:
        assert text in page, text
    assert page.count("<svg") >= 2  # one chart per task metric group (plus legend swatches)


def test_pass_banner_and_missing_artifact() -> None:
    results, _ = make_results()
    results["summary"]["gates_passed"] = True
    page = render_html(results, {})
    assert '<div class="banner pass"><b>PASS</b>' in page
    assert "missing artifact n-clean.png" in page


# -- junit.xml ------------------------------------------------------------------------------------

JUNIT_XSD = TEST_DATA / "junit-10.xsd"


def _every_verdict_run(tmp_path: Path) -> tuple[RunStore, str]:
    """A stored run with one finding of each verdict, spread over three steps."""
    run_id = "20260101-000000-junit0"
    suite = {"name": "junit", "description": "", "seed": 1, "checks": []}
    store = RunStore(tmp_path / "runs.db")
    store.create_run(RunRecord(run_id, 1.0, 2.0, "complete", "builtin:x", "junit", {"suite": suite}), ["a", "b", "c"])
    findings = {
        "a": [Finding("a", Step.CONTRACT, v, f"a {v.value} <&>", metrics={"m": 0.5}) for v in Verdict],
        "b": [Finding("b", Step.ENGINE, Verdict.WARN, "b warns", metrics={"x": math.nan})],
        "c": [Finding("c", Step.SERVING, Verdict.PASS, "c passes")],
    }
    for i, (check, fs) in enumerate(findings.items()):
        store.commit_check(run_id, check, fs, wall_seconds=1.25 + i, model_seconds=0.5, model_calls=1)
    return store, run_id


@pytest.mark.parametrize("strict", [False, True])
def test_junit_validates_against_jenkins_junit_10_xsd(tmp_path: Path, strict: bool) -> None:
    xmlschema = pytest.importorskip("xmlschema", reason="pip install xmlschema (in the dev extra)")
    store, run_id = _every_verdict_run(tmp_path)
    with store:
        xml = render_junit(build_results(store, run_id, strict=strict))
    xmlschema.XMLSchema(str(JUNIT_XSD)).validate(xml)  # raises with the offending element
    root = ET.fromstring(xml)
    assert root.get("time") == "6.750" and root.get("tests") == "7"
    assert root.get("failures") == ("3" if strict else "1") and root.get("errors") == "1"
    suites = root.findall("testsuite")
    assert [s.get("time") for s in suites] == ["1.250", "2.250", "3.250"]
    cases = root.findall(".//testcase")
    assert all(c.get("time") for c in cases) and len(cases) == 7
    props = {p.get("name"): p.get("value") for p in suites[0].iter("property")}
    assert props["run_id"] == run_id and props["seed"] == "1" and props["target"] == "builtin:x"
    warn = next(c for c in cases if "b warns" in (c.get("name") or ""))
    if strict:
        assert warn.find("failure") is not None and warn.find("failure").get("type") == "warning"  # type: ignore[union-attr]
    else:
        assert (warn.findtext("system-out") or "").startswith("WARNING: b warns")
        assert warn.find("failure") is None


# -- the relative table: every row's mean is the mean of the cells it shows ----------------------


def _missing_modality() -> Json:
    """missing_modality removes content: its gate and mean_relative use the intact items only."""
    f = _robustness("missing_modality", "accuracy", [0.9, 0.72, 0.54, 0.36, 0.18, 0.0], "pass", task="zero-shot")
    intact = [1.0, 1.0, 0.99, 1.0, 0.98]
    f["metrics"].update({f"intact_relative_s{s}": v for s, v in enumerate(intact, start=1)})
    f["metrics"]["mean_relative"] = sum(intact) / len(intact)
    return f


def _relative_rows(page: str) -> dict[str, tuple[list[float], float]]:
    table = page[page.index("<h3>Relative to clean") :]
    table = table[: table.index("</table>")]
    rows: dict[str, tuple[list[float], float]] = {}
    for row in table.split("<tr>")[2:]:
        name = row.split("<td>", 2)[1].split("</td>")[0]
        cells = [float(c.split(">", 1)[1].split("<")[0]) for c in row.split('<td class="heat"')[1:]]
        mean = float(row.rsplit('<td class="num">', 1)[1].split("<")[0])
        rows[name] = (cells, mean)
    return rows


def test_every_relative_row_shows_a_mean_of_its_own_cells() -> None:
    results, artifacts = make_results()
    results["findings"].append(_missing_modality())
    rows = _relative_rows(render_html(results, artifacts))
    assert set(rows) >= {"gaussian_noise", "typos"} and any(name.startswith("missing_modality") for name in rows)
    for name, (cells, mean) in rows.items():
        assert mean == pytest.approx(sum(cells) / len(cells), abs=0.006), name
    [intact] = [cells for name, (cells, _) in rows.items() if name.startswith("missing_modality")]
    assert intact == [1.0, 1.0, 0.99, 1.0, 0.98], "the row shows what its gate and mean use: the intact items"


@pytest.mark.parametrize("strict", [False, True])
def test_a_step_whose_every_check_was_skipped_is_untested_never_all_pass(tmp_path: Path, strict: bool) -> None:
    """Four of six checks skipped once printed ALL GATES PASS."""
    import io

    from rich.console import Console

    from mmchaos.cli.summary import print_summary

    run_id = "20260101-000000-untest"
    suite = {"name": "s", "description": "", "seed": 1, "checks": []}
    store = RunStore(tmp_path / "runs.db")
    store.create_run(RunRecord(run_id, 1.0, 2.0, "complete", "openai:x", "s", {"suite": suite}), ["a", "b", "c"])
    store.commit_check(run_id, "a", [Finding("a", Step.CONTRACT, Verdict.SKIPPED, "skipped: needs embed_image")],
                       wall_seconds=0.1, model_seconds=0.0, model_calls=0)  # fmt: skip
    store.commit_check(run_id, "b", [Finding("b", Step.SERVING, Verdict.PASS, "ok")], wall_seconds=0.1,
                       model_seconds=0.0, model_calls=0)  # fmt: skip
    store.commit_check(run_id, "c", [Finding("c", Step.SERVING, Verdict.SKIPPED, "skipped")], wall_seconds=0.1,
                       model_seconds=0.0, model_calls=0)  # fmt: skip
    with store:
        results = build_results(store, run_id, strict=strict)
    summary = results["summary"]
    assert summary["untested_steps"] == [{"step": 1, "name": "contract"}]  # step 6 had a check that ran
    assert summary["exit_code"] == (1 if strict else 0)
    buf = io.StringIO()
    print_summary(Console(file=buf, width=160), results, tmp_path)
    out = buf.getvalue()
    assert "ALL GATES PASS" not in out and "untested" in out.lower() and "1 contract" in out
    assert "untested steps (every check skipped): 1 contract" in render_html(results, {})
