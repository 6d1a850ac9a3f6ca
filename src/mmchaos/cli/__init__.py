"""The ``mmchaos`` command: a thin layer over the library (runner, store, reports, registries)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from mmchaos.errors import MMChaosError, UsageError

__all__ = ["app", "main"]

app = typer.Typer(
    name="mmchaos",
    help="Chaos validation for multimodal inference deployments.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)
_state: dict[str, bool] = {"debug": False}

DEFAULT_STORE = Path(".mmchaos/runs.db")
DEFAULT_OUT = Path("mmchaos-report")
_VERDICT_STYLE = {
    "pass": "green",
    "warn": "bold yellow",
    "fail": "bold red",
    "error": "bold magenta",
    "skipped": "yellow",
}


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks and debug logs")] = False,
) -> None:
    _state["debug"] = debug
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


StoreOpt = Annotated[Path, typer.Option("--store", help="SQLite run store")]


@app.command()
def validate(
    target: Annotated[str, typer.Option("--target", "-t", help="target URI")] = "builtin:tiny-clip",
    suite: Annotated[str, typer.Option("--suite", "-s", help="built-in suite name or YAML file")] = "prelaunch",
    data: Annotated[
        str | None, typer.Option("--data", "-d", help="builtin:shapes, builtin:textlines, a folder, .csv or .jsonl")
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="report folder")] = DEFAULT_OUT,
    store_path: StoreOpt = DEFAULT_STORE,
    seed: Annotated[int | None, typer.Option("--seed", help="override the suite's seed")] = None,
    resume: Annotated[str | None, typer.Option("--resume", help="resume run RUN (id, prefix or 'latest')")] = None,
    trust_remote_code: Annotated[
        bool, typer.Option("--trust-remote-code", help="let hf: targets run code from the model repo")
    ] = False,
    allow_pickle: Annotated[
        bool, typer.Option("--allow-pickle-weights", help="let hf: targets load non-safetensors weights")
    ] = False,
    model: Annotated[str | None, typer.Option("--model", help="openai: targets: the served model name")] = None,
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="let openai: targets send requests to non-loopback hosts")
    ] = False,
    strict: Annotated[bool, typer.Option("--strict", help="warnings fail the run too (exit 1)")] = False,
) -> None:
    """Run a suite against a target; exit 0 when every gate passes, 1 when one fails, 2 on bad input."""
    from mmchaos.cli.progress import RichProgress
    from mmchaos.report import write_reports
    from mmchaos.runner import RunConfig, run_suite
    from mmchaos.store import RunStore
    from mmchaos.suites import load_suite
    from mmchaos.targets import TargetOptions

    config = None
    if resume is None:
        config = RunConfig(
            target=target,
            suite=load_suite(suite),
            data=data,
            seed=seed,
            options=TargetOptions(
                trust_remote_code=trust_remote_code,
                use_safetensors=not allow_pickle,
                model=model,
                allow_remote=allow_remote,
            ),
        )
    with RunStore(store_path) as store:
        with RichProgress(err) as progress:

            def on_check(check_id: str, findings: list[Any]) -> None:
                counts = _counts([f.verdict.value for f in findings])
                err.print(f"  [bold]{check_id}[/] done: {counts}")

            err.print(f"[bold]mmchaos validate[/] {'resuming ' + resume if resume else target} ...")
            result = run_suite(config, store, resume=resume, progress=progress, on_check=on_check)
        results = write_reports(store, result.run_id, out_dir, strict=strict)
    _print_summary(results, out_dir, store_path)
    raise typer.Exit(results["summary"]["exit_code"])


def _counts(verdicts: list[str]) -> str:
    parts = []
    for v in ("pass", "warn", "fail", "error", "skipped"):
        n = verdicts.count(v)
        if n:
            parts.append(f"[{_VERDICT_STYLE[v]}]{n} {v}[/]")
    return ", ".join(parts) or "no findings"


def _print_summary(results: dict[str, Any], out_dir: Path, store_path: Path) -> None:
    """One row per check (verdict counts), then every failure on its own line, then the banner."""
    table = Table(title=f"mmchaos {results['suite']['name']} on {results['target']['uri']}")
    table.add_column("step", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("findings", no_wrap=True)
    table.add_column("worst", overflow="fold")
    rank = {"error": 0, "fail": 1, "warn": 2, "pass": 3, "skipped": 4}
    by_check: dict[str, list[dict[str, Any]]] = {}
    for f in results["findings"]:
        by_check.setdefault(f["check"], []).append(f)
    for check, findings in by_check.items():
        worst = min(findings, key=lambda f: rank[f["verdict"]])
        style = _VERDICT_STYLE[worst["verdict"]]
        step = f"{findings[0]['step']} {findings[0]['step_name']}"
        table.add_row(step, check, _counts([f["verdict"] for f in findings]), f"[{style}]{worst['title']}[/]")
    for step in results["steps"]:
        if step["status"] == "not available in this version":
            table.add_row(f"{step['step']} {step['name']}", "-", "[dim]n/a[/]", "[dim]not available in this version[/]")
    out.print(table)
    failures = [f for f in results["findings"] if f["verdict"] in ("fail", "error", "warn")]
    for f in failures:
        style = _VERDICT_STYLE[f["verdict"]]
        out.print(f"[{style}]{f['verdict'].upper()}[/] {f['check']}: {f['title']}", highlight=False)
    s = results["summary"]
    verdicts = ", ".join(f"{n} {v}" for v, n in s["verdicts"].items() if n)
    banner = "[bold green]ALL GATES PASS[/]" if s["exit_code"] == 0 else "[bold red]GATES FAILED[/]"
    out.print(
        f"{banner}  {verdicts}  run {results['run_id']}  ({s['wall_seconds']:.1f}s, model {s['model_seconds']:.1f}s)",
        highlight=False,
    )
    out.print(f"report: {out_dir / 'report.html'}", highlight=False, soft_wrap=True)


@app.command()
def runs(store_path: StoreOpt = DEFAULT_STORE, limit: int = 20) -> None:
    """List stored runs, newest first."""
    import datetime as dt

    from mmchaos.store import RunStore

    if not store_path.exists():
        raise UsageError(f"no run store at {store_path} (run `mmchaos validate` first, or pass --store)")
    with RunStore(store_path) as store:
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


@app.command()
def report(
    run: Annotated[str, typer.Argument(help="run id, unique prefix, or 'latest'")],
    out_dir: Annotated[Path, typer.Option("--out", "-o")] = DEFAULT_OUT,
    store_path: StoreOpt = DEFAULT_STORE,
    strict: Annotated[bool, typer.Option("--strict", help="warnings fail the run too (exit 1)")] = False,
) -> None:
    """Re-render the reports of a stored run; the exit code is the run's gate result."""
    from mmchaos.report import write_reports
    from mmchaos.store import RunStore

    if not store_path.exists():
        raise UsageError(f"no run store at {store_path}")
    with RunStore(store_path) as store:
        results = write_reports(store, store.resolve(run), out_dir, strict=strict)
    _print_summary(results, out_dir, store_path)
    raise typer.Exit(results["summary"]["exit_code"])


@app.command("list")
def list_(
    kind: Annotated[str, typer.Argument(help="checks, perturbations, targets, suites or datasets")] = "checks",
) -> None:
    """List what is registered: checks, perturbations, targets, suites, datasets."""
    table = Table()
    if kind == "checks":
        from mmchaos.checks import REGISTRY

        table.add_column("check")
        table.add_column("step")
        table.add_column("description")
        for name in REGISTRY.names():
            cls = REGISTRY.get(name)
            table.add_row(name, f"{int(cls.step)} {cls.step.label}", (cls.__doc__ or "").strip().splitlines()[0])
    elif kind == "perturbations":
        from mmchaos import perturb

        for col in ("name", "modality", "group", "description", "source"):
            table.add_column(col)
        for name in perturb.names():
            pcls = perturb.REGISTRY.get(name)
            table.add_row(name, pcls.modality.value, pcls.group, pcls.summary(), pcls.source)
    elif kind == "targets":
        from mmchaos.targets import SCHEMES
        from mmchaos.targets.builtin import BUILTIN_TARGETS

        table.add_column("target")
        table.add_column("description")
        for name, desc in BUILTIN_TARGETS.items():
            table.add_row(f"builtin:{name}", desc)
        table.add_row("hf:<dir-or-hub-id>", "a transformers CLIP/SigLIP-style model from disk or the local hub cache")
        table.add_row("py:<module>:<factory>", "your own pipeline: a factory returning a mmchaos Target")
        table.add_row("onnx:<dir>", "a directory written by `mmchaos export`, run by ONNX Runtime")
        table.add_row(
            "openai:<base-url>",
            "a live OpenAI-compatible endpoint (vLLM, mmchaos serve); --model, loopback only unless --allow-remote",
        )
        for scheme in SCHEMES.names():
            if scheme not in ("builtin", "hf", "py", "openai", "onnx"):
                table.add_row(f"{scheme}:...", "plug-in target scheme (entry point)")
    elif kind == "suites":
        from mmchaos.suites import BUILTIN_SUITES, load_suite

        table.add_column("suite")
        table.add_column("description")
        for name in BUILTIN_SUITES:
            table.add_row(name, load_suite(name).description)
    elif kind == "datasets":
        from mmchaos.data import BUILTIN_DATASETS

        table.add_column("dataset")
        table.add_column("description")
        for name, desc in BUILTIN_DATASETS.items():
            table.add_row(f"builtin:{name}", desc)
    else:
        raise UsageError(f"unknown kind {kind!r}: use checks, perturbations, targets, suites or datasets")
    out.print(table)


def _register_subcommands() -> None:
    """Commands that live in their own modules (each imports its heavy parts lazily)."""
    from mmchaos.cli import export_cmd, perturb_cmd, proxy_cmd, serve_cmd

    export_cmd.register(app)
    perturb_cmd.register(app)
    proxy_cmd.register(app)
    serve_cmd.register(app)


_register_subcommands()


def main(argv: list[str] | None = None) -> None:
    """Console entry point: mmchaos errors become one line on stderr and exit code 2."""
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # torch's OpenMP workers spin while waiting; on a shared laptop/CI core that makes every
    # forward pass 10-20x slower. Passive waiting costs little when the cores are free.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        # Outside standalone mode click returns a command's exit code instead of exiting.
        code = app(args=argv, standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except MMChaosError as exc:
        if debug:
            raise
        # One plain line (no Rich wrapping or markup): scripts grep the stable code.
        sys.stderr.write(f"error [{exc.code}]: {exc.message}\n")
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted; resume with `mmchaos validate --resume latest`")
        sys.exit(130)
    except Exception as exc:
        # Usage errors of the CLI parser (typer vendors click; older typers use click itself).
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            exc.show()
            sys.exit(2)
        if type(exc).__name__ == "Abort":
            sys.exit(130)
        if debug:
            raise
        sys.stderr.write(f"internal error: {type(exc).__name__}: {exc} (run with --debug for the trace)\n")
        sys.exit(3)
