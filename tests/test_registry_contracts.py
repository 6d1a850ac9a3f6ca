"""Contract tests over every registered kind: each target scheme, each check.

Target schemes (``mmchaos.targets.SCHEMES``): each refuses bad URIs with a typed error and a stable
code, and loads a fixture whose fingerprint is stable and whose capabilities are honest (each one
it declares answers a tiny input; each one it does not declare raises CapabilityError).

Checks (``mmchaos.checks.REGISTRY``): each has a test in ``tests/`` where a deliberately broken
target makes it fail and one where a correct target passes it. Those tests say so themselves,
``@pytest.mark.check_contract("<check>", "broken")`` / ``"clean"``; the tests here find the marks
in every file under ``tests/`` (read with ``ast``) and hold every registered check to having both,
on tests that exist and are not skipped.
Perturbations have their registry contract in ``test_perturb.py``.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from mmchaos.checks import REGISTRY
from mmchaos.errors import CapabilityError, TargetLoadError, UnknownNameError, UsageError
from mmchaos.targets import SCHEMES, Capability, Fingerprint, Target, load_target

IMG = np.random.default_rng(0).integers(0, 256, (32, 48, 3), dtype=np.uint8)


def _png(img: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


# -- target schemes: refusals ----------------------------------------------------------------------

#: (uri, error type, stable code) per scheme; ``{tmp}`` is an empty directory.
REFUSALS: dict[str, list[tuple[str, type[UsageError], str]]] = {
    "builtin": [("builtin:tiny-clipp", UnknownNameError, "unknown_name")],
    "hf": [
        ("hf:/nonexistent/mmchaos-model", TargetLoadError, "target_load_failed"),
        ("hf:{tmp}", TargetLoadError, "target_load_failed"),
    ],
    "py": [
        ("py:tests.no_such_module:factory", TargetLoadError, "target_load_failed"),
        ("py:tests.fakes:not_a_target", TargetLoadError, "target_load_failed"),
        ("py:no_colon", TargetLoadError, "target_load_failed"),
    ],
    "onnx": [
        ("onnx:/nonexistent/mmchaos-export", TargetLoadError, "target_load_failed"),
        ("onnx:{tmp}", TargetLoadError, "target_load_failed"),
    ],
    "openai": [
        ("openai:http://192.0.2.1:8000/v1", TargetLoadError, "remote_not_allowed"),
        ("openai:ftp://127.0.0.1/v1", TargetLoadError, "target_load_failed"),
    ],
}


def test_every_scheme_has_refusal_and_load_cases() -> None:
    """A new scheme must come with its cases here (REFUSALS and LOADS)."""
    assert set(REFUSALS) == set(SCHEMES.names()) == set(LOADS)


#: Schemes whose factory imports torch before it can refuse anything.
TORCH_BEFORE_REFUSAL = {"hf"}


@pytest.mark.parametrize(
    ("uri", "error", "code"),
    [
        pytest.param(*case, id=case[0], marks=[pytest.mark.integration] if scheme in TORCH_BEFORE_REFUSAL else [])
        for scheme, cases in REFUSALS.items()
        for case in cases
    ],
)
def test_a_bad_uri_is_refused_with_a_typed_error_and_a_stable_code(
    uri: str, error: type[UsageError], code: str, tmp_path: Path
) -> None:
    with pytest.raises(error) as info:
        load_target(uri.format(tmp=tmp_path))
    assert info.value.code == code, info.value
    assert isinstance(info.value, UsageError) and "\n" not in str(info.value).strip()


def test_an_unknown_scheme_names_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as info:
        load_target("hff:/models/x")
    assert info.value.code == "unknown_name" and "did you mean hf" in str(info.value)


# -- target schemes: a loaded fixture --------------------------------------------------------------


@contextlib.contextmanager
def _py(tmp: Path) -> Iterator[str]:
    yield "py:tests.fakes:hash_embed"


@contextlib.contextmanager
def _builtin(tmp: Path) -> Iterator[str]:
    pytest.importorskip("transformers")
    yield "builtin:tiny-clip"


@contextlib.contextmanager
def _builtin_ppocr(tmp: Path) -> Iterator[str]:
    pytest.importorskip("rapidocr_onnxruntime")
    yield "builtin:ppocr"


@contextlib.contextmanager
def _hf(tmp: Path) -> Iterator[str]:
    pytest.importorskip("transformers")
    from mmchaos.targets.builtin import TINY_CLIP_DIR

    yield f"hf:{TINY_CLIP_DIR}"


@contextlib.contextmanager
def _onnx(tmp: Path) -> Iterator[str]:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from mmchaos.targets.builtin import TINY_CLIP_DIR
    from mmchaos.targets.export import export_onnx
    from mmchaos.targets.hf import HFContrastiveTarget

    source = HFContrastiveTarget(str(TINY_CLIP_DIR))
    try:
        export_onnx(source, tmp / "export")
    finally:
        source.close()
    yield f"onnx:{tmp / 'export'}"


@contextlib.contextmanager
def _openai(tmp: Path) -> Iterator[str]:
    from mmchaos.server.thread import ServerThread
    from tests.fakes import HashEmbedTarget

    with ServerThread(HashEmbedTarget()) as srv:
        yield f"openai:{srv.base_url}"


#: Per scheme, fixtures that load (context managers giving a URI); all but ``py`` start a real
#: model or server, so they are in the integration tier.
LOADS: dict[str, list[Callable[[Path], contextlib.AbstractContextManager[str]]]] = {
    "py": [_py],
    "builtin": [_builtin, _builtin_ppocr],
    "hf": [_hf],
    "onnx": [_onnx],
    "openai": [_openai],
}
HEAVY = {"builtin", "hf", "onnx", "openai"}

Probe = tuple[str, Callable[[Target], Any]]

#: What each capability answers on a tiny input (PREPROCESS has no base method: see _preprocessors).
PROBES: dict[str, list[Probe]] = {
    "embed_image": [
        ("embed_images", lambda t: t.embed_images([IMG])),
        ("embed_encoded_images", lambda t: t.embed_encoded_images([_png(IMG)])),
    ],
    "embed_text": [
        ("embed_texts", lambda t: t.embed_texts(["a red circle"])),
        ("embed_encoded_texts", lambda t: t.embed_encoded_texts([b"a cat"])),
    ],
    "read_text": [
        ("read_text", lambda t: t.read_text([IMG])),
        ("read_encoded_images", lambda t: t.read_encoded_images([_png(IMG)])),
    ],
    "torch_module": [("torch_module", lambda t: t.torch_module())],
    "generate": [("generate", lambda t: t.generate("What shape is this?", [IMG]))],
}

#: Known dishonesty, by load fixture: the probes of undeclared capabilities that do not raise
#: CapabilityError. OpenAITarget sends read_text to /chat/completions whatever the endpoint
#: declared (the server answers 400, a TargetCallError). Remove an entry when it is fixed.
KNOWN_DISHONEST: dict[str, set[str]] = {}

PREPROCESSORS = ("preprocess_images", "tokenize", "preprocess")
"""PREPROCESS has no method on the Target base: hf and onnx expose ``preprocess_images`` and
``tokenize`` (what the server times), ppocr exposes ``preprocess``. A target that declares it must
expose at least one of them, and each must answer."""


def _preprocessors(target: Target) -> list[Callable[[], Any]]:
    calls: list[Callable[[], Any]] = []
    for name in PREPROCESSORS:
        fn = getattr(target, name, None)
        if callable(fn):
            calls.append(lambda fn=fn, name=name: fn(["a red circle"] if name == "tokenize" else [IMG]))
    return calls


def _check_output(cap: str, out: Any) -> None:
    if cap in ("embed_image", "embed_text"):
        arr = np.asarray(out)
        assert arr.dtype == np.float32 and arr.ndim == 2 and arr.shape[0] == 1 and np.isfinite(arr).all()
    elif cap == "read_text":
        assert isinstance(out, list) and len(out) == 1 and isinstance(out[0], str)
    elif cap == "generate":
        assert isinstance(out.text, str)
    else:
        assert out is not None


def _undeclared_answers(target: Target, probe: Callable[[Target], Any]) -> bool:
    """True when an undeclared capability's probe does anything but raise CapabilityError."""
    try:
        probe(target)
    except CapabilityError as exc:
        assert exc.code == "capability_missing"
        return False
    except Exception:  # any other error (an HTTP 400, a crash) is the dishonesty measured here
        return True
    return True


_LOAD_CASES = [
    pytest.param(scheme, make, id=make.__name__.strip("_"), marks=[pytest.mark.integration] if scheme in HEAVY else [])
    for scheme, makers in LOADS.items()
    for make in makers
]


@pytest.mark.parametrize(("scheme", "make"), _LOAD_CASES)
def test_a_loaded_target_fingerprints_and_its_capabilities_are_honest(
    scheme: str, make: Callable[[Path], contextlib.AbstractContextManager[str]], tmp_path: Path
) -> None:
    with make(tmp_path) as uri:
        assert uri.startswith(f"{scheme}:")
        target = load_target(uri)
        try:
            assert isinstance(target, Target) and target.capabilities, "a target that can do nothing is no target"
            fp = target.fingerprint()
            assert isinstance(fp, Fingerprint) and fp.to_dict() == target.fingerprint().to_dict()
            assert any(fp.to_dict(include_digest=False)[k] for k in ("weights", "tokenizer", "processor", "config"))
            json.dumps(target.describe())  # what a report records must serialise
            dishonest: set[str] = set()
            for cap in Capability:
                if cap == Capability.PREPROCESS:
                    if target.has(cap):
                        calls = _preprocessors(target)
                        assert calls, f"{uri} declares preprocess but exposes none of {PREPROCESSORS}"
                        for call in calls:
                            assert call() is not None
                    continue
                assert cap.value in PROBES, f"capability {cap.value!r} is new: give it a probe in PROBES"
                for name, probe in PROBES[cap.value]:
                    if target.has(cap):
                        _check_output(cap.value, probe(target))
                    elif _undeclared_answers(target, probe):
                        dishonest.add(name)
            assert dishonest == KNOWN_DISHONEST.get(make.__name__.strip("_"), set()), (
                f"{uri}: undeclared capabilities that do not raise CapabilityError"
            )
        finally:
            target.close()


# -- checks: a broken target fails each one --------------------------------------------------------

ROLES = ("broken", "clean")
"""``broken``: a deliberately broken target fails the check; ``clean``: a correct target passes it."""

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
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


CONTRACT_TESTS = discover(ROOT)


def contract_gaps(tests: list[ContractTest], checks: list[str]) -> list[str]:
    """What keeps ``tests`` from holding every check of ``checks`` to its contract, one line each."""
    gaps = [f"{t.where}: role {t.role!r} is not one of {ROLES}" for t in tests if t.role not in ROLES]
    gaps += [f"{t.where}: {t.check!r} is not a registered check" for t in tests if t.check not in checks]
    have = {(t.check, t.role) for t in tests}
    gaps += [f"{c} has no {role} test" for c in sorted(checks) for role in ROLES if (c, role) not in have]
    return gaps


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


@pytest.mark.integration
def test_the_marked_tests_are_what_pytest_collects() -> None:
    """The same marks, through the import pytest does: each marked test is a callable test function
    of its module, carries the mark as read, and neither it nor its module is skipped."""
    for t in CONTRACT_TESTS:
        mod = importlib.import_module(t.module)
        module_marks = getattr(mod, "pytestmark", [])
        module_marks = module_marks if isinstance(module_marks, list) else [module_marks]
        assert not {m.name for m in module_marks} & {"skip", "skipif", "xfail"}, t.module
        fn = getattr(mod, t.function, None)
        assert callable(fn), f"{t.where} is not a function"
        marks = getattr(fn, "pytestmark", [])
        assert not {m.name for m in marks} & {"skip", "skipif", "xfail"}, f"{t.where} is marked {marks}"
        assert any(m.name == "check_contract" and m.args == (t.check, t.role) for m in marks), t.where
