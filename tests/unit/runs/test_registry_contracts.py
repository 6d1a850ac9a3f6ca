"""Contract tests over every registered kind: each target scheme, each check.

Target schemes (``mmchaos.targets.SCHEMES``): each refuses bad URIs with a typed error and a stable
code, and loads a fixture whose fingerprint is stable and whose capabilities are honest (each one
it declares answers a tiny input; each one it does not declare raises CapabilityError).

Checks (``mmchaos.checks.REGISTRY``): each has a test in ``tests/`` where a deliberately broken
target makes it fail and one where a correct target passes it. Those tests say so themselves,
``@pytest.mark.check_contract("<check>", "broken")`` / ``"clean"``; the tests here find the marks
(``tests/support/check_contracts.py``) and hold every registered check to having both, on tests
that exist and are not skipped.
Perturbations have their registry contract in ``test_perturb.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mmchaos.checks import REGISTRY
from mmchaos.errors import UnknownNameError
from mmchaos.targets import SCHEMES, load_target
from tests.support.check_contracts import CONTRACT_TESTS, ContractTest, contract_gaps, discover
from tests.support.registry_contracts import LOADS, REFUSALS


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


def test_every_registered_check_has_a_broken_and_a_clean_test() -> None:
    """A new check marks, on its own tests, the one where a broken target fails it and the one where
    a correct target passes it: ``@pytest.mark.check_contract("<check>", "broken")`` / ``"clean"``."""
    gaps = contract_gaps(CONTRACT_TESTS, REGISTRY.names())
    assert not gaps, "; ".join(gaps) + ' (mark a test @pytest.mark.check_contract("<check>", "broken"/"clean"))'


def test_a_check_without_both_tests_or_a_mark_naming_no_check_is_a_gap(tmp_path: Path) -> None:
    one = ContractTest("robustness", "broken", tmp_path / "t.py", "test_a", tmp_path, "")
    assert contract_gaps([one], ["robustness"]) == ["robustness has no clean test"]
    typo = ContractTest("robustnes", "clean", tmp_path / "t.py", "test_b", tmp_path, "")
    odd = ContractTest("robustness", "fixed", tmp_path / "t.py", "test_c", tmp_path, "")
    gaps = contract_gaps([one, typo, odd], ["robustness"])
    assert gaps == [
        "t.py::test_c: role 'fixed' is not one of ('broken', 'clean')",
        "t.py::test_b: 'robustnes' is not a registered check",
        "robustness has no clean test",
    ]


@pytest.mark.parametrize("test", CONTRACT_TESTS, ids=lambda t: f"{t.check}-{t.role}-{t.function}")
def test_each_marked_test_runs_and_exercises_its_check(test: ContractTest) -> None:
    assert not test.skipped_by, f"{test.where} ({test.check}, {test.role}) is skipped: {test.skipped_by}"
    source = test.path.read_text(encoding="utf-8")
    cls = REGISTRY.get(test.check)
    assert cls.__name__ in source or f'"{test.check}"' in source, f"{test.path.name} never names {test.check}"


def test_the_discovery_reads_marks_wherever_the_file_lies(tmp_path: Path) -> None:
    """The reader itself, on files written here: marks found in subfolders, skips seen, misuse refused."""
    probe = tmp_path / "tests" / "unit" / "checks" / "test_probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text(
        "import pytest\n"
        "pytestmark = pytest.mark.skipif(True, reason='x')\n"
        '@pytest.mark.check_contract("robustness", "broken")\n'
        "@pytest.mark.integration\n"
        "def test_one():\n    pass\n"
        '@pytest.mark.check_contract("robustness", "clean")\n'
        "async def test_two():\n    pass\n",
        encoding="utf-8",
    )
    one, two = discover(tmp_path)
    assert (one.check, one.role, one.function, two.role) == ("robustness", "broken", "test_one", "clean")
    assert one.module == "tests.unit.checks.test_probe" and one.where == "tests/unit/checks/test_probe.py::test_one"
    assert "skipif" in one.skipped_by
    probe.write_text('import pytest\n@pytest.mark.check_contract("robustness")\ndef test_x():\n    pass\n')
    with pytest.raises(AssertionError, match="write @pytest.mark.check_contract"):
        discover(tmp_path)
    probe.write_text(
        'import pytest\nclass TestX:\n    @pytest.mark.check_contract("a", "clean")\n    def test_x(self): ...\n'
    )
    with pytest.raises(AssertionError, match="mark a top-level test_ function"):
        discover(tmp_path)
