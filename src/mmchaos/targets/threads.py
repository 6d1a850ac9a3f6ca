"""How many intra-op threads torch uses in the process that loads a target.

Torch's default is one thread per core. For the built-in tiny models that is the slow choice:
their operations are far too small to split, so every one of them pays the threads' hand-over,
and on a machine whose cores are busy with other work (a CI runner, a laptop running the
reference server and a load generator) a thread that waits for a core stalls every operation
(measured 7-14x slower than one thread at load average ~3 on 2 cores). Large models gain from the
threads, so for ``hf:`` targets the default stays torch's own. ``--threads N`` (the ``threads`` target option)
overrides either. The setting is per process (torch has no other), so it is applied when the
target loads, where the user asked for that target.
"""

from __future__ import annotations

from mmchaos.errors import ConfigError

__all__ = ["TINY_MODEL_THREADS", "apply_threads", "limit_blas_threads"]

TINY_MODEL_THREADS = 1
"""Intra-op threads for the built-in tiny models unless ``--threads`` says otherwise."""


def apply_threads(threads: int | None, default: int | None = None) -> int | None:
    """Set torch's intra-op threads to ``threads`` (or ``default``; None for both: leave torch's).

    Returns the number set, or None when nothing was changed."""
    wanted = threads if threads is not None else default
    if wanted is None:
        return None
    if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1:
        raise ConfigError(f"threads must be a positive integer, got {wanted!r}", code="target_bad_threads")
    import torch  # already imported by the targets that call this

    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)
    return wanted


_BLAS_SETTERS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)


def limit_blas_threads(threads: int = 1) -> list[str]:
    """Set the OpenBLAS that numpy and SciPy bundle to ``threads`` threads; the libraries set.

    The harness's own linear algebra is small (a shard's similarity matrix, a batch's cosine
    deviations), and OpenBLAS splits it over every core: on 2 busy cores a 64x64 by 64x128 product
    took 1-26 ms on 2 threads and 0.1 ms on one. ``OPENBLAS_NUM_THREADS`` only counts before numpy
    loads, so this calls the library's own setter. Nothing happens where no bundled OpenBLAS is
    found (another BLAS, another platform) or when the user set ``OPENBLAS_NUM_THREADS``."""
    import ctypes
    import importlib.util
    import os
    from pathlib import Path

    if os.environ.get("OPENBLAS_NUM_THREADS"):
        return []
    done: list[str] = []
    for package in ("numpy", "scipy"):
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            continue
        libs = Path(spec.origin).parent.parent / f"{package}.libs"
        for path in sorted(libs.glob("*openblas*")) if libs.is_dir() else []:
            try:
                lib = ctypes.CDLL(str(path))
            except OSError:
                continue
            setter = next((getattr(lib, n) for n in _BLAS_SETTERS if hasattr(lib, n)), None)
            if setter is not None:
                setter(ctypes.c_int(threads))
                done.append(path.name)
    return done
