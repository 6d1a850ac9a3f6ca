"""``mmchaos compare`` and ``validate --baseline`` on stored runs of a numpy CLIP stand-in.

The runs are real (the runner, the SQLite store, the robustness sweep on builtin:shapes); the
target is :class:`tests.fakes.targets.ShapeColourTarget`, and its degraded copy the same pipeline
without its median filter (:mod:`tests.fakes.degraded`): clean images score as before, noisy ones
do not, so exactly one perturbation regresses. The real-model version (builtin:tiny-clip) is in
tests/integration/cli/test_compare_cli.py.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from mmchaos.compare import Tolerance, Tolerances, compare_runs, load_run, load_tolerances
from mmchaos.errors import UsageError

GOOD = "py:tests.fakes.degraded:shape_colour"
NO_DENOISE = "py:tests.fakes.degraded:no_denoise"

SUITE = """
name: compare-unit
seed: 0
checks:
  - check: robustness
    params:
      samples: 24
      severities: [1, 3, 5]
      perturbations: [gaussian_noise, defocus_blur, jpeg_compression]
      worst_cases: 0
  - check: missing_modality
"""
OTHER_SUITE = """
name: compare-other
seed: 0
checks:
  - check: robustness
    params:
      samples: 24
      severities: [1, 3]
      perturbations: [gaussian_noise, frost]
      worst_cases: 0
  - check: batch_invariance
    params: {samples: 4, batch_sizes: [1, 3]}
"""
DISJOINT_SUITE = """
name: compare-disjoint
seed: 0
checks:
  - check: batch_invariance
    params: {samples: 4, batch_sizes: [1, 3]}
"""


class Runs:
    """The module's stored runs: ids by name, the store, and a report folder of the baseline."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = root / "runs.db"
        self.ids: dict[str, str] = {}
        self.suite = root / "suite.yaml"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Five stored runs, made once: the baseline, its twin, the degraded copy, another suite, a disjoint one."""
    from mmchaos.report import write_reports
    from mmchaos.runner import RunConfig, run_suite
    from mmchaos.store import RunStore
    from mmchaos.suites import load_suite

    r = Runs(tmp_path_factory.mktemp("compare"))
    suites = {}
    for name, text in (("main", SUITE), ("other", OTHER_SUITE), ("disjoint", DISJOINT_SUITE)):
        path = r.root / f"{name}.yaml"
        path.write_text(text)
        suites[name] = load_suite(str(path))
    r.suite = r.root / "main.yaml"
    plan = {"a": (GOOD, "main"), "twin": (GOOD, "main"), "degraded": (NO_DENOISE, "main"),
            "other": (GOOD, "other"), "disjoint": (GOOD, "disjoint")}  # fmt: skip
    with RunStore(r.store) as store:
        for name, (target, suite) in plan.items():
            r.ids[name] = run_suite(RunConfig(target=target, suite=suites[suite], data="builtin:shapes"), store).run_id
        write_reports(store, r.ids["a"], r.root / "report-a")
    return r


def _compare(runs: Runs, a: str, b: str, tolerances: Tolerances | None = None) -> dict[str, Any]:
    return compare_runs(load_run(a, runs.store), load_run(b, runs.store), tolerances)


def test_a_pipeline_that_dropped_its_denoising_regresses_under_noise_and_nowhere_else(
    runs: Runs, run_cli: Any, tmp_path: Path
) -> None:
    code, out, err = run_cli("compare", runs.ids["a"], runs.ids["degraded"], "--store", str(runs.store),
                             "--out", str(tmp_path / "cmp"))  # fmt: skip
    assert code == 1, out + err
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert doc["summary"]["regressed"] == ["gaussian_noise"], doc["regressions"]
    assert {r["severity"] for r in doc["regressions"]} <= {3, 5}  # severity 1 barely hurts either
    assert "REGRESSED gaussian_noise" in " ".join(out.split())
    for kept in ("defocus_blur", "jpeg_compression"):
        assert f"REGRESSED {kept}" not in out
        assert not next(c for c in doc["curves"] if c["perturbation"] == kept)["regressed"]
    # JUnit: the regressed curve is the one failure; HTML: its chart has run A's and run B's curve
    junit = ET.parse(tmp_path / "cmp" / "compare-junit.xml").getroot()
    failed = [c.get("name") for c in junit.iter("testcase") if c.find("failure") is not None]
    assert failed == ["gaussian_noise zero_shot accuracy"]
    html = (tmp_path / "cmp" / "compare.html").read_text()
    chart = html.split("<h3>gaussian_noise ", 1)[1].split('<div class="chart">', 1)[0]
    assert chart.count("<polyline") == 2 and f"A {runs.ids['a']}" in chart and f"B {runs.ids['degraded']}" in chart


def test_two_runs_of_one_model_compare_equal_and_exit_0(runs: Runs, run_cli: Any, tmp_path: Path) -> None:
    code, out, err = run_cli("compare", runs.ids["a"], runs.ids["twin"], "--store", str(runs.store),
                             "--out", str(tmp_path / "cmp"))  # fmt: skip
    assert code == 0, out + err
    assert "NO REGRESSION" in out
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert doc["summary"]["compared_points"] == 10 and doc["summary"]["compared_findings"] > 5
    assert all(p["delta"] == 0 for c in doc["curves"] for p in c["points"])
    assert doc["not_compared"] == [] and doc["caveats"] == []


def test_a_report_folder_or_results_json_is_a_run_too(runs: Runs) -> None:
    folder = _compare(runs, str(runs.root / "report-a"), runs.ids["twin"])
    file = _compare(runs, str(runs.root / "report-a" / "results.json"), runs.ids["twin"])
    assert folder["summary"]["exit_code"] == file["summary"]["exit_code"] == 0
    assert folder["a"]["source"].endswith("results.json") and folder["a"]["run_id"] == runs.ids["a"]


def test_runs_of_different_suites_compare_what_overlaps_and_list_the_rest(runs: Runs) -> None:
    doc = _compare(runs, runs.ids["a"], runs.ids["other"])
    assert doc["summary"]["exit_code"] == 0
    noise = next(c for c in doc["curves"] if c["perturbation"] == "gaussian_noise")
    assert [p["severity"] for p in noise["points"]] == [1, 3]
    missing = {(n["only_in"], n["what"]) for n in doc["not_compared"]}
    assert ("a", "gaussian_noise at severities 5") in missing
    assert ("a", "defocus_blur (accuracy)") in missing and ("b", "frost (accuracy)") in missing
    checks_only = {(n["only_in"], n["check"]) for n in doc["not_compared"]}
    assert ("a", "missing_modality") in checks_only and ("b", "batch_invariance") in checks_only
    assert any("differ in suite" in c for c in doc["caveats"])


def test_runs_with_nothing_in_common_are_refused(runs: Runs, run_cli: Any, tmp_path: Path) -> None:
    code, out, err = run_cli("compare", runs.ids["a"], runs.ids["disjoint"], "--store", str(runs.store),
                             "--out", str(tmp_path / "cmp"))  # fmt: skip
    assert code == 2 and err.startswith("error [runs_disjoint]") and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("ref", "store", "says"),
    [
        ("20990101-000000-abcdef", "runs.db", "no run '20990101-000000-abcdef'"),
        ("latest", "absent.db", "no run store at"),
        ("gone/results.json", "runs.db", "no file gone/results.json"),
    ],
)
def test_a_missing_run_is_one_line_and_exit_2(
    runs: Runs, run_cli: Any, tmp_path: Path, ref: str, store: str, says: str
) -> None:
    code, out, err = run_cli("compare", runs.ids["a"], ref, "--store", str(runs.root / store),
                             "--out", str(tmp_path / "cmp"))  # fmt: skip
    assert code == 2 and err.startswith("error [run_missing]") and says in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "cmp" / "compare.json").exists()


def test_a_report_folder_without_results_json_is_a_missing_run(runs: Runs, tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        load_run(str(tmp_path), runs.store)
    assert info.value.code == "run_missing"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"schema_version": 3, "run_id": "x", "findi', "not valid JSON"),
        ("[1, 2]", "not a mmchaos results document"),
        (
            '{"schema_version": 3, "run_id": "x", "target": {"uri": "t"}, "suite": {"name": "s"}, '
            '"findings": [{"check": "c", "step": 2, "title": "t"}]}',
            "findings.0.verdict",
        ),
        (
            '{"schema_version": 99, "run_id": "x", "target": {"uri": "t"}, "suite": {"name": "s"}, "findings": []}',
            "schema 99",
        ),
        (b"\xff\xfe\x00garbage", "not valid JSON"),
    ],
)
def test_a_corrupt_results_json_is_refused_with_a_stable_code(
    runs: Runs, run_cli: Any, tmp_path: Path, content: str | bytes, says: str
) -> None:
    bad = tmp_path / "results.json"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, out, err = run_cli("compare", str(bad), runs.ids["a"], "--store", str(runs.store),
                             "--out", str(tmp_path / "cmp"))  # fmt: skip
    assert code == 2 and err.startswith("error [results_invalid]") and says in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_finding_that_passed_and_now_fails_is_a_regression(runs: Runs, tmp_path: Path) -> None:
    doc = json.loads((runs.root / "report-a" / "results.json").read_text())
    probe = next(f for f in doc["findings"] if f["check"] == "missing_modality")
    probe["verdict"] = "fail"
    (tmp_path / "results.json").write_text(json.dumps(doc))
    out = _compare(runs, runs.ids["a"], str(tmp_path / "results.json"))
    assert out["summary"]["exit_code"] == 1
    assert out["summary"]["regressed"] == [f"missing_modality[probe={probe['evidence']['probe']}]"]
    back = _compare(runs, str(tmp_path / "results.json"), runs.ids["a"])  # fail -> pass: an improvement
    assert back["summary"]["exit_code"] == 0 and back["summary"]["improvements"] == 1


def test_tolerances_from_the_flag_and_a_file_decide_what_counts(runs: Runs, run_cli: Any, tmp_path: Path) -> None:
    store = ("--store", str(runs.store), "--out", str(tmp_path / "cmp"))
    a, b = runs.ids["a"], runs.ids["degraded"]
    assert run_cli("compare", a, b, "--tolerance", "1", *store)[0] == 0  # all of A's score may go
    lenient = tmp_path / "tol.yaml"
    lenient.write_text("perturbations:\n  gaussian_noise: {relative: 1.0}\n")
    assert run_cli("compare", a, b, "--tolerances", str(lenient), *store)[0] == 0
    strict = tmp_path / "strict.yaml"
    strict.write_text("default: {relative: 0, absolute: 0, samples: 0}\n")
    # back from the degraded copy to the good one, gaussian_noise loses one sample of 24 at severity 1:
    # noise by default, a regression when nothing may be lost
    lost_one = ("gaussian_noise", 1)
    by_default = _compare(runs, b, a)
    assert lost_one not in {(r["name"], r["severity"]) for r in by_default["regressions"]}
    exact = _compare(runs, b, a, load_tolerances(strict))
    assert lost_one in {(r["name"], r["severity"]) for r in exact["regressions"]}
    for text, says in (("default: {relativ: 0.1}\n", "default.relativ"), ("[1]\n", "must be a mapping"),
                       ("default: {relative: 2}\n", "default.relative"), ("a: [\n", "not valid YAML")):  # fmt: skip
        strict.write_text(text)
        code, _, err = run_cli("compare", a, b, "--tolerances", str(strict), *store)
        assert code == 2 and err.startswith("error [tolerances_invalid]") and says in err, err
    code, _, err = run_cli("compare", a, b, "--tolerance", "1.5", *store)
    assert code == 2 and err.startswith("error [tolerances_invalid]"), err


def test_one_flipped_sample_is_never_a_regression_and_a_file_adds_to_the_metric_defaults(tmp_path: Path) -> None:
    tol = Tolerance()
    assert tol.allowed(0.5, 24) == pytest.approx(1 / 24)  # one sample of 24: more than 5 % of 0.5 and than 0.02
    assert tol.allowed(1.0, 500) == pytest.approx(0.05) and tol.allowed(0.2, 500) == pytest.approx(0.02)
    f = tmp_path / "t.yaml"
    f.write_text("metrics:\n  accuracy: {relative: 0.1}\n")
    loaded = load_tolerances(f)
    assert loaded.for_point("accuracy", "frost").relative == 0.1
    assert loaded.for_point("cer", "frost").absolute == 0.01  # the built-in CER default stays
    assert loaded.for_point("recall@1", "frost") == loaded.default


def test_validate_baseline_gates_the_new_run_against_the_stored_one(runs: Runs, run_cli: Any, tmp_path: Path) -> None:
    def validate(target: str, baseline: str, out: str) -> tuple[int, str, str]:
        return run_cli(  # type: ignore[no-any-return]
            "validate", "--target", target, "--suite", str(runs.suite), "--data", "builtin:shapes",
            "--store", str(tmp_path / "new.db"), "--out", str(tmp_path / out), "--baseline", baseline,
        )  # fmt: skip

    base = str(runs.root / "report-a")
    code, out, err = validate(NO_DENOISE, base, "bad")
    assert code == 1, out + err  # the run's own gates pass (apart from noise): the comparison fails it
    doc = json.loads((tmp_path / "bad" / "compare.json").read_text())
    assert doc["summary"]["regressed"] == ["gaussian_noise"] and doc["a"]["run_id"] == runs.ids["a"]
    assert (tmp_path / "bad" / "results.json").is_file() and "REGRESSED gaussian_noise" in " ".join(out.split())
    code, out, err = validate(GOOD, base, "good")
    assert code == 0 and "NO REGRESSION" in out, out + err


def test_validate_refuses_a_missing_or_unrelated_baseline_before_it_runs(
    runs: Runs, run_cli: Any, tmp_path: Path
) -> None:
    disjoint = runs.root / "disjoint.yaml"
    for suite, baseline, code_name in ((runs.suite, "nope", "run_missing"), (disjoint, runs.ids["a"], "runs_disjoint")):
        code, _, err = run_cli(
            "validate", "--target", GOOD, "--suite", str(suite), "--store", str(runs.store),
            "--out", str(tmp_path / "out"), "--baseline", baseline,
        )  # fmt: skip
        assert code == 2 and err.startswith(f"error [{code_name}]"), err
    assert not (tmp_path / "out" / "results.json").exists()
    code, _, err = run_cli("validate", "--tolerance", "0.1", "--out", str(tmp_path / "out"))
    assert code == 2 and "apply to --baseline" in err, err


def test_the_tolerance_file_in_the_docs_loads(tmp_path: Path) -> None:
    import re

    from tests.paths import REPO

    example = re.search(r"```yaml\n(.*?)```", (REPO / "docs" / "compare.md").read_text(), re.S)
    assert example is not None
    (tmp_path / "t.yaml").write_text(example.group(1))
    loaded = load_tolerances(tmp_path / "t.yaml")
    assert loaded.for_point("accuracy", "screenshot_moire").relative == 0.2
    assert loaded.for_point("cer", "frost").absolute == 0.005


def test_a_perturbation_run_b_could_not_measure_is_a_regression(runs: Runs, tmp_path: Path) -> None:
    doc = json.loads((runs.root / "report-a" / "results.json").read_text())
    i = next(i for i, f in enumerate(doc["findings"]) if f["evidence"].get("perturbation") == "defocus_blur")
    doc["findings"][i] = {  # what robustness reports when every work unit of a perturbation failed
        "check": "robustness", "step": 2, "step_name": "robustness", "verdict": "error", "severity": "medium",
        "title": "defocus_blur: not measured: the endpoint failed on 3 of 3 work units, 3 tries each",
        "metrics": {}, "gate": "", "message": "", "suggestion": "",
        "evidence": {"perturbation": "defocus_blur", "errors": ["HTTP 500"]},
    }  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(doc))
    out = _compare(runs, runs.ids["a"], str(tmp_path / "results.json"))
    assert out["summary"]["exit_code"] == 1 and out["summary"]["regressed"] == ["defocus_blur"]
    assert {"only_in": "a", "check": "robustness", "what": "defocus_blur (accuracy)"} in out["not_compared"]


def test_the_comparison_junit_validates_against_jenkins_junit_10_xsd(runs: Runs) -> None:
    xmlschema = pytest.importorskip("xmlschema", reason="pip install xmlschema (in the dev extra)")
    from mmchaos.report.compare_junit import render_compare_junit
    from tests.paths import TESTS

    xml = render_compare_junit(_compare(runs, runs.ids["a"], runs.ids["degraded"]))
    xmlschema.XMLSchema(str(TESTS / "data" / "junit-10.xsd")).validate(xml)
    root = ET.fromstring(xml)
    assert root.get("failures") == "1" and int(root.get("tests") or 0) > 5


def test_runs_of_other_data_or_an_unfinished_run_are_compared_with_a_caveat(runs: Runs, tmp_path: Path) -> None:
    doc = json.loads((runs.root / "report-a" / "results.json").read_text())
    doc["dataset"]["source"] = "./eval.jsonl"
    doc["status"] = "running"
    (tmp_path / "results.json").write_text(json.dumps(doc))
    out = _compare(runs, runs.ids["twin"], str(tmp_path / "results.json"))
    assert out["summary"]["exit_code"] == 0
    assert any("differ in data" in c and "./eval.jsonl (B)" in c for c in out["caveats"]), out["caveats"]
    assert any("is running" in c for c in out["caveats"]), out["caveats"]
