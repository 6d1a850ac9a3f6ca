"""Shared fixtures. Tests that need the repository root importable (py: targets) get it here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Before anything imports torch: spinning OpenMP workers make forward passes 10-20x slower when
# a test runs a server thread and a client in one process on 2 cores (as the CLI does too).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture()
def subprocess_env() -> dict[str, str]:
    """Environment for a child mmchaos process that can import ``tests.fakes``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


@pytest.fixture()
def run_cli(capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    from mmchaos.cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            main(list(argv))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run
