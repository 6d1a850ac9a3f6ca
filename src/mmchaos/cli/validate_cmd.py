"""``mmchaos validate``: run a suite against a target, write the reports, exit with the gate result."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mmchaos.cli._common import DEFAULT_OUT, DEFAULT_STORE, StoreOpt, err, out
from mmchaos.cli.target_flags import with_target_flags
from mmchaos.errors import ConfigError, StoreError
from mmchaos.targets.options import TargetOptions

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
    from mmchaos.runner import RunConfig, run_suite
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
    config = None
    if resume is None:
        config = RunConfig(
            target=target,
            suite=load_suite(suite),
            data=data,
            seed=seed,
            options=options or TargetOptions(),
            reference=reference,
        )
    with RunStore(store_path) as store:
        err.print(f"[bold]mmchaos validate[/] {'resuming ' + resume if resume else target} ...")
        with CheckProgress(err) as progress:
            result = run_suite(
                config, store, resume=resume, progress=progress, observer=progress,
                executor=where if where.kind != "local" else None,
            )  # fmt: skip
        results = write_reports(store, result.run_id, out_dir, strict=strict)
    print_summary(out, results, out_dir)
    raise typer.Exit(results["summary"]["exit_code"])


validate_command = with_target_flags(_validate)
"""``mmchaos validate`` with the shared target flags (:mod:`mmchaos.cli.target_flags`)."""
