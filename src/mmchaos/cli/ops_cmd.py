"""``mmchaos alert-rules`` and ``mmchaos chaos-mesh``: what a deployment's operators load elsewhere.

``alert-rules`` writes the Prometheus rules file for ``mmchaos serve`` (the guard alerts and the
server SLO's burn-rate alerts, :func:`mmchaos.guard.serving_rules_yaml`). ``chaos-mesh`` writes a
suite's ``serving_faults`` experiment as Chaos Mesh manifests (:mod:`mmchaos.chaos.manifests`) for a
deployment on Kubernetes, where the faults go into the pods instead of through mmchaos's proxy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from mmchaos.cli._common import err
from mmchaos.errors import ConfigError

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add ``alert-rules`` and ``chaos-mesh`` to ``app`` (once)."""
    names = {info.name for info in app.registered_commands}
    if "alert-rules" not in names:
        app.command("alert-rules")(alert_rules_command)
    if "chaos-mesh" not in names:
        app.command("chaos-mesh")(chaos_mesh_command)


def _write(text: str, output: Path | None) -> None:
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        output.write_text(text, "utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write {output}: {exc}") from exc
    err.print(f"wrote {output}")


def alert_rules_command(
    objective: Annotated[
        float, typer.Option("--slo-objective", help="the server SLO's availability objective", min=0.5, max=0.99999)
    ] = 0.999,
    breaker_for: Annotated[
        str, typer.Option("--breaker-for", help="how long a breaker stays out of closed before it pages")
    ] = "1m",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="file (default: stdout)")] = None,
) -> None:
    """Write the Prometheus rules for `mmchaos serve`: breaker, drift and model-load alerts, and the burn-rate SLO."""
    import re

    from prometheus_client import CollectorRegistry

    from mmchaos.guard import BurnRateSLO, serving_rules_yaml

    if not re.fullmatch(r"\d+(ms|s|m|h|d)", breaker_for):
        raise ConfigError(f"--breaker-for {breaker_for!r}: give a Prometheus duration such as 30s, 1m or 5m")
    slo = BurnRateSLO(name="server", objective=objective, registry=CollectorRegistry())
    _write(serving_rules_yaml([slo], breaker_for=breaker_for), output)


def chaos_mesh_command(
    suite: Annotated[str, typer.Option("--suite", "-s", help="built-in suite name or YAML file")] = "serving",
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="the deployment's namespace")] = "default",
    selector: Annotated[
        list[str] | None, typer.Option("--selector", "-l", help="pod label KEY=VALUE (repeat)", show_default=False)
    ] = None,
    port: Annotated[int, typer.Option("--port", help="the service's HTTP port (HTTPChaos)", min=1, max=65535)] = 8000,
    duration: Annotated[str, typer.Option("--duration", help="how long each fault is held")] = "60s",
    pause: Annotated[str, typer.Option("--pause", help="time between faults (workflow)")] = "60s",
    separate: Annotated[bool, typer.Option("--separate", help="one object per fault instead of one Workflow")] = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="file (default: stdout)")] = None,
) -> None:
    """Write a suite's serving_faults experiment as Chaos Mesh manifests (YAML) for a deployment on Kubernetes."""
    import re

    import yaml

    from mmchaos.chaos.manifests import ChaosMeshTarget, chaos_mesh_manifests, undocumented_fields
    from mmchaos.checks.serving.faults import ServingFaults, ServingFaultsParams
    from mmchaos.suites import load_suite

    labels: dict[str, str] = {}
    for item in selector or ["app=mmchaos"]:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--selector {item!r}: give KEY=VALUE, e.g. app=embeddings")
        labels[key] = value
    for flag, value in (("--duration", duration), ("--pause", pause)):
        if not re.fullmatch(r"\d+(ms|s|m|h)", value):
            raise ConfigError(f"{flag} {value!r}: give a duration such as 30s, 2m or 1h")
    spec = load_suite(suite)
    entries = [c for c in spec.checks if c.check == "serving_faults"]
    if not entries:
        raise ConfigError(f"suite {suite!r} has no serving_faults check to export")
    faults: list[tuple[str, dict[str, Any]]] = []
    for entry in entries:
        check = ServingFaults(ServingFaultsParams.model_validate(entry.params))
        faults += [(f"{name}-{level}", dict(fl.toxic)) for name, level, fl in check.plan()]
    target = ChaosMeshTarget(namespace=namespace, labels=labels, port=port, duration=duration, pause=pause)
    manifests, skipped = chaos_mesh_manifests(faults, target, workflow=not separate)
    for m in manifests:
        problems = undocumented_fields(m)
        assert not problems, problems  # the exporter writes documented fields only
    head = "".join(f"# skipped {s.name}: {s.skipped}\n" for s in skipped)
    _write(head + yaml.safe_dump_all(manifests, sort_keys=False, width=1000), output)
