"""``mmchaos validate``: run a suite against a target, write the reports, exit with the gate result."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mmchaos.cli._common import DEFAULT_OUT, DEFAULT_STORE, StoreOpt, err, out, resume_command
from mmchaos.cli.compare_cmd import ToleranceOpt, TolerancesOpt
from mmchaos.cli.target_flags import with_target_flags
from mmchaos.errors import ConfigError, StoreError, UsageError
from mmchaos.targets.options import TargetOptions

if TYPE_CHECKING:
    from mmchaos.suites import SuiteSpec

__all__ = ["register", "validate_command"]


def register(app: typer.Typer) -> None:
    """Add the ``validate`` command to ``app``."""
    app.command("validate")(validate_command)


def _validate(
    target: Annotated[str, typer.Option("--target", "-t", help="target URI")] = "builtin:tiny-clip",
    suite: Annotated[str, typer.Option("--suite", "-s", help="built-in suite name or YAML file")] = "prelaunch",
    data: Annotated[
        str | None, typer.Option("--data", "-d", help="builtin:NAME (see list datasets), a folder, .csv, .jsonl, .pdf")
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="report folder")] = DEFAULT_OUT,
    store_path: StoreOpt = DEFAULT_STORE,
    seed: Annotated[int | None, typer.Option("--seed", help="override the suite's seed")] = None,
    resume: Annotated[str | None, typer.Option("--resume", help="resume run RUN (id, prefix or 'latest')")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="warnings fail the run too (exit 1)")] = False,
    executor: Annotated[
        str, typer.Option("--executor", help="where work units run: local, or ray (needs mmchaos\\[ray])")
    ] = "local",
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="--executor ray: the cluster to join (default: a local Ray)")
    ] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", help="--executor ray: target actors (default: the cluster's CPUs)")
    ] = None,
    reference: Annotated[
        str | None,
        typer.Option(
            "--reference",
            help="judge the target against this one (the checkpoint it serves, e.g. hf:/models/clip): "
            "reference_parity sends both the same inputs; loaded with its scheme's default options",
            show_default=False,
        ),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            help="also gate the run against this earlier one (run id, prefix, 'latest', a results.json or report "
            "folder): a regression past the tolerances exits 1, as in `mmchaos compare`",
            show_default=False,
        ),
    ] = None,
    tolerances: TolerancesOpt = None,
    tolerance: ToleranceOpt = None,
    options: TargetOptions | None = None,
) -> None:
    """Run a suite against a target; exit 0 when every gate passes, 1 when one fails, 2 on bad input."""
    from mmchaos.targets import resolve_target_options

    if resume is not None and options:
        raise ConfigError(
            f"--resume {resume} runs with the target options the run was stored with; drop the target options "
            f"({', '.join(sorted(options))})",
            code="config_invalid",
        )
    if resume is not None and reference is not None:
        raise ConfigError(f"--resume {resume} runs with the reference it was stored with; drop --reference")
    if resume is None:
        resolve_target_options(target, options)  # an option the scheme does not take: exit 2 before anything runs
        if reference is not None:
            resolve_target_options(reference, None)  # an unknown scheme: exit 2 now, not after the target loads
    from mmchaos.cli.progress import CheckProgress
    from mmchaos.cli.summary import print_summary
    from mmchaos.executors import ExecutorSpec
    from mmchaos.report import prepare_out_dir, write_reports
    from mmchaos.runner import RunConfig, RunInterrupted, run_suite
    from mmchaos.store import RunStore
    from mmchaos.suites import load_suite
    from mmchaos.targets.threads import limit_blas_threads

    limit_blas_threads(1)  # the harness's own small matrix products: one BLAS thread (see the function)
    where = ExecutorSpec(executor, address=ray_address, workers=workers)  # bad options: exit 2 now
    if where.kind == "ray":
        from mmchaos.executors.ray import require_ray

        require_ray()  # not installed: a one-line error before any model loads
    if resume is not None and not Path(store_path).exists():  # RunStore would create an empty one
        raise StoreError(f"no run store at {store_path} to resume {resume!r} from (see --store)")
    prepare_out_dir(out_dir)  # a bad --out is a usage error now, not after the whole suite ran
    spec = load_suite(suite) if resume is None else None
    gate = _baseline_gate(baseline, store_path, tolerances, tolerance, spec)
    config = None
    if spec is not None:
        config = RunConfig(
            target=target,
            suite=spec,
            data=data,
            seed=seed,
            options=options or TargetOptions(),
            reference=reference,
        )
    with RunStore(store_path) as store:
        err.print(f"[bold]mmchaos validate[/] {'resuming ' + resume if resume else target} ...")
        try:
            with CheckProgress(err) as progress:
                result = run_suite(
                    config, store, resume=resume, progress=progress, observer=progress,
                    executor=where if where.kind != "local" else None,
                )  # fmt: skip
        except RunInterrupted as exc:
            # One plain line, unwrapped (scripts and users copy the command from it).
            sys.stderr.write(
                f"interrupted: run {exc.run_id} keeps its finished checks in {store_path}; "
                f"go on with `{resume_command(exc.run_id, store_path)}`\n"
            )
            raise typer.Exit(130) from None
        results = write_reports(store, result.run_id, out_dir, strict=strict)
    print_summary(out, results, out_dir, store_path)
    code = int(results["summary"]["exit_code"])
    if gate is not None:
        code = max(code, gate(results, f"{store_path} run {result.run_id}", out_dir))
    raise typer.Exit(code)


def _baseline_gate(
    baseline: str | None, store_path: Path, tolerances: Path | None, tolerance: float | None, suite: SuiteSpec | None
) -> Callable[[dict[str, Any], str, Path], int] | None:
    """For ``--baseline``: the baseline and tolerances loaded now (bad ones exit 2 before the run), and
    the step that compares the finished run with it, writes compare.* and returns its exit code."""
    if baseline is None:
        if tolerances is not None or tolerance is not None:
            raise ConfigError("--tolerances and --tolerance apply to --baseline; give the run to compare with")
        return None
    from mmchaos.compare import LoadedRun, compare_runs, load_run, load_tolerances, write_compare_reports

    tol = load_tolerances(tolerances)
    if tolerance is not None:
        tol = tol.with_relative(tolerance)
    base = load_run(baseline, store_path)
    ran = {f["check"] for f in base.doc["findings"]}
    if suite is not None and ran and not ran & {c.key for c in suite.checks}:
        raise UsageError(
            f"--baseline {baseline} ran {', '.join(sorted(ran))}, none of which suite {suite.name} runs: "
            "nothing to compare",
            code="runs_disjoint",
        )

    def gate(results: dict[str, Any], source: str, out_dir: Path) -> int:
        from mmchaos.cli.compare_summary import print_comparison

        doc = compare_runs(base, LoadedRun(results, source), tol)
        write_compare_reports(doc, out_dir)
        print_comparison(out, doc, out_dir)
        return int(doc["summary"]["exit_code"])

    return gate


validate_command = with_target_flags(_validate)
"""``mmchaos validate`` with the shared target flags (:mod:`mmchaos.cli.target_flags`)."""
