"""Where report files go: an output folder checked before a run, and names that stay inside it.

Artifact names and check ids come from the run store, which may be crafted; a name is only ever
a file name inside ``evidence/``, never a path.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from mmchaos.errors import ConfigError

__all__ = ["prepare_out_dir", "safe_file_name", "unique_file_names", "writable_dir"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._+@=-]+")
_MAX = 120


def writable_dir(path: Path, what: str = "--out") -> Path:
    """Create the folder ``path`` and prove it writable, or raise a one-line ConfigError."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{what} {path} is a file; give a folder", code="output_unusable")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot write to {what} {path}: {exc.strerror or exc}", code="output_unusable") from exc
    return path


def prepare_out_dir(out: Path) -> Path:
    """The report folder ``out`` with its ``evidence/``, writable (checked before a run starts)."""
    writable_dir(out)
    writable_dir(out / "evidence", "--out")
    return out


def safe_file_name(name: str, default: str = "artifact") -> str:
    """``name`` as one plain file name: no folders, no ``..``, no leading dot, bounded length."""
    parts = [p for p in re.split(r"[\\/]+", name) if p not in ("", ".", "..")]
    flat = _UNSAFE.sub("_", "_".join(parts)).lstrip(".")
    if not flat:
        return default
    if len(flat) > _MAX:
        stem, dot, ext = flat.rpartition(".")
        flat = (stem[: _MAX - len(ext) - 1] + "." + ext) if dot and len(ext) <= 16 else flat[:_MAX]
    return flat


def unique_file_names(names: list[str]) -> dict[str, str]:
    """A distinct safe file name for each name (``x``, ``x-2``, ...), in order."""
    taken: set[str] = set()
    out: dict[str, str] = {}
    for name in names:
        base = safe_file_name(name)
        candidate, n = base, 1
        while candidate in taken:
            n += 1
            stem, dot, ext = base.rpartition(".")
            candidate = f"{stem}-{n}.{ext}" if dot and stem else f"{base}-{n}"
        taken.add(candidate)
        out[name] = candidate
    return out
