"""The console script leaves without the interpreter's teardown (1.5-2 s after a model loaded), but
with everything a normal exit gives: the exit status, the flushed output, the exit handlers."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import atexit, sys
from mmchaos.cli import main
atexit.register(lambda: sys.stderr.write("handler ran\\n"))
sys.argv = ["mmchaos", *sys.argv[1:]]
print("buffered output", end="")  # no newline: only a flush gets it out
main()
"""


@pytest.mark.parametrize(("argv", "code"), [(["list", "checks"], 0), (["validate", "--suite", "nope.yaml"], 2)])
def test_console_exit_keeps_status_output_and_handlers(
    argv: list[str], code: int, subprocess_env: dict[str, str]
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, *argv], env=subprocess_env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == code, proc.stderr
    assert proc.stdout.startswith("buffered output")
    assert "handler ran" in proc.stderr


def test_console_exit_waits_for_a_live_non_daemon_thread(subprocess_env: dict[str, str]) -> None:
    """A command that left a non-daemon thread running gets the normal exit, which joins it."""
    script = SCRIPT.replace(
        "main()",
        "import threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.5), print('thread done', flush=True))).start()\n"
        "main()",
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, "list", "checks"], env=subprocess_env, capture_output=True, text=True, timeout=99
    )
    assert proc.returncode == 0, proc.stderr
    assert "thread done" in proc.stdout
