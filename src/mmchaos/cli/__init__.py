"""The ``mmchaos`` command: builds the Typer app from one module per command and maps errors to exit codes.

Each ``*_cmd`` module is a few lines over the library (runner, store, reports, registries) and
imports its heavy parts lazily, so ``mmchaos --help`` stays fast.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
from typing import Annotated

import typer

from mmchaos.cli import (
    compare_cmd,
    export_cmd,
    fuzz_cmd,
    list_cmd,
    ops_cmd,
    perturb_cmd,
    proxy_cmd,
    report_cmd,
    runs_cmd,
    serve_cmd,
    validate_cmd,
)
from mmchaos.cli._common import err
from mmchaos.errors import MMChaosError

__all__ = ["app", "main", "validate"]

app = typer.Typer(
    name="mmchaos",
    help="Chaos validation for multimodal inference deployments.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks and debug logs")] = False,
) -> None:
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


# One module per command; each adds itself to the app (and imports its heavy parts lazily).
for _module in (
    validate_cmd,
    compare_cmd,
    runs_cmd,
    report_cmd,
    list_cmd,
    export_cmd,
    perturb_cmd,
    proxy_cmd,
    serve_cmd,
    fuzz_cmd,
):
    _module.register(app)

validate = validate_cmd.validate_command
"""The function behind ``mmchaos validate``, for introspection of its options."""

ops_cmd.register(app)  # alert-rules, chaos-mesh


def main(argv: list[str] | None = None) -> None:
    """Console entry point: mmchaos errors become one line on stderr and exit code 2.

    Called as the console script (``argv`` None), the process leaves through :func:`_exit_now`
    once the command is done; called from Python with ``argv``, it raises ``SystemExit`` as usual.
    """
    try:
        _main(argv)
    except SystemExit as exc:
        if argv is None:
            _exit_now(exc.code)
        raise


def _exit_now(code: object) -> None:
    """Leave without the interpreter's teardown: after a model was loaded (torch, transformers),
    freeing every module takes 1.5-2 s of a short command's wall time and saves nothing.

    The exit handlers still run (logging, temporary files, Ray's shutdown) and the output is
    flushed; a live non-daemon thread, or an exit status that is not a number, gets the normal exit.
    """
    if code is not None and not isinstance(code, int):
        return
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing more can be said
            stream.flush()
    os._exit(code or 0)


def _main(argv: list[str] | None) -> None:
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
