"""docs/pitfalls.md names only checks that exist, and the GPU-host suite it points to loads."""

from __future__ import annotations

import re
from pathlib import Path

from mmchaos.checks import REGISTRY
from mmchaos.suites import load_suite

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "pitfalls.md"


def _found_by_cells() -> list[tuple[str, str]]:
    """(failure mode, 'found by' cell) of every table row whose header has a 'found by' column."""
    rows: list[tuple[str, str]] = []
    column = None
    for line in PAGE.read_text("utf-8").splitlines():
        if not line.startswith("|"):
            column = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if column is None:
            column = cells.index("found by") if "found by" in cells else -1
            continue
        if column >= 0 and not set(cells[0]) <= set("-: "):
            rows.append((cells[0], cells[column]))
    return rows


def test_every_check_named_on_the_page_is_registered() -> None:
    rows = _found_by_cells()
    assert len(rows) >= 50, "the three write-ups' failure modes are tables with a 'found by' column"
    known = set(REGISTRY.names())
    for mode, cell in rows:
        names = re.findall(r"`([^`]+)`", cell)
        assert names or cell == "none", f"{mode!r}: name a check, or say 'none' and why"
        unknown = [n for n in names if n not in known]
        assert not unknown, f"{mode!r} names {unknown}, which are not registered checks"


def test_checks_named_in_the_gpu_section_exist() -> None:
    text = PAGE.read_text("utf-8").split("## On a GPU host or a cluster", 1)[1]
    parts = [p for p in text.split("\n\n") if p.startswith("**")]
    assert len(parts) >= 8, "CUDA contention, OOM, device affinity, cold start, failover..."
    suites = {"quick", "serving", "prelaunch"}
    for part in parts:
        lines = [line for line in part.splitlines() if line.startswith("Checks: ")]
        assert len(lines) == 1, f"{part[:40]!r} ends with one 'Checks: ...' line"
        named = set(re.findall(r"`([^`]+)`", lines[0]))
        assert named - suites, f"{part[:40]!r} names no check"
        assert named - suites <= set(REGISTRY.names()), named - suites - set(REGISTRY.names())


def test_the_gpu_host_suite_loads_and_its_script_exists() -> None:
    suite = load_suite(str(ROOT / "scripts" / "gpu-host.yaml"))
    assert {c.check for c in suite.checks} <= set(REGISTRY.names())
    script = (ROOT / "scripts" / "gpu_host_checks.sh").read_text("utf-8")
    assert "gpu-host.yaml" in script and "--device" in script
