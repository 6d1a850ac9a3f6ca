"""The serve benchmarks' one way to run ``mmchaos serve`` (and the peer, ``transformers serve``) in a
child process and read its memory.

The server runs in its own process so its RSS is its own, not the load driver's; mmchaos serve prints
its URL on its first stderr line, and stops on SIGINT (killed if it has not within a minute).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["mmchaos_serve", "rss_mib", "transformers_serve"]


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


TF_SERVE = "from transformers.cli.transformers import main; main()"
"""``transformers serve`` started through its CLI entry point (the console script may be absent)."""


@contextmanager
def transformers_serve(model_dir: str, *serve_args: str, startup_s: float = 300.0) -> Iterator[str]:
    """``transformers serve MODEL_DIR`` on a free loopback port, offline on the CPU: yields its base URL.

    The peer server issue 23 names. Its output goes to a log file; a server that exits or is not
    healthy within ``startup_s`` ends the benchmark with that log's tail."""
    import tempfile

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE",
           "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    cmd = [sys.executable, "-c", TF_SERVE, "serve", model_dir, "--host", "127.0.0.1", "--port", str(port),
           "--device", "cpu", "--log-level", "warning", *serve_args]  # fmt: skip
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + startup_s
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise SystemExit(
                        f"transformers serve {' '.join(serve_args)} did not come up:\n{log.read()[-3000:]}"
                    )
                try:
                    if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
