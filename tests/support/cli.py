"""What the unit and integration halves of ``test_cli.py`` share.

Those tests: CLI exit codes (0 pass, 1 gate failed, 2 bad input) and the report files it writes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SUITE = """
name: tiny
seed: 3
checks:
  - check: batch_invariance
    params: {samples: 4, batch_sizes: [1, 3]}
  - check: missing_modality
    params: {image_size: 16}
"""


@pytest.fixture()
def suite_file(tmp_path: Path) -> Path:
    f = tmp_path / "suite.yaml"
    f.write_text(SUITE)
    return f


def _validate(run_cli, tmp_path: Path, suite: Path, target: str, *extra: str):  # type: ignore[no-untyped-def]
    return run_cli(
        "validate", "--target", target, "--suite", str(suite), "--data", "builtin:shapes?n=6",
        "--out", str(tmp_path / "out"), "--store", str(tmp_path / "runs.db"), *extra,
    )  # fmt: skip


def _snapshot(path: Path) -> tuple[bytes, list[str]]:
    """The file's bytes and its companions (a -wal, -shm or -journal file would show)."""
    return path.read_bytes(), sorted(p.name for p in path.parent.glob(path.name + "*"))
