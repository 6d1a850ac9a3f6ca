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
import contextlib
import importlib
import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mmchaos.checks import REGISTRY
from mmchaos.errors import CapabilityError, TargetLoadError, UnknownNameError, UsageError
from mmchaos.targets import SCHEMES, Capability, Fingerprint, Target, load_target

TESTS = Path(__file__).resolve().parent
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

#: check -> (test module, a test where a broken target fails it, a test where a correct one passes).
CHECK_TESTS: dict[str, tuple[str, str, str]] = {
    "adversarial_whitebox": (
        "test_adversarial",
        "test_whitebox_fails_a_fragile_target",
        "test_whitebox_passes_a_robust_target",
    ),
    "adversarial_blackbox": (
        "test_adversarial",
        "test_blackbox_fails_a_fragile_target_within_its_budget",
        "test_blackbox_passes_a_robust_target",
    ),
    "adversarial_transfer": (
        "test_adversarial",
        "test_transfer_fails_a_target_with_the_surrogates_weakness_and_passes_a_robust_one",
        "test_transfer_fails_a_target_with_the_surrogates_weakness_and_passes_a_robust_one",
    ),
    "generation_batch_invariance": (
        "test_generation_checks",
        "test_generation_batch_invariance_fails_batch_dependent_logits",
        "test_generation_batch_invariance_passes_a_clean_left_padded_vlm",
    ),
    "generation_precision": (
        "test_generation_checks",
        "test_generation_precision_fails_a_layer_that_overflows_in_fp16",
        "test_generation_precision_passes_a_clean_vlm_and_restores_it",
    ),
    "image_token_consistency": (
        "test_generation_checks",
        "test_image_token_consistency_fails_a_vlm_that_drops_an_image",
        "test_image_token_consistency_passes_clean_vlms",
    ),
    "image_context_boundary": (
        "test_generation_checks",
        "test_image_context_boundary_fails_silent_image_truncation",
        "test_image_context_boundary_passes_a_vlm_that_refuses_past_its_positions",
    ),
    "image_cache_isolation": (
        "test_generation_checks",
        "test_image_cache_isolation_fails_a_cache_keyed_on_the_prompt_text",
        "test_image_cache_isolation_passes_a_clean_vlm",
    ),
    "multi_turn_consistency": (
        "test_generation_checks",
        "test_multi_turn_consistency_fails_a_vlm_that_answers_about_the_first_image",
        "test_multi_turn_consistency_passes_a_clean_vlm",
    ),
    "modality_coverage": (
        "test_modality_coverage",
        "test_each_untested_modality_is_a_warning_even_through_wrappers",
        "test_a_fully_tested_target_passes",
    ),
    "robustness": ("test_robustness", "test_a_noise_fragile_target_fails_noise", "test_a_correct_target_passes_noise"),
    "missing_modality": (
        "test_checks_fakes",
        "test_missing_modality_fails_nan_on_uniform_images",
        "test_missing_modality_passes_a_correct_target",
    ),
    "batch_invariance": (
        "test_checks_fakes",
        "test_batch_invariance_fails_a_padding_dependent_target",
        "test_batch_invariance_passes_a_correct_target",
    ),
    "contract": (
        "test_contract",
        "test_a_processor_that_ignores_exif_fails_every_rotated_photo",
        "test_a_validating_target_passes_the_whole_corpus",
    ),
    "contract_fuzz": (
        "test_fuzz",
        "test_a_planted_exif_orientation_bug_is_found_within_the_default_budget",
        "test_a_correct_target_survives_the_fuzzer",
    ),
    "precision": (
        "test_engine_checks",
        "test_precision_names_the_layer_that_overflows_in_fp16",
        "test_precision_passes_the_model_and_restores_it_bit_for_bit",
    ),
    "context_boundary": (
        "test_engine_checks",
        "test_context_boundary_finds_a_tokenizer_that_truncates_early",
        "test_context_boundary_passes_a_target_that_rejects_over_long_text",
    ),
    "backend_differential": (
        "test_onnx_target",
        "test_backend_differential_flags_a_batch_size_baked_into_the_graph",
        "test_backend_differential_passes_a_clean_export",
    ),
    "thread_safety": (
        "test_integration_checks",
        "test_thread_safety_fails_a_shared_preprocessing_buffer",
        "test_thread_safety_passes_a_stateless_target",
    ),
    "determinism": (
        "test_integration_checks",
        "test_determinism_catches_process_salted_hashing_only_across_processes",
        "test_determinism_passes_a_deterministic_target_in_and_across_processes",
    ),
    "fingerprint_match": (
        "test_integration_checks",
        "test_fingerprint_match_catches_a_normalisation_swap_through_the_lock",
        "test_fingerprint_match_passes_matching_components",
    ),
    "serving_faults": (
        "test_serving_checks",
        "test_faults_flag_error_pages_that_are_not_openai_json",
        "test_the_serving_suite_end_to_end_on_loopback",
    ),
    "serving_poison": (
        "test_serving_checks",
        "test_poison_isolation_fails_when_one_image_kills_the_engine",
        "test_the_serving_suite_end_to_end_on_loopback",
    ),
    "serving_overload": (
        "test_serving_checks",
        "test_overload_fails_when_the_knee_is_below_the_required_concurrency",
        "test_the_serving_suite_end_to_end_on_loopback",
    ),
    "serving_resilience": (
        "test_serving_checks",
        "test_resilience_fails_a_breaker_that_never_opens_and_a_client_that_never_retries",
        "test_the_serving_suite_end_to_end_on_loopback",
    ),
    "serving_streaming": (
        "test_serving_streaming_check",
        "test_a_stream_that_drops_its_last_delta_fails_equivalence",
        "test_an_honest_streaming_target_passes",
    ),
    "drift_detection": (
        "test_observability_checks",
        "test_drift_detection_flags_false_alarms_on_a_target_whose_state_leaks",
        "test_drift_detection_passes_a_correct_target_with_real_clean_traffic",
    ),
    "generation_drift": (
        "test_generation_drift_check",
        "test_answers_that_drift_on_clean_traffic_fail",
        "test_an_honest_target_is_quiet_on_clean_traffic_and_its_shift_is_detected",
    ),
    "metrics_exposure": (
        "test_observability_checks",
        "test_metrics_exposure_fails_an_endpoint_without_metrics",
        "test_metrics_exposure_passes_the_guarded_server_and_fails_one_with_guards_off",
    ),
    "text_attack": (
        "test_adversarial_text",
        "test_text_attack_fails_a_target_whose_text_side_breaks_on_typos",
        "test_text_attack_passes_a_target_that_normalises_text",
    ),
    "typographic_attack": (
        "test_adversarial_image_checks",
        "test_typographic_attack_fails_a_model_that_reads_the_written_word",
        "test_typographic_attack_passes_tiny_clip",
    ),
    "semantic_margin": (
        "test_adversarial_image_checks",
        "test_semantic_margin_fails_a_checkerboard_gain_model",
        "test_semantic_margin_passes_tiny_clip",
    ),
}


def test_every_registered_check_is_mapped_to_its_broken_and_correct_target_tests() -> None:
    """A new check must name, here, the tests that hold it to "a broken target makes it fail"."""
    assert sorted(CHECK_TESTS) == REGISTRY.names()


SKIPPING = re.compile(r"\bmark\.(skip|skipif|xfail)\b")


def _read_tests(module: str) -> tuple[dict[str, ast.FunctionDef], str]:
    """The module's top-level test functions and its ``pytestmark`` source, read without importing it
    (the fast tier must not pay for the torch or FastAPI imports of integration modules)."""
    tree = ast.parse((TESTS / f"{module}.py").read_text(encoding="utf-8"))
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
    marks = [
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
    source = (TESTS / f"{module}.py").read_text(encoding="utf-8")
    cls = REGISTRY.get(check)
    assert cls.__name__ in source or f'"{check}"' in source, f"tests/{module}.py never names {check}"


@pytest.mark.integration
def test_the_mapped_tests_are_what_pytest_collects() -> None:
    """The same mapping, through the import pytest does: each named test is a callable test
    function of its module, and neither it nor its module carries a skip or xfail mark."""
    for check, (module, *names) in CHECK_TESTS.items():
        mod = importlib.import_module(f"tests.{module}")
        module_marks = getattr(mod, "pytestmark", [])
        module_marks = module_marks if isinstance(module_marks, list) else [module_marks]
        assert not {m.name for m in module_marks} & {"skip", "skipif", "xfail"}, module
        for name in names:
            fn = getattr(mod, name, None)
            assert callable(fn), f"{check}: tests.{module}.{name} is not a function"
            marks = {m.name for m in getattr(fn, "pytestmark", [])}
            assert not marks & {"skip", "skipif", "xfail"}, f"{check}: {name} is marked {marks}"
