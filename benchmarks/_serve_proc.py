"""The serve benchmarks' one way to run ``mmchaos serve`` in a child process and read its memory.

The server runs in its own process so its RSS is its own, not the load driver's; it prints its URL
on its first stderr line, and stops on SIGINT (killed if it has not within a minute).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["mmchaos_serve", "rss_mib"]


def rss_mib(pid: int) -> float:
    """The resident set size of process ``pid``, in MiB (from /proc: Linux only)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@contextmanager
def mmchaos_serve(target: str, *serve_args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``mmchaos serve --target TARGET --port 0 SERVE_ARGS...``: yields (the process, its base URL)."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    cmd = [sys.executable, "-m", "mmchaos", "serve", "--target", target, "--port", "0", *serve_args]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        found = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line)
        if not found:
            raise SystemExit(f"the server did not start: {line}{proc.stderr.read()}")
        yield proc, found.group(1)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
