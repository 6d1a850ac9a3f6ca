"""The terminal summary of a comparison: a table of curves A -> B, the regressions one a line, then the banner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

__all__ = ["print_comparison"]

_SHOWN = 12
"""At most this many not-compared items are listed one a line; the rest are counted."""


def _cell(point: dict[str, Any]) -> str:
    text = f"{point['a']:.2f}→{point['b']:.2f}"
    return f"[bold red]{text}[/]" if point["regressed"] else f"[green]{text}[/]" if point["improved"] else text


def print_comparison(console: Console, doc: dict[str, Any], out_dir: Path | None) -> None:
    """The curves (A -> B per severity, regressions in red), every regression on its own line, then the banner."""
    a, b = doc["a"], doc["b"]
    curves = doc["curves"]
    if curves:
        sevs = sorted({p["severity"] for c in curves for p in c["points"]})
        several = len({c["check"] for c in curves}) > 1  # one check (the usual robustness): no column for it
        table = Table(
            title=f"mmchaos compare: B {b['target']} against A {a['target']}",
            box=box.SIMPLE_HEAD,
            collapse_padding=True,
            pad_edge=False,
        )
        if several:
            table.add_column("check", overflow="fold")
        table.add_column("perturbation", no_wrap=True)
        table.add_column("metric", overflow="fold")
        for s in sevs:
            table.add_column("clean" if s == 0 else f"s{s}", no_wrap=True, min_width=9)
        for c in curves:
            by_sev = {p["severity"]: p for p in c["points"]}
            cells = [_cell(by_sev[s]) if s in by_sev else "" for s in sevs]
            # the clean score is one per task: name the task (two retrieval directions share recall@1)
            name = f"clean {c['task']}" if c["perturbation"] == "clean" else c["perturbation"]
            table.add_row(*([c["check"]] if several else []), name, c["metric"], *cells)
        console.print(table)
    changed = [p for p in doc["findings"] if p["verdict"]["a"] != p["verdict"]["b"] and not p["regressed"]]
    for p in changed:  # the regressed ones have their REGRESSED line below
        style = "green" if p["improved"] else "yellow"
        console.print(
            f"[{style}]{p['verdict']['a']} -> {p['verdict']['b']}[/] {p['check']}: {p['title']['b']}", highlight=False
        )
    for r in doc["regressions"]:
        console.print(f"[bold red]REGRESSED[/] {r['line']}", highlight=False)
    for c in doc["caveats"]:
        console.print(f"[yellow]note[/] {c}", highlight=False)
    missing = doc["not_compared"]
    for n in missing[:_SHOWN]:
        console.print(
            f"[dim]only in {'A' if n['only_in'] == 'a' else 'B'}[/] {n['check']}: {n['what']}", highlight=False
        )
    if len(missing) > _SHOWN:
        console.print(
            f"[dim]... and {len(missing) - _SHOWN} more only in one run (see compare.json)[/]", highlight=False
        )
    s = doc["summary"]
    counts = f"{s['compared_points']} points, {s['compared_findings']} findings compared"
    banner = f"[bold red]REGRESSED[/] {', '.join(s['regressed'])}" if s["exit_code"] else "[bold green]NO REGRESSION[/]"
    console.print(f"{banner}  ({counts}; B {b['run_id']} against A {a['run_id']})", highlight=False, soft_wrap=True)
    if out_dir is not None:
        console.print(f"comparison: {out_dir / 'compare.html'}", highlight=False, soft_wrap=True)
