"""Contract tests over every registered kind: each target scheme, each check.

Target schemes (``mmchaos.targets.SCHEMES``): each refuses bad URIs with a typed error and a stable
code, and loads a fixture whose fingerprint is stable and whose capabilities are honest (each one
it declares answers a tiny input; each one it does not declare raises CapabilityError).

Checks (``mmchaos.checks.REGISTRY``): each has a test in ``tests/`` where a deliberately broken
target makes it fail and one where a correct target passes it. ``CHECK_TESTS`` names them; the
tests here hold that mapping to the registry and to test functions that exist and are not skipped.
Perturbations have their registry contract in ``test_perturb.py``.
"""

from __future__ import annotations

import ast
import re

import pytest

from mmchaos.checks import REGISTRY
from mmchaos.errors import UnknownNameError
from mmchaos.targets import SCHEMES, load_target
from tests.support.registry_contracts import (
    CHECK_TESTS,
    LOADS,
    REFUSALS,
    _module_files,
)


def test_every_scheme_has_refusal_and_load_cases() -> None:
    """A new scheme must come with its cases here (REFUSALS and LOADS)."""
    assert set(REFUSALS) == set(SCHEMES.names()) == set(LOADS)


def test_an_unknown_scheme_names_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as info:
        load_target("hff:/models/x")
    assert info.value.code == "unknown_name" and "did you mean hf" in str(info.value)


"""PREPROCESS has no method on the Target base: hf and onnx expose ``preprocess_images`` and
``tokenize`` (what the server times), ppocr exposes ``preprocess``. A target that declares it must
expose at least one of them, and each must answer."""


def test_every_registered_check_is_mapped_to_its_broken_and_correct_target_tests() -> None:
    """A new check must name, here, the tests that hold it to "a broken target makes it fail"."""
    assert sorted(CHECK_TESTS) == REGISTRY.names()


SKIPPING = re.compile(r"\bmark\.(skip|skipif|xfail)\b")


def _read_tests(module: str) -> tuple[dict[str, ast.FunctionDef], str]:
    """The module's top-level test functions and its ``pytestmark`` source, read without importing it
    (the fast tier must not pay for the torch or FastAPI imports of integration modules)."""
    functions: dict[str, ast.FunctionDef] = {}
    marks: list[str] = []
    for path in _module_files(module):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        functions |= {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
        marks += [
            ast.unparse(n.value)
            for n in tree.body
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)
        ]
    return functions, " ".join(marks)


@pytest.mark.parametrize("check", sorted(CHECK_TESTS))
def test_the_mapped_tests_exist_run_and_exercise_the_check(check: str) -> None:
    module, fails, passes = CHECK_TESTS[check]
    functions, module_marks = _read_tests(module)
    assert not SKIPPING.search(module_marks), f"tests/{module}.py is skipped as a whole: {module_marks}"
    for name in (fails, passes):
        assert name in functions, f"{check}: tests/{module}.py has no {name}"
        decorators = " ".join(ast.unparse(d) for d in functions[name].decorator_list)
        assert not SKIPPING.search(decorators), f"{check}: {name} is marked {decorators}"
    source = "".join(path.read_text(encoding="utf-8") for path in _module_files(module))
    cls = REGISTRY.get(check)
    assert cls.__name__ in source or f'"{check}"' in source, f"tests/{module}.py never names {check}"
