"""``mmchaos report RUN``: re-render the reports of a stored run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mmchaos.cli._common import DEFAULT_OUT, DEFAULT_STORE, StoreOpt, out

__all__ = ["register", "report_command"]


def register(app: typer.Typer) -> None:
    """Add the ``report`` command to ``app``."""
    app.command("report")(report_command)


def report_command(
    run: Annotated[str, typer.Argument(help="run id, unique prefix, or 'latest'")],
    out_dir: Annotated[Path, typer.Option("--out", "-o")] = DEFAULT_OUT,
    store_path: StoreOpt = DEFAULT_STORE,
    strict: Annotated[bool, typer.Option("--strict", help="warnings fail the run too (exit 1)")] = False,
) -> None:
    """Re-render the reports of a stored run; the exit code is the run's gate result."""
    from mmchaos.cli.summary import print_summary
    from mmchaos.report import prepare_out_dir, write_reports
    from mmchaos.store import RunStore

    with RunStore(store_path, read_only=True) as store:
        prepare_out_dir(out_dir)
        results = write_reports(store, store.resolve(run), out_dir, strict=strict)
    print_summary(out, results, out_dir, store_path)
    raise typer.Exit(results["summary"]["exit_code"])
