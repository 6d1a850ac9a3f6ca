"""CLI exit codes (0 pass, 1 gate failed, 2 bad input) and the report files it writes."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from mmchaos.findings import Artifact, Finding, Step, Verdict
from mmchaos.store import RunRecord, RunStore
from tests.support.cli import SUITE, _snapshot, _validate


def test_validate_exit_0_and_reports(run_cli, tmp_path: Path, suite_file: Path) -> None:
    code, out, err = _validate(run_cli, tmp_path, suite_file, "py:tests.fakes.targets:hash_embed")
    assert code == 0, err
    assert "ALL GATES PASS" in out
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    for key in ("run_id", "target", "suite", "findings"):
        assert key in results
    assert results["target"]["uri"] == "py:tests.fakes.targets:hash_embed"
    assert results["target"]["fingerprint"]["digest"]
    for f in results["findings"]:
        assert {"check", "step", "verdict", "severity", "metrics", "evidence"} <= set(f)
        assert f["verdict"] in ("pass", "fail", "error", "skipped")
        assert all(isinstance(v, float) for v in f["metrics"].values())
    steps = {s["name"]: s["status"] for s in results["steps"]}
    assert steps["adversarial"] == "not in this suite", "no fake pass for steps a suite leaves out"
    assert steps["contract"] == "not in this suite"
    assert steps["engine"] == "pass" and steps["robustness"] == "pass"
    junit = ET.parse(tmp_path / "out" / "junit.xml").getroot()
    assert len(junit.findall(".//testcase")) == len(results["findings"])
    html = (tmp_path / "out" / "report.html").read_text()
    assert results["run_id"] in html and "not in this suite" in html


def test_validate_exit_1_when_a_gate_fails_and_evidence_is_saved(run_cli, tmp_path: Path, suite_file: Path) -> None:
    code, out, _ = _validate(run_cli, tmp_path, suite_file, "py:tests.fakes.targets:padding_leak")
    assert code == 1 and "GATES FAILED" in out
    evidence = list((tmp_path / "out" / "evidence").glob("*batch_invariance.json"))
    assert evidence, "every failure leaves a repro record"
    repro = json.loads(evidence[0].read_text())
    assert repro["seed"] == 3 and repro["evidence"]["worst"]["batch"]


def test_runs_and_report_rerender(run_cli, tmp_path: Path, suite_file: Path) -> None:
    code, _, _ = _validate(run_cli, tmp_path, suite_file, "py:tests.fakes.targets:padding_leak")
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


def _fake_plugin(tmp_path: Path) -> Path:
    """A distribution on sys.path that registers the ``fakeplug:`` target scheme by entry point."""
    site = tmp_path / "site"
    info = site / "fakeplug-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[mmchaos.targets]\nfakeplug = fakeplug_mod:load\n")
    (site / "fakeplug_mod.py").write_text(
        'def load(rest, **options):\n    """``fakeplug:<x>``: a plug-in scheme from an entry point."""\n'
    )
    return site


def test_list_targets_comes_from_the_scheme_registry(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    """Every scheme (entry points included) is a row described by its factory's docstring."""
    from mmchaos.cli.list_cmd import summary_line
    from mmchaos.targets import SCHEMES

    env = dict(subprocess_env, COLUMNS="200")
    env["PYTHONPATH"] = os.pathsep.join([str(_fake_plugin(tmp_path)), env["PYTHONPATH"]])
    proc = subprocess.run(
        [sys.executable, "-m", "mmchaos", "list", "targets"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in proc.stdout.splitlines() if "│" in line}
    assert rows["fakeplug:..."] == "fakeplug:<x>: a plug-in scheme from an entry point."
    for scheme in SCHEMES.names():
        assert rows[f"{scheme}:..."] == summary_line(SCHEMES.get(scheme)), scheme
        assert rows[f"{scheme}:..."], f"the {scheme}: factory needs a docstring"
    assert "builtin:tiny-clip" in rows


def test_list_suites_comes_from_the_suites_package(run_cli) -> None:  # type: ignore[no-untyped-def]
    from importlib import resources

    shipped = sorted(f.name[:-5] for f in resources.files("mmchaos.suites").iterdir() if f.name.endswith(".yaml"))
    from mmchaos.suites import builtin_suites

    assert list(builtin_suites()) == shipped
    code, out, _ = run_cli("list", "suites")
    assert code == 0
    listed = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    assert [name for name in listed if name] == shipped


def _crafted_store(path: Path, outside: Path) -> None:
    """A store whose artifact names and check id try to escape the report folder."""
    suite = {"name": "crafted", "description": "", "seed": 0, "checks": []}
    with RunStore(path) as store:
        store.create_run(RunRecord("20260101-000000-evil00", 1.0, 2.0, "complete", "x", "crafted", {"suite": suite}),
                         ["../../evil"])  # fmt: skip
        arts = [
            Artifact("../../escape.txt", b"up"),
            Artifact(str(outside / "abs.txt"), b"abs"),
            Artifact(".hidden", b"h"),
        ]
        bad = Finding("../../evil", Step.ENGINE, Verdict.FAIL, "t", artifacts=arts)
        store.commit_check(
            "20260101-000000-evil00", "../../evil", [bad], wall_seconds=1, model_seconds=0, model_calls=0
        )


def test_report_keeps_crafted_artifact_names_inside_out(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    outside = tmp_path / "outside"
    outside.mkdir()
    _crafted_store(tmp_path / "crafted.db", outside)
    out = tmp_path / "a" / "b" / "out"
    code, _, err = run_cli("report", "latest", "--store", str(tmp_path / "crafted.db"), "--out", str(out))
    assert code == 1, err
    written = {p for p in tmp_path.rglob("*") if p.is_file()}
    assert all(p.is_relative_to(out) for p in written - {tmp_path / "crafted.db"}), written
    assert not list(outside.iterdir())
    evidence = {p.name: p.read_bytes() for p in (out / "evidence").iterdir()}
    assert evidence["escape.txt"] == b"up" and b"abs" in evidence.values() and evidence["hidden"] == b"h"
    assert any(name.endswith("evil.json") for name in evidence)


def test_read_only_commands_refuse_a_foreign_sqlite_file_and_leave_it_alone(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE users (name TEXT)")
        db.execute("INSERT INTO users VALUES ('ada')")
    db.close()
    before = _snapshot(foreign)
    for argv in (["runs"], ["report", "latest", "--out", str(tmp_path / "elsewhere" / "out")]):
        code, out, err = run_cli(*argv, "--store", str(foreign))
        assert code == 2, (argv, err)
        assert "not a mmchaos run store" in err and "users" in err and "Traceback" not in err + out
        assert _snapshot(foreign) == before, f"{argv[0]} changed the foreign file"
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)
    code, _, err = _validate(run_cli, tmp_path, suite, "py:tests.fakes.targets:hash_embed", "--store", str(foreign))
    assert code == 2 and "not a mmchaos run store" in err
    assert _snapshot(foreign) == before, "validate added tables to a foreign file"
    with sqlite3.connect(f"file:{foreign}?mode=ro", uri=True) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    db.close()


def test_corrupted_store_is_detected_and_never_written(run_cli, tmp_path: Path, suite_file: Path) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "runs.db"
    for _ in range(2):
        assert _validate(run_cli, tmp_path, suite_file, "py:tests.fakes.targets:padding_leak")[0] == 1
    data = bytearray(store.read_bytes())
    for offset in range(2 * 4096, len(data), 3 * 4096):
        data[offset : offset + 64] = b"\xff" * 64
    store.write_bytes(bytes(data))
    before = _snapshot(store)
    for argv in (["runs"], ["report", "latest", "--out", str(tmp_path / "again")]):
        code, _, err = run_cli(*argv, "--store", str(store))
        assert code == 2 and "corrupted" in err, (argv, err)
        assert len(err.strip().splitlines()) == 1
    code, _, err = _validate(run_cli, tmp_path, suite_file, "py:tests.fakes.targets:hash_embed")
    assert code == 2 and "corrupted" in err
    assert _snapshot(store) == before


@pytest.mark.parametrize(
    ("option", "make", "message"),
    [
        ("--out", lambda p: p.write_text("a file"), "is a file"),
        ("--store", lambda p: p.mkdir(), "is a folder"),
        ("--store", lambda p: p.write_text("a file") and None, "cannot create the folder"),
    ],
)
def test_unusable_out_or_store_path_exits_2_before_the_run(  # type: ignore[no-untyped-def]
    run_cli, tmp_path: Path, suite_file: Path, option: str, make, message: str
) -> None:
    path = tmp_path / "taken"
    make(path)
    value = path / "runs.db" if message == "cannot create the folder" else path
    code, out, err = _validate(run_cli, tmp_path, suite_file, "py:tests.fakes.targets:hash_embed", option, str(value))
    assert code == 2, err
    assert message in err and "Traceback" not in out + err
    assert "batch_invariance" not in err, "the suite must not have run"


def _terminal_results() -> dict[str, Any]:
    """A results document with long check ids, long titles and every verdict."""
    titles = {
        "pass": "every sample embeds the same alone and inside a padded batch of 12",
        "warn": "p99 latency 412 ms under 3 faults is above the 250 ms objective",
        "fail": "padding changes the output: max deviation 2.1e-02 at batch size 3",
        "error": "could not finish: TargetCallError: the server closed the connection",
        "skipped": "skipped: the target cannot embed texts (needs embed_texts)",
    }
    findings = []
    for n, (verdict, title) in enumerate(titles.items()):
        step, name = [(4, "engine"), (6, "serving"), (7, "observability")][n % 3]
        for _ in range(3 if verdict == "fail" else 1):
            findings.append(
                {"check": f"{name}-check-with-a-long-id-{n}", "step": step, "step_name": name, "verdict": verdict,
                 "title": title, "metrics": {}}
            )  # fmt: skip
    return {
        "run_id": "20260101-000000-abcdef",
        "suite": {"name": "prelaunch"},
        "target": {"uri": "openai:http://127.0.0.1:8000/v1"},
        "findings": findings,
        "steps": [{"step": 3, "name": "adversarial", "status": "not available in this version"}],
        "summary": {"verdicts": {"pass": 1, "fail": 3}, "exit_code": 1, "wall_seconds": 12.0, "model_seconds": 3.0},
    }


def test_summary_table_is_readable_at_80_columns() -> None:
    from rich.console import Console

    from mmchaos.cli.summary import print_summary

    console = Console(file=io.StringIO(), width=80, color_system=None, legacy_windows=False)
    print_summary(console, _terminal_results(), Path("mmchaos-report"))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    header = next(line for line in lines if "worst" in line)
    worst_width = len(header) - header.index("worst")
    assert worst_width >= 30, f"the worst column is {worst_width} columns wide:\n{text}"
    # every title is readable: its first three words stay on one line
    for title in {f["title"] for f in _terminal_results()["findings"]}:
        assert " ".join(title.split()[:3]) in text, title


def test_checks_show_a_progress_bar_on_a_terminal_and_done_lines_in_a_log() -> None:
    from rich.console import Console

    from mmchaos.cli.progress import CheckProgress
    from mmchaos.findings import Finding, Step, Verdict

    def run(terminal: bool) -> str:
        console = Console(file=io.StringIO(), width=80, force_terminal=terminal, color_system=None)
        with CheckProgress(console) as progress:
            progress.planned(["a", "b", "c"], {"a"})
            progress.started("b")
            progress.finished("b", [Finding("b", Step.ENGINE, Verdict.FAIL, "t")])
            progress.started("c")
        return str(console.file.getvalue())  # type: ignore[attr-defined]

    bar = run(terminal=True)
    assert "2/3" in bar and "━" in bar and " done" not in bar
    log = run(terminal=False)
    assert "b done: 1 fail" in log and "━" not in log


def test_the_progress_display_starts_no_refresh_thread_off_a_terminal_and_redraws_rarely_on_one() -> None:
    """Issue 23: Rich's refresh thread redrew the table 10 times a second even into a log (21 s of
    samples in a profiled validate run). Off a terminal no thread runs; on one it redraws <= 2/s."""
    import threading

    from rich.console import Console

    from mmchaos.cli.progress import CheckProgress

    for terminal in (False, True):
        console = Console(file=io.StringIO(), width=80, force_terminal=terminal, color_system=None)
        with CheckProgress(console) as progress:
            live = progress.progress.live
            progress.planned(["a"], set())
            task = progress.task("a: loop", total=3)
            task.advance()
            # this display's refresh threads (Rich does not join the ones of displays already stopped)
            threads = [t for t in threading.enumerate() if getattr(t, "live", None) is live]
            if terminal:
                assert threads and all(t.refresh_per_second <= 2 for t in threads)  # type: ignore[attr-defined]
            else:
                assert threads == []
            task.close()


def test_a_failed_resume_leaves_no_new_store_or_report_behind(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``--resume`` on a store that does not exist created an empty store file before it failed."""
    store, out = tmp_path / "new.db", tmp_path / "out"
    code, _, err = run_cli("validate", "--resume", "latest", "--store", str(store), "--out", str(out))
    assert code == 2 and "no run store at" in err and len(err.strip().splitlines()) == 1, err
    assert not store.exists() and not out.exists()


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["validate", "--suite", "{path}"], "name: x\nchecks: [a\n"),
        (["serve", "--target", "py:tests.fakes.targets:hash_embed", "--contract", "{path}"], "max_pixels: [1,\n"),
        (["proxy", "--upstream", "127.0.0.1:9", "--listen", "127.0.0.1:0", "--toxics-file", "{path}"], "toxics: [\n"),
    ],
)
def test_a_yaml_file_that_does_not_parse_is_one_line_with_its_place(  # type: ignore[no-untyped-def]
    run_cli, tmp_path: Path, argv: list[str], text: str
) -> None:
    """A bad ``--contract`` YAML printed PyYAML's four lines (context, snippet, caret)."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code, _, err = run_cli(*[a.replace("{path}", str(path)) for a in argv])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "line " in lines[0] and "column " in lines[0], err


@pytest.mark.parametrize("timeout", ["-1", "0", "nan"])
def test_fuzz_replay_refuses_a_timeout_that_is_not_positive(run_cli, tmp_path: Path, timeout: str) -> None:  # type: ignore[no-untyped-def]
    """``--timeout -1`` judged every input "hung ... reproduced" and exited 1: a false finding."""
    sample = tmp_path / "a.png"
    sample.write_bytes(b"\x89PNG\r\n\x1a\n")
    code, out, err = run_cli(
        "fuzz-replay", str(sample), "--target", "py:tests.fakes.targets:hash_embed", "--timeout", timeout
    )
    assert code == 2 and "positive number of seconds" in err and "reproduced" not in out, (out, err)
