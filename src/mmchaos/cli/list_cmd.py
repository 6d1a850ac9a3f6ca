"""``mmchaos list KIND``: what the registries hold (built-ins and entry-point plug-ins alike)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated

import typer
from rich.table import Table

from mmchaos.cli._common import out
from mmchaos.errors import UsageError

__all__ = ["KINDS", "list_command", "register", "summary_line"]


def register(app: typer.Typer) -> None:
    """Add the ``list`` command to ``app``."""
    app.command("list")(list_command)


def summary_line(obj: object) -> str:
    """The first paragraph of ``obj``'s docstring on one line, without reST literal markup."""
    doc = inspect.getdoc(obj) or ""
    first = doc.split("\n\n", 1)[0]
    return " ".join(first.split()).replace("``", "")


def _checks(table: Table) -> None:
    from mmchaos.checks import REGISTRY

    for col in ("check", "step", "description"):
        table.add_column(col)
    for name in REGISTRY.names():
        cls = REGISTRY.get(name)
        table.add_row(name, f"{int(cls.step)} {cls.step.label}", summary_line(cls))


def _perturbations(table: Table) -> None:
    from mmchaos import perturb

    for col in ("name", "modality", "group", "description", "source"):
        table.add_column(col)
    for name in perturb.names():
        pcls = perturb.REGISTRY.get(name)
        table.add_row(name, pcls.modality.value, pcls.group, pcls.summary(), pcls.source)


def _targets(table: Table) -> None:
    """One row per built-in target, then one per URI scheme (entry points included)."""
    from mmchaos.targets import SCHEMES
    from mmchaos.targets.builtin import BUILTIN_TARGETS

    table.add_column("target")
    table.add_column("description")
    for name, desc in BUILTIN_TARGETS.items():
        table.add_row(f"builtin:{name}", desc)
    for scheme in SCHEMES.names():
        try:
            desc = summary_line(SCHEMES.get(scheme)) or "(the factory has no docstring)"
        except Exception as exc:  # a broken plug-in still gets its row
            desc = f"[red]cannot load: {type(exc).__name__}: {exc}[/]"
        table.add_row(f"{scheme}:...", desc)


def _suites(table: Table) -> None:
    from mmchaos.suites import builtin_suites, load_suite

    table.add_column("suite")
    table.add_column("description")
    for name in builtin_suites():
        table.add_row(name, load_suite(name).description)


def _datasets(table: Table) -> None:
    from mmchaos.data import BUILTIN_DATASETS

    table.add_column("dataset")
    table.add_column("description")
    for name, desc in BUILTIN_DATASETS.items():
        table.add_row(f"builtin:{name}", desc)


KINDS: dict[str, Callable[[Table], None]] = {
    "checks": _checks,
    "perturbations": _perturbations,
    "targets": _targets,
    "suites": _suites,
    "datasets": _datasets,
}


def list_command(
    kind: Annotated[str, typer.Argument(help="checks, perturbations, targets, suites or datasets")] = "checks",
) -> None:
    """List what is registered: checks, perturbations, targets, suites, datasets."""
    fill = KINDS.get(kind)
    if fill is None:
        raise UsageError(f"unknown kind {kind!r}: use {', '.join(KINDS)}")
    table = Table()
    fill(table)
    out.print(table)
