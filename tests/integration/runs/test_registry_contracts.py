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

import contextlib
import importlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mmchaos.errors import CapabilityError, UsageError
from mmchaos.targets import Capability, Fingerprint, Target, load_target
from tests.support.check_contracts import CONTRACT_TESTS
from tests.support.registry_contracts import LOADS, REFUSALS

IMG = np.random.default_rng(0).integers(0, 256, (32, 48, 3), dtype=np.uint8)


def _png(img: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


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
