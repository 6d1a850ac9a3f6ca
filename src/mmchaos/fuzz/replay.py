"""Replaying a saved reproducer: the same input, the same worker isolation, the same judgement.

``mmchaos fuzz-replay`` calls :func:`replay_input`; the evidence of every fuzzing finding holds
the command line. The input's kind comes from the file name (``.txt``: text bytes; anything
else: encoded image bytes) unless given.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mmchaos.errors import ConfigError, DataError
from mmchaos.executors.jobs import WorkerSpec
from mmchaos.executors.pool import InProcessRunner, start_pool
from mmchaos.fuzz.signature import Judgement, judge
from mmchaos.fuzz.worker import fuzz_job

__all__ = ["kind_of", "replay_command", "replay_input"]

KINDS = ("image_bytes", "text_bytes")


def kind_of(path: Path, kind: str | None = None) -> str:
    if kind is not None:
        if kind not in KINDS:
            raise DataError(f"unknown input kind {kind!r} (known: {', '.join(KINDS)})", code="fuzz_bad_kind")
        return kind
    return "text_bytes" if path.suffix.lower() == ".txt" else "image_bytes"


def replay_command(uri: str, file_name: str, kind: str, signature: str, options: dict[str, Any] | None = None) -> str:
    """The command line that replays one saved reproducer (run from the report directory)."""
    import shlex

    parts = ["mmchaos", "fuzz-replay", f"evidence/{file_name}", "--target", uri, "--kind", kind]
    for key, value in sorted((options or {}).items()):
        parts += ["--option", f"{key}={value}"]
    parts += ["--expect", signature]
    return " ".join(shlex.quote(p) for p in parts)


def replay_input(
    uri: str,
    data: bytes,
    kind: str,
    *,
    options: dict[str, Any] | None = None,
    timeout_s: float = 30.0,
    isolation: str = "subprocess",
    target: Any = None,
    accepted_errors: tuple[str, ...] = (),
) -> Judgement:
    """Run ``data`` once through the target's decoding path, isolated as the fuzzer ran it.

    A timeout that is not a positive number of seconds is refused: with ``-1`` every input "hung"
    before it was sent, a false finding that exited 1.
    """
    if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ConfigError(f"the timeout must be a positive number of seconds, got {timeout_s!r}")
    spec = WorkerSpec(uri=uri, options=dict(options or {}), accepted_errors=accepted_errors)
    if isolation == "inprocess":
        if target is None:
            from mmchaos.targets import TargetOptions, load_target

            target = load_target(uri, TargetOptions(**spec.options))
        runner: Any = InProcessRunner(target, spec, fuzz_job)
        results = list(runner.map([(kind, data)], timeout_s))
    else:
        pool = start_pool(spec, fuzz_job, workers=1, start_timeout=300.0)
        try:
            results = list(pool.map([(kind, data)], timeout_s))
        finally:
            pool.close()
    [(_, job)] = results
    return judge(kind, job)
