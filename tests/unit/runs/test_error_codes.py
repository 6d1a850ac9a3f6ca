"""Every error code the sources use is in the one table (``mmchaos.error_codes.CODES``), every entry
is used, every HTTP status written beside a code agrees with the table, and docs/error-codes.md is
the table rendered. Codes are an API: a typo must fail here, not become a new code."""

from __future__ import annotations

import ast
import difflib
import importlib.util
import re
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from mmchaos.error_codes import CODES, LAYERS, Code, status_of
from mmchaos.errors import ConfigError, MMChaosError, TargetCallError, UnknownNameError
from tests.paths import REPO as ROOT

SRC = ROOT / "src" / "mmchaos"
TABLE = SRC / "error_codes.py"
CATALOGUE = ROOT / "docs" / "error-codes.md"
CODE_RE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")


@dataclass(frozen=True)
class Use:
    """One place a source names a code; ``status`` is an HTTP status written beside it, if any."""

    code: str
    where: str
    status: int | None = None


def _callees(call: ast.Call) -> tuple[str, ...]:
    """The names a call may be indexed under: ``f``, ``mod.f`` -> ``f``, ``Class.method``."""
    f = call.func
    if isinstance(f, ast.Name):
        return (f.id,)
    if isinstance(f, ast.Attribute):
        return (f.attr, f"{f.value.id}.{f.attr}") if isinstance(f.value, ast.Name) else (f.attr,)
    return ()


class CodeScanner:
    """Finds the codes a source tree names, in every form mmchaos uses:

    - a ``code=`` keyword of any call (``raise ConfigError(msg, code="config_invalid")``);
    - the ``code`` positional argument of any function or class defined in the tree with a parameter
      of that name (``_reject("bad_image", msg)``, ``HTTPError(413, "payload_too_large", msg)``,
      ``Response.error("control_method", msg)``, ``BadModelOutput("non_finite_output", msg)``),
      and the ``status`` positional argument beside it;
    - the default of a parameter named ``code``; a class attribute ``code = "..."``;
    - the keys of a ``*_CODES`` dict and the arguments of ``statuses(...)``;
    - a comparison with ``code`` or ``x.code`` (``exc.code == "generate_failed"``).

    A code given as an expression is followed through module-level UPPER_CASE constants
    (``code=REMOTE_REFUSED``), the function's own assignments (``code = "a" if t else "b"``),
    ``a if t else b``, ``a or b`` and ``{...}.get(k, default)``; anything else (``exc.code``, a
    parameter) passes a code through and names none.
    """

    def __init__(self, root: Path, *, exclude: tuple[Path, ...] = ()) -> None:
        self.root = root
        self.trees = {p: ast.parse(p.read_text(), str(p)) for p in sorted(root.rglob("*.py")) if p not in exclude}
        self.constants: dict[str, object] = {}
        self.makers: dict[str, tuple[int, int | None]] = {}
        for tree in self.trees.values():
            self._index(tree)

    def _index(self, tree: ast.Module) -> None:
        for node in tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(t, ast.Name) and t.id.isupper():
                        self.constants[t.id] = node.value.value
        for node in ast.walk(tree):
            fns: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, bool]] = []
            if isinstance(node, ast.ClassDef):  # a method counts when called as Class.method(...)
                fns = [
                    (node.name if f.name == "__init__" else f"{node.name}.{f.name}", f, True)
                    for f in node.body
                    if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                ]
            elif isinstance(node, ast.Module):
                fns = [(f.name, f, False) for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
            for name, fn, method in fns:
                params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
                if method and params[:1] in (["self"], ["cls"]):
                    params = params[1:]
                if "code" in params:
                    self.makers[name] = (params.index("code"), params.index("status") if "status" in params else None)

    def _literals(self, expr: ast.expr | None, local: Mapping[str, list[ast.expr]]) -> set[str]:
        if isinstance(expr, ast.Constant):
            return {expr.value} if isinstance(expr.value, str) else set()
        if isinstance(expr, ast.Name | ast.Attribute):
            name = expr.id if isinstance(expr, ast.Name) else expr.attr
            if name.isupper() and name in self.constants:
                value = self.constants[name]
                return {value} if isinstance(value, str) else set()
            if isinstance(expr, ast.Name):
                return set().union(*(self._literals(v, {}) for v in local.get(name, [])))
            return set()
        if isinstance(expr, ast.IfExp):
            return self._literals(expr.body, local) | self._literals(expr.orelse, local)
        if isinstance(expr, ast.BoolOp | ast.Tuple | ast.List | ast.Set):
            parts = expr.values if isinstance(expr, ast.BoolOp) else expr.elts
            return set().union(*(self._literals(v, local) for v in parts))
        func = expr.func if isinstance(expr, ast.Call) else None
        if isinstance(func, ast.Attribute) and func.attr == "get" and isinstance(func.value, ast.Dict):
            assert isinstance(expr, ast.Call)  # {404: "not_found", ...}.get(status, "http_error")
            options = [*func.value.values, *expr.args[1:]]
            return set().union(*(self._literals(v, local) for v in options))
        return set()

    def _status(self, expr: ast.expr | None) -> int | None:
        value = expr.value if isinstance(expr, ast.Constant) else None
        if isinstance(expr, ast.Name):
            value = self.constants.get(expr.id)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def uses(self) -> Iterator[Use]:
        for path, tree in self.trees.items():
            yield from self._walk(tree, str(path.relative_to(self.root)), {})

    def _walk(self, node: ast.AST, rel: str, local: Mapping[str, list[ast.expr]]) -> Iterator[Use]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assigned: dict[str, list[ast.expr]] = {}
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assign):
                    for t in sub.targets:
                        if isinstance(t, ast.Name):
                            assigned.setdefault(t.id, []).append(sub.value)
            local = assigned
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = [*zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True)]
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
            for arg, default in pairs:
                if arg.arg == "code":
                    yield from (Use(c, f"{rel}:{default.lineno}") for c in self._literals(default, {}))
        yield from self._site(node, rel, local)
        for child in ast.iter_child_nodes(node):
            yield from self._walk(child, rel, local)

    def _site(self, node: ast.AST, rel: str, local: Mapping[str, list[ast.expr]]) -> Iterator[Use]:
        where = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call):
            names = _callees(node)
            exprs = [k.value for k in node.keywords if k.arg == "code"]
            status = next((self._status(k.value) for k in node.keywords if k.arg == "status"), None)
            maker = next((self.makers[n] for n in names if n in self.makers), None)
            if maker is not None:
                ci, si = maker
                exprs += node.args[ci : ci + 1]
                if si is not None and si < len(node.args):
                    status = self._status(node.args[si])
            if names[:1] == ("statuses",):
                exprs += node.args
            for e in exprs:
                yield from (Use(c, where, status) for c in self._literals(e, local))
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    if any(isinstance(t, ast.Name) and t.id == "code" for t in targets):
                        yield from (Use(c, f"{rel}:{stmt.lineno}") for c in self._literals(stmt.value, {}))
        elif isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id.endswith("_CODES") for t in targets):
                for k, v in zip(node.value.keys, node.value.values, strict=True):
                    yield from (Use(c, where, self._status(v)) for c in self._literals(k, {}))
        elif isinstance(node, ast.Compare):
            left = node.left
            if (isinstance(left, ast.Attribute) and left.attr == "code") or (
                isinstance(left, ast.Name) and left.id == "code"
            ):
                for op, comp in zip(node.ops, node.comparators, strict=True):
                    if isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn):
                        yield from (Use(c, where) for c in self._literals(comp, {}))


def problems(uses: list[Use], table: Mapping[str, Code]) -> list[str]:
    """What is wrong between the sources' codes and the table, one line each (empty: nothing)."""
    out = []
    used = {u.code for u in uses if u.code}  # "" is a dataclass's "no code"
    for u in uses:
        if u.code and u.code not in table:
            near = difflib.get_close_matches(u.code, table, n=2)
            hint = f" (did you mean {' or '.join(near)}?)" if near else ""
            out.append(f"{u.where}: code {u.code!r} is not in mmchaos.error_codes.CODES{hint}")
        elif u.code and u.status is not None and u.status != table[u.code].status:
            out.append(f"{u.where}: {u.code!r} answered with {u.status}; the table says {table[u.code].status}")
    out += [f"{name!r} is in the table but no source uses it" for name in sorted(set(table) - used)]
    return out


@pytest.fixture(scope="module")
def source_uses() -> list[Use]:
    return list(CodeScanner(SRC, exclude=(TABLE,)).uses())


def test_the_sources_and_the_table_agree(source_uses: list[Use]) -> None:
    found = problems(source_uses, CODES)
    assert not found, "\n".join(found)


def test_the_scanner_finds_codes_in_each_form_of_the_real_sources(source_uses: list[Use]) -> None:
    """Guard against a scanner that silently finds nothing (a test that cannot fail)."""
    by_code: dict[str, list[Use]] = {}
    for u in source_uses:
        by_code.setdefault(u.code, []).append(u)
    assert "remote_not_allowed" in by_code  # code=REMOTE_REFUSED (a named constant)
    assert "config_invalid" in by_code  # class ConfigError: code = "config_invalid"
    assert "element_count_overflow" in by_code  # statuses(...) in guard/limits.py
    assert "http_bad_request" in by_code  # BadRequest's default
    assert "non_finite_output" in by_code  # BadModelOutput("non_finite_output", ...)
    assert "store_corrupt" in by_code  # code = "store_corrupt" if ... else "store_error"; code=code
    assert "method_not_allowed" in by_code  # {404: ..., 405: "method_not_allowed"}.get(...)
    # statuses are read from the table, never written beside a code (the form is still scanned: BROKEN)
    assert not [u for u in source_uses if u.status is not None]
    assert len(by_code.keys() - {""}) == len(CODES) > 150


BROKEN = """
from mmchaos.errors import ConfigError
LIMIT_CODE = "limt_exceeded"

class HTTPError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None: ...

class OwnError(ConfigError):
    code = "config_invaild"

def _reject(code: str, message: str, code_default: str = "") -> None: ...

def default(message: str, code: str = "http_bad_requst") -> None: ...

def raises(flag: bool) -> None:
    code = "store_corupt" if flag else "store_error"
    raise ConfigError("x", code=code)

def more(exc: ConfigError) -> None:
    raise ConfigError("x", code=LIMIT_CODE)
    _reject("bad_imgae", "the message")
    HTTPError(418, "payload_too_large", "a status the table does not give")
    if exc.code == "generate_faild":
        pass
    SOME_CODES = {"emtpy_input": 400}
"""


def test_a_typo_in_any_form_fails_and_names_the_code_meant(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text(textwrap.dedent(BROKEN))
    found = problems(list(CodeScanner(tmp_path).uses()), CODES)
    unknown = [line for line in found if "is not in" in line]
    for typo in (
        "limt_exceeded",
        "config_invaild",
        "http_bad_requst",
        "store_corupt",
        "bad_imgae",
        "generate_faild",
        "emtpy_input",
    ):
        assert any(f"{typo!r}" in line for line in unknown), (typo, found)
    assert any("'store_corupt'" in line and "did you mean store_corrupt" in line for line in unknown)
    assert any("'payload_too_large' answered with 418; the table says 413" in line for line in found)
    # the well-spelt codes of the same file pass
    assert not any("'store_error'" in line or "'payload_too_large' is" in line for line in found)


def test_an_entry_no_source_uses_fails(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text('from mmchaos.errors import ConfigError\nraise ConfigError("x", code="a_code")\n')
    table = {"a_code": Code("a_code", 400, "used"), "stale_code": Code("stale_code", 400, "nothing raises it")}
    assert problems(list(CodeScanner(tmp_path).uses()), table) == ["'stale_code' is in the table but no source uses it"]


def test_every_entry_is_well_formed() -> None:
    layers = {key for key, _ in LAYERS}
    for name, entry in CODES.items():
        assert entry.name == name and CODE_RE.fullmatch(name), name
        assert 400 <= entry.status <= 599, name
        assert entry.layer in layers, name
        assert entry.meaning and "\n" not in entry.meaning and len(entry.meaning) <= 110, name


def test_http_status_reads_the_table_and_falls_back_for_a_code_it_lacks() -> None:
    assert ConfigError("x").http_status == 400
    assert UnknownNameError("x", code="proxy_not_found").http_status == 404
    assert ConfigError("x", code="toxic_exists").http_status == 409
    assert TargetCallError("x", code="generate_failed").http_status == 500
    # a plugin's own code does not crash anything: the nearest class default answers
    assert TargetCallError("x", code="my_plugin_refused").http_status == 422
    assert UnknownNameError("x", code="my_plugin_thing").http_status == 404

    class PluginError(MMChaosError):
        code = "plugin_specific"

    assert PluginError("x").http_status == 500
    assert status_of("my_plugin_refused", 418) == 418 and status_of("queue_full") == 429


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("error_codes_script", ROOT / "scripts" / "error_codes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_catalogue_is_the_table_rendered() -> None:
    rendered = _script().render()
    assert CATALOGUE.read_text("utf-8") == rendered, "docs/error-codes.md is stale: run python scripts/error_codes.py"
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| (\d{3}) \|", rendered, flags=re.M)
    assert sorted(name for name, _ in rows) == sorted(CODES)
    assert all(CODES[name].status == int(status) for name, status in rows)
