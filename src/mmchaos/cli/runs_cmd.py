"""``mmchaos runs``: list the runs of a store, newest first."""

from __future__ import annotations

import datetime as dt

import typer
from rich.table import Table

from mmchaos.cli._common import DEFAULT_STORE, StoreOpt, out

__all__ = ["register", "runs_command"]


def register(app: typer.Typer) -> None:
    """Add the ``runs`` command to ``app``."""
    app.command("runs")(runs_command)


def runs_command(store_path: StoreOpt = DEFAULT_STORE, limit: int = 20) -> None:
    """List stored runs, newest first."""
    from mmchaos.store import RunStore

    with RunStore(store_path, read_only=True) as store:
        rows = store.list_runs(limit)
    table = Table(title=f"runs in {store_path}")
    table.add_column("run", no_wrap=True)
    for col in ("created", "status", "target", "suite", "verdicts"):
        table.add_column(col)
    for run, counts in rows:
        created = dt.datetime.fromtimestamp(run.created).strftime("%Y-%m-%d %H:%M:%S")
        verdicts = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
        table.add_row(run.run_id, created, run.status, run.target_uri, run.suite_name, verdicts)
    out.print(table)
