"""``mmchaos compare RUN_A RUN_B``: did run B regress against run A? Exit 1 when it did."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from mmchaos.cli._common import DEFAULT_STORE, StoreOpt, out

__all__ = ["ToleranceOpt", "TolerancesOpt", "compare_command", "comparison", "register"]

TolerancesOpt = Annotated[
    Path | None,
    typer.Option(
        "--tolerances",
        help="YAML of allowed drops: default, metrics (per task metric), perturbations, verdicts (see docs/compare.md)",
        show_default=False,
    ),
]
ToleranceOpt = Annotated[
    float | None,
    typer.Option(
        "--tolerance",
        help="share of A's score B may lose at any point (default 0.05; a drop must also exceed 0.02 and one "
        "sample's worth); wins over the file's relative parts",
        show_default=False,
    ),
]


def register(app: typer.Typer) -> None:
    """Add the ``compare`` command to ``app``."""
    app.command("compare")(compare_command)


def comparison(
    run_a: str, run_b: str, store_path: Path, tolerances: Path | None, tolerance: float | None
) -> dict[str, Any]:
    """The comparison document of ``run_b`` against ``run_a`` with the tolerances the flags give."""
    from mmchaos.compare import compare_runs, load_run, load_tolerances

    tol = load_tolerances(tolerances)
    if tolerance is not None:
        tol = tol.with_relative(tolerance)
    return compare_runs(load_run(run_a, store_path), load_run(run_b, store_path), tol)


def compare_command(
    run_a: Annotated[
        str, typer.Argument(help="the baseline: run id, prefix, 'latest', a results.json or a report folder")
    ],
    run_b: Annotated[str, typer.Argument(help="the run judged against it (same forms)")],
    out_dir: Annotated[
        Path, typer.Option("--out", "-o", help="folder for compare.json, compare.html, compare-junit.xml")
    ] = Path("mmchaos-compare"),
    store_path: StoreOpt = DEFAULT_STORE,
    tolerances: TolerancesOpt = None,
    tolerance: ToleranceOpt = None,
) -> None:
    """Compare two runs per check, perturbation and severity; exit 1 when B regressed past the tolerances."""
    from mmchaos.cli.compare_summary import print_comparison
    from mmchaos.compare import write_compare_reports
    from mmchaos.report.files import writable_dir

    writable_dir(out_dir)  # a bad --out is a usage error before anything is read
    doc = comparison(run_a, run_b, store_path, tolerances, tolerance)
    write_compare_reports(doc, out_dir)
    print_comparison(out, doc, out_dir)
    raise typer.Exit(doc["summary"]["exit_code"])
