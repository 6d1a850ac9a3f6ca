"""Write docs/error-codes.md, the catalogue of mmchaos's stable error codes, from the one table.

The table is :data:`mmchaos.error_codes.CODES`. Add or rename a code there, then run
``python scripts/error_codes.py``; tests/unit/runs/test_error_codes.py fails while the sources, the table and
this page disagree, so a code never changes by accident.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = ROOT / "docs" / "error-codes.md"
sys.path.insert(0, str(ROOT / "src"))

from mmchaos.error_codes import CODES, LAYERS  # noqa: E402

HEADER = """# Error codes

Every error mmchaos raises to a user, a CLI caller or an HTTP client carries a stable `code` (see
the exception tree in `src/mmchaos/errors.py`). Scripts, dashboards and servers switch on these;
they change only on purpose, with a note in the changelog. Each code has one HTTP status, the one
`mmchaos serve`, the fault proxy's control API and the guards' `http_status` answer it with.

This page is generated from the table in `src/mmchaos/error_codes.py` by
`python scripts/error_codes.py`; `tests/unit/runs/test_error_codes.py` checks that every code the sources
use is in the table, that every entry is used, and that this page is current.

Where an error reaches the user:

- the CLI prints `error [code]: message` and exits 2 for usage errors;
- `mmchaos serve` answers OpenAI's shape, `{"error": {"message": ..., "type": ..., "param": ...,
  "code": ...}}`, with the code's status;
- the fault proxy's control API answers toxiproxy's shape with the code added,
  `{"error": message, "status": http_status, "code": ...}`.

A code that never reaches HTTP (a CLI, data or run-store error) is listed with the status an HTTP
front end would answer if it did: 400 for bad input to mmchaos, 404 for a name or stored thing that
does not exist, 501 for a missing optional extra, 500 for a failure on the serving side, 502/504
for an upstream that failed. Codes passed through from elsewhere (a remote endpoint's own code, or
`http_<status>` when it gave none, a third-party plugin's) are not listed; they keep the status of
their exception class.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    parts = [HEADER]
    counts = Counter(c.status for c in CODES.values())
    parts.append("\n## How many codes answer with each status\n\n| status | codes |\n|---|---|\n")
    parts.append("".join(f"| {status} | {counts[status]} |\n" for status in sorted(counts)))
    for key, heading in LAYERS:
        rows = sorted((c for c in CODES.values() if c.layer == key), key=lambda c: c.name)
        parts.append(f"\n## {heading}\n\n| code | status | meaning |\n|---|---|---|\n")
        parts.append("".join(f"| `{c.name}` | {c.status} | {_cell(c.meaning)} |\n" for c in rows))
    parts.append(f"\n{len(CODES)} codes.\n")
    return "".join(parts)


if __name__ == "__main__":
    CATALOGUE.write_text(render(), "utf-8")
    print(f"wrote {CATALOGUE.relative_to(ROOT)}")
