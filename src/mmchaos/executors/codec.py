"""Job results and unit values as JSON values, losslessly (what the run store's units hold).

Whatever a check judges comes back through :func:`decode_job` (or :func:`decode_value`), whether
the work ran now or was read back from the store on ``--resume``, so a resumed run and an
uninterrupted one judge identical values: arrays keep their dtype and shape, errors their fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mmchaos.executors.jobs import ErrorInfo, JobResult

__all__ = ["decode_job", "decode_value", "encode_job", "encode_value", "json_default"]

_ARRAY = "__ndarray__"
_ERROR = "__error__"


def encode_job(job: JobResult) -> dict[str, Any]:
    """``job`` as JSON values (see the module docstring)."""
    return {
        "status": job.status,
        "value": encode_value(job.value),
        "error": encode_value(job.error),
        "seconds": job.seconds,
        "exitcode": job.exitcode,
        "detail": job.detail,
        "stderr": job.stderr,
        "busy_seconds": job.busy_seconds,
    }


def decode_job(data: Mapping[str, Any]) -> JobResult:
    """The :class:`JobResult` that :func:`encode_job` encoded."""
    return JobResult(
        status=str(data["status"]),
        value=decode_value(data["value"]),
        error=decode_value(data["error"]),
        seconds=float(data["seconds"]),
        exitcode=data["exitcode"],
        detail=str(data["detail"]),
        stderr=str(data["stderr"]),
        busy_seconds=float(data["busy_seconds"]),
    )


def encode_value(value: Any) -> Any:
    """A job's value as JSON values: numbers, strings, lists, dicts, arrays and :class:`ErrorInfo`."""
    import numpy as np

    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, ErrorInfo):
        return {_ERROR: [value.type, value.message, value.typed, value.code, value.traceback]}
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biufcU":
            data = value.tolist() if value.dtype.kind != "c" else [[z.real, z.imag] for z in value.reshape(-1).tolist()]
            return {_ARRAY: [str(value.dtype), list(value.shape), data]}
        return repr(value)[:500]  # an answer that is not even numbers: garbage, judged by its repr
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): encode_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode_value(v) for v in value]
    return repr(value)[:500]


def decode_value(value: Any) -> Any:
    """The value :func:`encode_value` encoded (tuples come back as lists)."""
    import numpy as np

    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if not isinstance(value, dict):
        return value
    if _ERROR in value and len(value) == 1:
        kind, message, typed, code, tb = value[_ERROR]
        return ErrorInfo(type=kind, message=message, typed=typed, code=code, traceback=tb)
    if _ARRAY in value and len(value) == 1:
        dtype, shape, data = value[_ARRAY]
        if np.dtype(dtype).kind == "c":
            flat = np.array([complex(re, im) for re, im in data], dtype=dtype)
            return flat.reshape(shape)
        return np.array(data, dtype=dtype).reshape(shape)
    return {k: decode_value(v) for k, v in value.items()}


def json_default(value: Any) -> Any:
    """``json.dumps``'s fallback for unit results: numpy scalars and arrays as plain numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot encode {type(value).__name__} in a unit result")
