"""What every command shares: the two consoles, default paths and option types, verdict styles."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

__all__ = [
    "DEFAULT_OUT",
    "DEFAULT_STORE",
    "VERDICT_STYLE",
    "StoreOpt",
    "err",
    "out",
    "resume_command",
    "verdict_counts",
]

out = Console()
err = Console(stderr=True)

DEFAULT_STORE = Path(".mmchaos/runs.db")
DEFAULT_OUT = Path("mmchaos-report")
VERDICT_STYLE = {
    "pass": "green",
    "warn": "bold yellow",
    "fail": "bold red",
    "error": "bold magenta",
    "skipped": "yellow",
}

StoreOpt = Annotated[Path, typer.Option("--store", help="SQLite run store")]


def verdict_counts(verdicts: list[str], sep: str = ", ") -> str:
    """``"3 pass, 1 fail"`` with Rich colours, in the fixed verdict order."""
    parts = []
    for v in ("pass", "warn", "fail", "error", "skipped"):
        n = verdicts.count(v)
        if n:
            parts.append(f"[{VERDICT_STYLE[v]}]{n} {v}[/]")
    return sep.join(parts) or "no findings"


def resume_command(run_id: str, store: Path) -> str:
    """The command that goes on with stored run ``run_id`` (``--store`` only where it is not the default)."""
    where = "" if Path(store) == DEFAULT_STORE else f" --store {store}"
    return f"mmchaos validate --resume {run_id}{where}"
