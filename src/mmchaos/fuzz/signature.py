"""Judging one fuzzed input, and the failure signature that deduplicates findings.

A fuzzed input has no known correct answer, so only three things are failures: the target
*crashed* (the worker died, or an exception outside the typed error tree escaped), *hung* (no
answer in time), or answered with *garbage* (NaN/Inf, an all-zero or constant vector, the wrong
shape, not an array). A typed rejection and a sane answer both pass.

The signature is what stays the same when the same bug is hit by different inputs: the outcome,
the signal or exception type, the innermost frame, and the message with its numbers blanked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mmchaos.executors.jobs import ErrorInfo, JobResult
from mmchaos.fuzz.worker import normalise_message

__all__ = ["FAILURES", "Judgement", "judge"]

FAILURES = ("crashed", "hung", "garbage")


@dataclass(frozen=True)
class Judgement:
    outcome: str
    """ok, rejected, crashed, hung, garbage, error (the harness), not_applicable."""
    signature: str
    detail: str
    error: ErrorInfo | None = None

    @property
    def failed(self) -> bool:
        return self.outcome in FAILURES


_TB_FRAME = re.compile(r'File "([^"]+)", line \d+, in (\S+)')
_FH_FRAME = re.compile(r'File "([^"]+)", line \d+ in (\S+)')


def _innermost_traceback_frame(tb: str) -> str:
    frames = _TB_FRAME.findall(tb)
    if not frames:
        return "?"
    path, func = frames[-1]
    return f"{path.rsplit('/', 1)[-1]}:{func}"


def _faulthandler_frame(stderr: str) -> str:
    """faulthandler prints the most recent call first."""
    frames = _FH_FRAME.findall(stderr)
    if not frames:
        return "?"
    path, func = frames[0]
    return f"{path.rsplit('/', 1)[-1]}:{func}"


def _signal(detail: str) -> str:
    m = re.search(r"\b(SIG[A-Z]+)\b", detail)
    if m:
        return m.group(1)
    m = re.search(r"exit status (-?\d+)", detail)
    return f"exit{m.group(1)}" if m else "died"


def _garbage(summary: dict[str, object], method: str) -> tuple[str, str] | None:
    """(reason key, detail) when an answer is garbage, else None."""
    kind = summary.get("type")
    if method.startswith("generate"):
        if kind != "texts" or summary.get("n") != 1:
            return "bad_answer", f"expected one answer, got {summary}"[:200]
        lengths = summary.get("lengths")
        if isinstance(lengths, list) and lengths and lengths[0] == 0:
            return "empty_answer", "an empty answer about an image (200 with empty content) instead of a typed refusal"
        return None
    if method.startswith("read"):
        if kind != "texts" or summary.get("n") != 1:
            return "bad_text_answer", f"expected one transcription, got {summary}"[:200]
        return None
    if kind != "array":
        return "not_array", f"an answer that is not an array: {summary.get('repr', kind)}"[:200]
    shape = summary.get("shape")
    if not isinstance(shape, list) or len(shape) != 2 or shape[0] != 1 or shape[1] == 0:
        return "bad_shape", f"output shape {shape}, expected (1, D)"
    if "nonfinite" not in summary:
        return "not_numeric", f"output dtype {summary.get('dtype')}"
    if summary["nonfinite"]:
        return "nonfinite", f"{summary['nonfinite']} of {shape[1]} embedding values are NaN/Inf"
    if summary.get("all_zero"):
        return "all_zero", "an all-zero embedding"
    if summary.get("constant"):
        return "constant", "a constant embedding (every value identical)"
    return None


def judge(kind: str, job: JobResult) -> Judgement:
    """The outcome of one fuzzed input and, for a failure, its signature."""
    if job.status == "hung":
        return Judgement("hung", f"{kind}:hung", job.detail)
    if job.status == "crashed":
        sig = f"{kind}:crashed:{_signal(job.detail)}@{_faulthandler_frame(job.stderr)}"
        return Judgement("crashed", sig, f"the worker process died: {job.detail}")
    if job.status != "ok":
        why = job.error.short() if job.error else job.detail
        return Judgement("error", f"{kind}:error", f"the harness could not run this input: {why}", job.error)
    value = job.value
    if value.get("not_applicable"):
        return Judgement("not_applicable", "", "")
    if value["status"] == "raised":
        err: ErrorInfo = value["error"]
        if err.typed:
            return Judgement("rejected", "", err.short(), err)
        frame = _innermost_traceback_frame(err.traceback)
        code = f"[{err.code}]" if err.code else ""
        sig = f"{kind}:crashed:{err.type}{code}@{frame}: {normalise_message(err.message)}"
        return Judgement("crashed", sig, f"uncaught {err.short()}", err)
    bad = _garbage(value["summary"], str(value.get("method", "")))
    if bad is not None:
        key, detail = bad
        return Judgement("garbage", f"{kind}:garbage:{key}", detail)
    return Judgement("ok", "", "answered sanely")
