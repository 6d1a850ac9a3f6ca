"""The execution layer is one package with one way in (issue 19): ``mmchaos.isolation`` and the
top-level ``mmchaos.resources`` are gone (folded into ``mmchaos.executors``), checks reach worker
processes and executors only through their ``CheckContext``, and the executors' modules import
each other without a circle even counting ``if TYPE_CHECKING:`` imports (before:
``base -> isolated -> journal -> base``)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import mmchaos

SRC = Path(mmchaos.__file__).parent


def _imports(path: Path) -> set[str]:
    """Every ``mmchaos`` module (and imported name, as ``module.name``) ``path`` imports, at any level."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mmchaos"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("mmchaos"))
    return out


def test_isolation_and_top_level_resources_are_gone() -> None:
    assert not (SRC / "isolation.py").exists() and importlib.util.find_spec("mmchaos.isolation") is None
    assert not (SRC / "resources.py").exists() and importlib.util.find_spec("mmchaos.resources") is None
    users = [p for p in SRC.rglob("*.py") if {"mmchaos.isolation", "mmchaos.resources"} & _imports(p)]
    assert users == []


def test_checks_reach_workers_and_executors_only_through_their_context() -> None:
    backdoors = {
        "mmchaos.executors.pool",
        "mmchaos.executors.ray",
        "mmchaos.executors.local",
        "mmchaos.executors.isolated.open_isolated",
        "mmchaos.executors.isolated.prefetch_isolated",
        "mmchaos.executors.run_units",
        "mmchaos.executors.journal.run_units",
    }
    found = {
        str(p.relative_to(SRC)): sorted(backdoors & _imports(p))
        for p in (SRC / "checks").rglob("*.py")
        if p.name != "base.py" and backdoors & _imports(p)
    }
    assert found == {}, "use ctx.map_units / ctx.isolated / ctx.prefetch_isolated"


def test_no_type_level_import_cycle_inside_executors() -> None:
    modules = {f"mmchaos.executors.{p.stem}": p for p in (SRC / "executors").glob("*.py") if p.stem != "__init__"}
    edges = {m: {t for t in _imports(p) if t in modules and t != m} for m, p in modules.items()}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})) for nxt in edges[start])

    assert [m for m in modules if reaches(m, m, {m})] == []
