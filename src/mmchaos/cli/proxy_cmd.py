"""``mmchaos proxy``: run the fault proxy (and its control API) until Ctrl-C.

``--toxic TYPE[:key=value,...]`` is a command-line shorthand only: it is converted into the same
typed toxic a ``--toxics-file`` or the control API takes (``stream``, ``toxicity`` and ``name``
go to the toxic, every other key to its attributes; ``a|b`` is a list).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mmchaos.errors import ConfigError

if TYPE_CHECKING:
    from mmchaos.proxy.config import ProxyConfig, Toxic

__all__ = ["parse_toxic_spec", "register"]

_TOP_LEVEL = ("name", "stream", "toxicity")


def _scalar(text: str) -> Any:
    value = text.strip()
    if "|" in value:
        return [v.strip() for v in value.split("|") if v.strip()]
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    return value


def parse_toxic_spec(spec: str) -> Toxic:
    """``latency:latency=200,jitter=50,stream=upstream,toxicity=0.5`` to a validated toxic."""
    from mmchaos.proxy.config import parse_toxic

    kind, _, rest = spec.partition(":")
    data: dict[str, Any] = {"type": kind.strip()}
    attributes: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--toxic {spec!r}: expected key=value, got {part!r}", code="config_invalid_toxic")
        if key in _TOP_LEVEL:
            data[key] = value.strip() if key != "toxicity" else _scalar(value)
        else:
            attributes[key] = _scalar(value)
    if attributes:
        data["attributes"] = attributes
    return parse_toxic(data)


def _build(upstream: str, listen: str, specs: list[str], toxics_file: Path | None, name: str, seed: int) -> ProxyConfig:
    from mmchaos.proxy.config import ProxyConfig, load_toxics_file

    toxics = [parse_toxic_spec(s) for s in specs]
    if toxics_file is not None:
        toxics += load_toxics_file(toxics_file)
    names = [t.name for t in toxics]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(
            f"two toxics named {', '.join(dupes)}: give one a name= (e.g. --toxic latency:latency=100,name=slow)",
            code="config_invalid_toxic",
        )
    return ProxyConfig.parse({"name": name, "listen": listen, "upstream": upstream, "toxics": toxics, "seed": seed})


async def _serve(config: ProxyConfig, control: str | None, allow_remote: bool) -> None:
    from mmchaos.proxy.control import ControlServer
    from mmchaos.proxy.proxy import FaultProxy

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    async with FaultProxy.from_config(config, allow_remote=allow_remote) as proxy:
        server = ControlServer([proxy], listen=control, allow_remote=allow_remote) if control is not None else None
        if server is not None:
            await server.start()
        try:
            toxics = ", ".join(f"{t.name} ({t.type})" for t in proxy.toxics) or "none"
            typer.echo(
                f"mmchaos proxy {proxy.name}: listening {proxy.listen} -> {proxy.upstream}; toxics: {toxics}", err=True
            )
            if server is not None:
                typer.echo(f"control API: {server.url} (toxiproxy-compatible; /metrics)", err=True)
            typer.echo("Ctrl-C to stop", err=True)
            await stop.wait()
        finally:
            if server is not None:
                await server.stop()
    typer.echo("proxy stopped", err=True)


def _run(config: ProxyConfig, control: str | None, loop: str, allow_remote: bool) -> None:
    if loop not in ("auto", "asyncio", "uvloop"):
        raise ConfigError(f"--loop must be auto, asyncio or uvloop, not {loop!r}", code="config_invalid")
    if loop != "asyncio" and sys.platform != "win32":
        try:
            uvloop = importlib.import_module("uvloop")
        except ImportError:
            if loop == "uvloop":
                from mmchaos._lazy import require

                require("uvloop")
        else:
            uvloop.run(_serve(config, control, allow_remote))
            return
    asyncio.run(_serve(config, control, allow_remote))


def register(app: typer.Typer) -> None:
    """Add the ``proxy`` command to ``app``."""

    @app.command("proxy")
    def proxy(
        upstream: Annotated[str, typer.Option("--upstream", "-u", help="HOST:PORT to forward to")],
        listen: Annotated[str, typer.Option("--listen", "-l", help="HOST:PORT to listen on")] = "127.0.0.1:9000",
        toxic: Annotated[
            list[str] | None,
            typer.Option(
                "--toxic",
                "-t",
                help="TYPE[:key=value,...], e.g. latency:latency=200,jitter=50,stream=downstream,toxicity=0.5 "
                "(repeatable)",
            ),
        ] = None,
        toxics_file: Annotated[
            Path | None, typer.Option("--toxics-file", "-f", help="YAML/JSON list of toxics (toxiproxy JSON)")
        ] = None,
        control: Annotated[
            str | None, typer.Option("--control", "-c", help="serve the control API (toxiproxy's REST) on HOST:PORT")
        ] = None,
        name: Annotated[str, typer.Option("--name", help="proxy name in the control API and metrics")] = "mmchaos",
        seed: Annotated[int, typer.Option("--seed", help="seed of toxicity draws, jitter and slice sizes")] = 0,
        loop: Annotated[
            str, typer.Option("--loop", help="event loop: auto (uvloop if installed), asyncio, uvloop")
        ] = "auto",
        allow_remote: Annotated[
            bool,
            typer.Option("--allow-remote", help="allow listen, upstream and control addresses that are not loopback"),
        ] = False,
    ) -> None:
        """Run a fault-injecting TCP/HTTP proxy (toxiproxy-compatible toxics) until Ctrl-C."""
        from mmchaos.proxy.config import parse_hostport

        config = _build(upstream, listen, toxic or [], toxics_file, name, seed)
        addresses = [("--listen", config.listen), ("--upstream", config.upstream)]
        if control is not None:
            addresses.append(("--control", control))
        for what, address in addresses:
            host, _ = parse_hostport(address, what=what)
            if not allow_remote:
                from mmchaos.net import require_loopback

                require_loopback(host, what=what)
        _run(config, control, loop, allow_remote)
