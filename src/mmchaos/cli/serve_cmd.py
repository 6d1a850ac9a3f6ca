"""``mmchaos serve``: the reference server over a target, guards on; a thin layer over
:mod:`mmchaos.server`. Registered on the main app by :func:`register`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from mmchaos.cli.target_flags import with_target_flags
from mmchaos.errors import ConfigError
from mmchaos.targets.options import TargetOptions

__all__ = ["API_KEY_ENV", "register"]

API_KEY_ENV = "MMCHAOS_API_KEY"
"""The environment variable ``--api-key`` reads when not given (vLLM's is ``VLLM_API_KEY``)."""


def register(app: typer.Typer) -> None:
    """Add the ``serve`` command to ``app`` (once, however often it is called)."""
    if any(info.name == "serve" for info in app.registered_commands):
        return
    app.command("serve")(serve_command)


def _serve(
    target: Annotated[str, typer.Option("--target", "-t", help="target URI")] = "builtin:tiny-clip",
    host: Annotated[str, typer.Option("--host", help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="port (0: a free one)", min=0, max=65535)] = 8000,
    contract: Annotated[
        Path | None, typer.Option("--contract", help="Preflight input contract (YAML)", show_default=False)
    ] = None,
    max_concurrency: Annotated[
        int | None,
        typer.Option(
            "--max-concurrency",
            help="requests admitted at once: decoded in parallel and, batching on, run as model batches "
            "(default 16; 4 with --no-batching)",
            min=1,
            show_default=False,
        ),
    ] = None,
    no_batching: Annotated[
        bool,
        typer.Option("--no-batching", help="run every request as its own model call (never batch across clients)"),
    ] = False,
    no_continuous_batching: Annotated[
        bool,
        typer.Option(
            "--no-continuous-batching",
            help="batch chat generations as whole generate calls, not step by step with requests joining and leaving",
        ),
    ] = False,
    max_batch_size: Annotated[
        int, typer.Option("--max-batch-size", help="most requests in one model batch", min=1)
    ] = 16,
    batch_window: Annotated[
        float,
        typer.Option(
            "--batch-window",
            help="seconds a batch waits for more requests once the model is free (at most a tenth of a "
            "batch's time when none is on its way)",
            min=0.0,
            max=1.0,
        ),
    ] = 0.005,
    max_queue: Annotated[int, typer.Option("--max-queue", help="requests allowed to wait (429 beyond)", min=0)] = 64,
    max_queue_wait: Annotated[
        float,
        typer.Option(
            "--max-queue-wait",
            help="shed load: refuse (429 overloaded, Retry-After) a request expected to wait longer than "
            "this many seconds for a slot; 0 turns shedding off",
            min=0.0,
        ),
    ] = 0.5,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per request (504 past it)", min=0.001)] = 30.0,
    model_names: Annotated[
        list[str] | None,
        typer.Option(
            "--served-model-name",
            help="model id clients send (default: from the URI); repeat for aliases, as vLLM takes several. "
            "The target URI is always accepted too",
            show_default=False,
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar=API_KEY_ENV,
            help=f"require Authorization: Bearer KEY on /v1 requests (vLLM's --api-key; or ${API_KEY_ENV}, "
            "which keeps the key off the command line); /healthz, /readyz, /health, /version and /metrics stay open",
            show_default=False,
            show_envvar=False,
        ),
    ] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option("--api-key-env", help="require Authorization: Bearer $NAME on /v1 requests", show_default=False),
    ] = None,
    no_guards: Annotated[
        bool, typer.Option("--no-guards", help="serve the bare target (benchmark baseline only)")
    ] = False,
    options: TargetOptions | None = None,
) -> None:
    """Serve a target over an OpenAI-compatible HTTP API with the guards on the request path."""
    from mmchaos.net import is_loopback_host
    from mmchaos.targets import load_target, resolve_target_options

    allow_remote = bool(options is not None and options.get("allow_remote"))
    if not allow_remote:
        from mmchaos.net import require_loopback

        require_loopback(host, what="--host")  # before the target loads: nothing to wait for
    options = _target_options(target, options)
    resolve_target_options(target, options)  # an option the scheme does not take: exit 2 before anything starts
    from mmchaos.server import ServerConfig, contract_from_yaml, serve
    from mmchaos.targets.threads import limit_blas_threads

    limit_blas_threads(1)  # the server's own numpy math (scores, drift): one BLAS thread (see the function)
    settings: dict[str, Any] = {
        "max_concurrency": max_concurrency or (4 if no_batching else 16),
        "batching": not no_batching,
        "continuous_batching": not no_continuous_batching,
        "max_batch_size": max_batch_size,
        "batch_window": batch_window,
        "max_queue": max_queue,
        "max_queue_wait": max_queue_wait or None,
        "request_timeout": timeout,
        "guards": not no_guards,
        "model_name": model_names[0] if model_names else None,
        "model_aliases": tuple(model_names[1:]) if model_names else (),
    }
    if contract is not None:
        settings["contract"] = contract_from_yaml(contract)
    keys = [api_key] if api_key else []
    if api_key_env is not None:
        key = os.environ.get(api_key_env)
        if not key:
            raise ConfigError(f"--api-key-env {api_key_env}: the environment variable is not set")
        keys.append(key)
    if keys:
        settings["api_keys"] = tuple(keys)
    elif allow_remote and not is_loopback_host(host):
        sys.stderr.write(
            f"mmchaos serve: warning: --allow-remote with no API key: anyone who can reach {host} may use the "
            f"model (set --api-key or ${API_KEY_ENV})\n"
        )
    config = ServerConfig.build(**settings)
    loaded = load_target(target, options)
    try:
        guards = "guards off" if no_guards else "guards on"

        def ready(url: str) -> None:
            # One plain line on stderr that scripts (and the tests) wait for.
            sys.stderr.write(f"mmchaos serve: {target} on {url}/v1 ({guards}); Ctrl-C or SIGTERM stops\n")
            sys.stderr.flush()

        serve(
            loaded, config, host=host, port=port, graceful_timeout=timeout + 5.0, on_ready=ready,
            allow_remote=allow_remote,
        )  # fmt: skip
    finally:
        loaded.close()


def _target_options(target: str, options: TargetOptions | None) -> TargetOptions | None:
    """``options`` for the target: ``--allow-remote`` is serve's opt-in to a remote ``--host`` and,
    for a target that takes it (``openai:``), to a remote endpoint; a target that does not keeps it out."""
    from mmchaos.targets import resolve_target_options

    if options is None or "allow_remote" not in options:
        return options
    try:
        resolve_target_options(target, options)
    except ConfigError as exc:
        if exc.code != "target_option_unknown":
            raise
        without = TargetOptions({k: v for k, v in options.items() if k != "allow_remote"})
        resolve_target_options(target, without)  # another unknown option is still refused, and named
        return without
    return options


serve_command = with_target_flags(_serve)
"""``mmchaos serve`` with the shared target flags (:mod:`mmchaos.cli.target_flags`), as ``validate`` takes them."""
