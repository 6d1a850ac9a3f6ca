"""Every stable error code raised in src/mmchaos is in the catalogue (docs/error-codes.md), and
every catalogued code is still raised somewhere: codes are an API, so they change on purpose."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from tests.paths import REPO as ROOT

SRC = ROOT / "src" / "mmchaos"
CATALOGUE = ROOT / "docs" / "error-codes.md"


def _constants() -> dict[str, str]:
    """Module-level UPPER_CASE string constants (codes named once, like net.REMOTE_REFUSED)."""
    out: dict[str, str] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id.isupper() and isinstance(node.value.value, str):
                        out[t.id] = node.value.value
    return out


ERROR_MAKERS = frozenset({"_reject", "HTTPError", "BadRequest", "error", "_error", "http_error"})


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


@functools.cache
def codes_in_source() -> dict[str, set[str]]:
    """code -> the modules that raise it: ``code=...`` keywords, ``code = ...`` class attributes,
    the code argument of error constructors and the keys of ``*_CODES`` tables."""
    constants = _constants()
    found: dict[str, set[str]] = {}

    def add(code: object, path: Path) -> None:
        if isinstance(code, str) and re.fullmatch(r"[a-z][a-z0-9_]*", code):
            found.setdefault(code, set()).add(str(path.relative_to(SRC)))

    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "code":
                if isinstance(node.value, ast.Constant):
                    add(node.value.value, path)
                elif isinstance(node.value, ast.Name) and node.value.id in constants:
                    add(constants[node.value.id], path)
                elif isinstance(node.value, ast.Attribute) and node.value.attr in constants:
                    add(constants[node.value.attr], path)
            elif isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    if (
                        isinstance(stmt, ast.Assign | ast.AnnAssign)
                        and any(
                            isinstance(t, ast.Name) and t.id == "code"
                            for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
                        )
                        and isinstance(stmt.value, ast.Constant)
                    ):
                        add(stmt.value.value, path)
            elif isinstance(node, ast.Call) and _callee(node) in ERROR_MAKERS:
                # _reject("code", msg), HTTPError(413, "code", msg), Response.error(403, msg, "code"): a
                # code is the one snake_case word among the arguments (messages have spaces).
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and " " not in arg.value:
                        add(arg.value, path)
            elif isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict):
                names = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id.endswith("_CODES") for t in names):
                    for k in node.value.keys:  # SIZE_CODES maps code -> HTTP status
                        if isinstance(k, ast.Constant):
                            add(k.value, path)
    return found


def codes_in_catalogue() -> set[str]:
    rows = re.findall(r"^\| `([a-z0-9_]+)` \|", CATALOGUE.read_text(), flags=re.M)
    assert len(rows) == len(set(rows)), "a code is catalogued twice"
    return set(rows)


def test_every_raised_code_is_catalogued_and_every_catalogued_code_is_raised() -> None:
    source = codes_in_source()
    catalogue = codes_in_catalogue()
    missing = {c: sorted(m) for c, m in source.items() if c not in catalogue}
    stale = sorted(catalogue - set(source))
    assert not missing, f"codes raised but not in docs/error-codes.md: {missing}"
    assert not stale, f"codes in docs/error-codes.md that nothing raises any more: {stale}"


def test_the_scanner_finds_codes_in_each_form() -> None:
    """Guard against a scanner that silently finds nothing (a test that cannot fail)."""
    source = codes_in_source()
    assert "remote_not_allowed" in source  # code=REMOTE_REFUSED (a named constant)
    assert "config_invalid" in source  # class ConfigError: code = "config_invalid"
    assert "element_count_overflow" in source  # a *_CODES table value
    assert len(source) > 80
