"""A real ``mmchaos serve`` in a child process, for the tests that drive the tiny VLM over HTTP.

Shared by the served-parity and the serving-fault tests: both need the same launch, the same wait
for the ready line (the base URL is read from it, since ``--port 0`` lets the OS pick the port) and
the same teardown. One torch thread in the child: on a busy 2-core machine the tiny model answers
many times faster so, and the parent's own threads are not starved.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["mmchaos_serve"]

LAUNCH = "from mmchaos.cli import main; main()"


@contextmanager
def mmchaos_serve(env: Mapping[str, str], *args: str) -> Iterator[str]:
    """``mmchaos serve ARGS --port 0`` under ``env`` (one OMP thread); yields its ``http://127.0.0.1:P/v1``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, "serve", *args, "--port", "0"],
        env={**env, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    line = proc.stderr.readline()
    found = re.search(r"on (http://127\.0\.0\.1:\d+/v1)", line)
    try:
        assert found, f"no ready line: {line!r}"
        yield found.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
