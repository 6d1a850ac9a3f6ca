"""What a run store on disk says, read with sqlite3 alone (the run under test may still be writing)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

TWO_CHECK_SUITE = """
name: resumable
seed: 1
checks:
  - check: missing_modality
    params: {image_size: 8}
  - check: batch_invariance
    id: slow-batch
    params: {samples: 12, batch_sizes: [1, 2, 5, 12]}
"""
"""A quick check, then one that ``py:tests.fakes.targets:slow`` keeps running for a few seconds
(``MMCHAOS_TEST_DELAY``): a run to kill or interrupt in its second check."""


def check_statuses(db: Path) -> dict[str, str]:
    """Each check's status in the store at ``db``; empty while the store or its tables do not exist yet."""
    if not db.exists():
        return {}
    try:
        with sqlite3.connect(db) as con:
            return dict(con.execute("SELECT check_id, status FROM checks"))
    except sqlite3.OperationalError:
        return {}
