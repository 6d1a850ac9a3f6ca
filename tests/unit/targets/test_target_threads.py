"""``TargetOptions.threads``: torch's intra-op threads for the process that loads a target.

The built-in tiny models default to one thread (their operations are too small to split, and a
thread waiting for a busy core stalls each of them); ``--threads`` overrides it; ``hf:`` models keep
torch's default unless told. Speed itself is measured in ``benchmarks/validate_overhead.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from mmchaos.errors import ConfigError
from mmchaos.targets.threads import apply_threads


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_threads_must_be_a_positive_integer(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        apply_threads(bad)  # type: ignore[arg-type]
    assert info.value.code == "target_bad_threads"


def test_the_bundled_openblas_is_set_to_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes
    import importlib.util
    from pathlib import Path

    from mmchaos.targets.threads import limit_blas_threads

    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert limit_blas_threads(1) == []  # the user's explicit choice is left alone
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    spec = importlib.util.find_spec("numpy")
    assert spec is not None and spec.origin is not None
    libs = sorted((Path(spec.origin).parent.parent / "numpy.libs").glob("*openblas*"))
    if not libs:
        pytest.skip("this numpy does not bundle OpenBLAS")
    done = limit_blas_threads(1)
    assert libs[0].name in done
    lib = ctypes.CDLL(str(libs[0]))
    getter = next(getattr(lib, n) for n in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads")
                  if hasattr(lib, n))  # fmt: skip
    assert getter() == 1


def test_validate_refuses_a_thread_count_below_one(run_cli: Any) -> None:
    code, _, err = run_cli("validate", "--threads", "0", "--suite", "quick")
    assert code == 2 and "--threads" in err
