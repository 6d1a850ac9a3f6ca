"""The check-contract marks: where each registered check's broken and clean tests are.

A check's tests say which they are, ``@pytest.mark.check_contract("<check>", "broken")`` (a
deliberately broken target fails the check) or ``"clean"`` (a correct target passes it). This
reads the marks from every test file under ``tests/``, whatever its subfolder, with ``ast``
(without importing it: the fast tier must not pay for the torch or FastAPI imports of
integration modules). ``tests/*/runs/test_registry_contracts.py`` holds the registry to them.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from tests.paths import REPO

__all__ = ["CONTRACT_TESTS", "ROLES", "ContractTest", "contract_gaps", "discover"]

ROLES = ("broken", "clean")
"""``broken``: a deliberately broken target fails the check; ``clean``: a correct target passes it."""

SKIPPING = re.compile(r"\bmark\.(skip|skipif|xfail)\b")


@dataclass(frozen=True)
class ContractTest:
    """A test marked ``@pytest.mark.check_contract(check, role)``, as read from its file."""

    check: str
    role: str
    path: Path
    function: str
    root: Path
    """The repository root the file lies under (what its module name is relative to)."""
    skipped_by: str
    """The skip/xfail marks on the test or its module, as written ('' when none)."""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(self.root)}::{self.function}"

    @property
    def module(self) -> str:
        return ".".join(self.path.relative_to(self.root).with_suffix("").parts)


def _mark_args(decorator: ast.expr) -> list[ast.expr] | None:
    """The arguments of a ``pytest.mark.check_contract(...)`` decorator; None for any other."""
    if isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "pytest.mark.check_contract":
        return list(decorator.args)
    return None


def _contract_tests(path: Path, root: Path) -> Iterator[ContractTest]:
    """The check-contract tests of one file, read with ``ast`` (without importing it: the fast tier
    must not pay for the torch or FastAPI imports of integration modules)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module_marks = " ".join(
        ast.unparse(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)
    )
    top_level = {id(n) for n in tree.body}
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        decorators = " ".join(ast.unparse(d) for d in fn.decorator_list)
        for d in fn.decorator_list:
            args = _mark_args(d)
            if args is None:
                continue
            where = f"{path.relative_to(root)}::{fn.name}"
            assert id(fn) in top_level and fn.name.startswith("test_"), f"{where}: mark a top-level test_ function"
            assert len(args) == 2 and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args), (
                f'{where}: write @pytest.mark.check_contract("<check>", "broken" or "clean")'
            )
            check, role = (cast(ast.Constant, a).value for a in args)
            skipped = " ".join(m for m in (module_marks, decorators) if SKIPPING.search(m))
            yield ContractTest(check, role, path, fn.name, root, skipped)


def discover(root: Path) -> list[ContractTest]:
    """Every marked test in ``root/tests``, in whatever subfolder its file lies."""
    return [t for path in sorted((root / "tests").rglob("test_*.py")) for t in _contract_tests(path, root)]


CONTRACT_TESTS = discover(REPO)
"""Every marked test of this repository."""


def contract_gaps(tests: list[ContractTest], checks: list[str]) -> list[str]:
    """What keeps ``tests`` from holding every check of ``checks`` to its contract, one line each."""
    gaps = [f"{t.where}: role {t.role!r} is not one of {ROLES}" for t in tests if t.role not in ROLES]
    gaps += [f"{t.where}: {t.check!r} is not a registered check" for t in tests if t.check not in checks]
    have = {(t.check, t.role) for t in tests}
    gaps += [f"{c} has no {role} test" for c in sorted(checks) for role in ROLES if (c, role) not in have]
    return gaps
