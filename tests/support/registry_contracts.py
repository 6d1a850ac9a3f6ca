"""What the unit and integration halves of ``test_registry_contracts.py`` share.

Those tests: Contract tests over every registered kind: each target scheme, each check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mmchaos.errors import TargetLoadError, UnknownNameError, UsageError
from tests.paths import TESTS

#: (uri, error type, stable code) per scheme; ``{tmp}`` is an empty directory.
REFUSALS: dict[str, list[tuple[str, type[UsageError], str]]] = {
    "builtin": [("builtin:tiny-clipp", UnknownNameError, "unknown_name")],
    "hf": [
        ("hf:/nonexistent/mmchaos-model", TargetLoadError, "target_load_failed"),
        ("hf:{tmp}", TargetLoadError, "target_load_failed"),
    ],
    "py": [
        ("py:tests.no_such_module:factory", TargetLoadError, "target_load_failed"),
        ("py:tests.fakes.targets:not_a_target", TargetLoadError, "target_load_failed"),
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


@contextlib.contextmanager
def _py(tmp: Path) -> Iterator[str]:
    yield "py:tests.fakes.targets:hash_embed"


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
    from tests.fakes.targets import HashEmbedTarget

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

"""PREPROCESS has no method on the Target base: hf and onnx expose ``preprocess_images`` and
``tokenize`` (what the server times), ppocr exposes ``preprocess``. A target that declares it must
expose at least one of them, and each must answer."""

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


def _module_files(module: str) -> list[Path]:
    """The files of test module ``module``: its unit half, its integration half, or both."""
    return sorted(TESTS.glob(f"*/*/{module}.py"))
