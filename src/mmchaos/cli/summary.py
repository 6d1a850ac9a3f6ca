"""The terminal summary of a run: a table of checks, the failures one a line, then the banner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from mmchaos.cli._common import DEFAULT_STORE, VERDICT_STYLE, resume_command, verdict_counts

__all__ = ["print_summary"]

_RANK = {"error": 0, "fail": 1, "warn": 2, "pass": 3, "skipped": 4}


def print_summary(console: Console, results: dict[str, Any], out_dir: Path, store: Path = DEFAULT_STORE) -> None:
    """One row per check (verdict counts), then every failure on its own line, then the banner
    (``store``: where the run is, for the command that resumes an unfinished one)."""
    # Below ~110 columns the step is its number, the check id is cut with an ellipsis and the
    # table drops its vertical rules, so the "worst" column keeps room for a readable title.
    narrow = console.width < 110
    table = Table(
        title=f"mmchaos {results['suite']['name']} on {results['target']['uri']}",
        box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD,
        title_justify="left" if narrow else "center",
    )
    table.add_column("#" if narrow else "step", no_wrap=True)
    table.add_column("check", no_wrap=True, overflow="ellipsis", max_width=22 if narrow else None)
    table.add_column("findings", max_width=12 if narrow else None)
    table.add_column("worst", overflow="fold", min_width=30, ratio=1)
    by_check: dict[str, list[dict[str, Any]]] = {}
    for f in results["findings"]:
        by_check.setdefault(f["check"], []).append(f)
    for check, findings in by_check.items():
        worst = min(findings, key=lambda f: _RANK[f["verdict"]])
        style = VERDICT_STYLE[worst["verdict"]]
        step = str(findings[0]["step"]) if narrow else f"{findings[0]['step']} {findings[0]['step_name']}"
        counts = verdict_counts([f["verdict"] for f in findings], "\n" if narrow else ", ")
        table.add_row(step, check, counts, f"[{style}]{worst['title']}[/]")
    for step in results["steps"]:
        if step["status"] == "not available in this version":
            label = str(step["step"]) if narrow else f"{step['step']} {step['name']}"
            table.add_row(label, f"[dim]{step['name']}[/]", "[dim]n/a[/]", "[dim]not available in this version[/]")
    console.print(table)
    for f in results["findings"]:
        if f["verdict"] in ("fail", "error", "warn"):
            style = VERDICT_STYLE[f["verdict"]]
            console.print(f"[{style}]{f['verdict'].upper()}[/] {f['check']}: {f['title']}", highlight=False)
    s = results["summary"]
    verdicts = ", ".join(f"{n} {v}" for v, n in s["verdicts"].items() if n)
    untested = ", ".join(f"{u['step']} {u['name']}" for u in s.get("untested_steps") or [])
    incomplete = ", ".join(s.get("incomplete_checks") or [])
    if incomplete:  # never a verdict over checks that did not finish
        banner = (
            f"[bold red]RUN INCOMPLETE[/] [yellow](not finished: {incomplete}; "
            f"go on with `{resume_command(results['run_id'], store)}`)[/]"
        )
    elif s["exit_code"] != 0:
        banner = "[bold red]GATES FAILED[/]" + (f" [yellow](untested steps: {untested})[/]" if untested else "")
    elif untested:  # never "all gates pass" over steps no check ran on
        banner = f"[bold yellow]GATES PASS, BUT UNTESTED STEPS: {untested}[/]"
    else:
        banner = "[bold green]ALL GATES PASS[/]"
    console.print(
        f"{banner}  {verdicts}  run {results['run_id']}  ({s['wall_seconds']:.1f}s, model {s['model_seconds']:.1f}s)",
        highlight=False,
    )
    console.print(f"report: {out_dir / 'report.html'}", highlight=False, soft_wrap=True)
