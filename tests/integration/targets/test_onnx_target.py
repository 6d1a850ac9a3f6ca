"""``mmchaos export``, the ``onnx:`` target, and the torch-vs-ONNX Runtime differential check."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from mmchaos.checks.engine.backend_differential import BackendDifferential, BackendDifferentialParams
from mmchaos.checks.integration.fingerprint_match import FingerprintMatch, FingerprintMatchParams
from mmchaos.data.shapes import make_shapes
from mmchaos.errors import CapabilityError, ConfigError, TargetLoadError
from mmchaos.findings import Finding, Verdict
from mmchaos.targets import load_target
from mmchaos.targets.base import Capability
from mmchaos.targets.export import MANIFEST, export_onnx, onnx_input_dims
from tests.fakes import broken_targets as bt
from tests.fakes import targets as fakes
from tests.support import run_check

pytestmark = pytest.mark.integration  # every test here exports or runs the real model

DATA = make_shapes(8, seed=3)


@pytest.fixture(scope="module")
def exported(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("onnx") / "tiny-clip-onnx"
    result = export_onnx(bt.tiny_clip(), out)
    assert result.differences["image_max_abs_diff"] < 1e-4 and result.differences["text_max_abs_diff"] < 1e-4
    return out


def _run(check: Any, target: Any) -> list[Finding]:
    return run_check(check, target, DATA)


def test_export_writes_a_self_describing_directory(exported: Path) -> None:
    names = {p.name for p in exported.iterdir()}
    assert {"image_encoder.onnx", "text_encoder.onnx", "config.json", "tokenizer.json", MANIFEST} <= names
    manifest = json.loads((exported / MANIFEST).read_text())
    assert manifest["source"]["uri"] == "py:tests.fakes.broken_targets:tiny_clip"
    assert manifest["max_text_tokens"] and manifest["expected_components"]["weights"]
    dims = onnx_input_dims(exported / "text_encoder.onnx")
    assert dims["input_ids"] == ["batch", "sequence"], "batch and sequence axes are dynamic"
    assert onnx_input_dims(exported / "image_encoder.onnx")["pixel_values"][0] == "batch"


def test_onnx_target_matches_torch_end_to_end(exported: Path) -> None:
    target = load_target(f"onnx:{exported}")
    source = bt.tiny_clip()
    assert target.capabilities == frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT, Capability.PREPROCESS})
    assert not target.has(Capability.TORCH_MODULE)
    images = [s.load_image() for s in DATA]
    texts = [s.caption or "" for s in DATA] + ["word " * 200]
    np.testing.assert_allclose(target.embed_images(images), source.embed_images(images), atol=1e-4)
    np.testing.assert_allclose(target.embed_texts(texts), source.embed_texts(texts), atol=1e-4)
    recorded = target.recorded_fingerprint()
    assert recorded is not None and recorded.weights == target.fingerprint().weights
    assert target.fingerprint().tokenizer == source.fingerprint().tokenizer, "the tokenizer files travelled unchanged"


@pytest.mark.check_contract("backend_differential", "clean")
def test_backend_differential_passes_a_clean_export(model_dir: Path) -> None:
    findings = _run(BackendDifferential(), bt.tiny_clip())
    assert {f.evidence["modality"]: f.verdict for f in findings} == {"image": Verdict.PASS, "text": Verdict.PASS}
    text = next(f for f in findings if f.evidence["modality"] == "text")
    assert {"tensor_b1", "tensor_b4", "tensor_short_seq", "tensor_full_seq"} <= set(text.evidence["runs"])


def test_backend_differential_counts_the_export_and_both_backends_as_model_time(model_dir: Path) -> None:
    """Issue 23: the export and ONNX Runtime ran on the unwrapped target, outside the runner's model
    clock (14 s of a prelaunch run not counted); now they are, and they are nearly all of the check."""
    import time

    from mmchaos.checks.base import CheckContext
    from mmchaos.runner import TimedTarget

    timed = TimedTarget(bt.tiny_clip())
    ctx = CheckContext(target=timed, dataset=DATA, seed=0, check_id="backend_differential")
    start = time.perf_counter()
    findings = list(BackendDifferential().run(ctx))
    wall = time.perf_counter() - start
    assert {f.verdict for f in findings} == {Verdict.PASS}
    assert timed.seconds > 0.5 * wall, (timed.seconds, wall)


@pytest.mark.check_contract("backend_differential", "broken")
def test_backend_differential_flags_a_batch_size_baked_into_the_graph(model_dir: Path) -> None:
    findings = {f.evidence["modality"]: f for f in _run(BackendDifferential(), bt.reshape_baked())}
    image = findings["image"]
    assert image.verdict == Verdict.FAIL and "silent shape change" in image.title
    assert image.evidence["runs"]["tensor_b4"]["ort_shape"] != image.evidence["runs"]["tensor_b4"]["torch_shape"]
    assert image.artifacts[0].name.endswith(".npz")
    assert findings["text"].verdict == Verdict.PASS


@pytest.fixture(scope="module")
def exported_fp16(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("onnx16") / "tiny-clip-onnx-fp16"
    result = export_onnx(bt.tiny_clip(), out, dtype="float16")
    assert 0 < result.differences["image_max_abs_diff"] < 0.05 and result.differences["text_max_abs_diff"] < 0.05
    return out


def test_a_float16_export_takes_and_gives_half_precision_and_the_onnx_target_casts_at_the_boundary(
    exported_fp16: Path,
) -> None:
    manifest = json.loads((exported_fp16 / MANIFEST).read_text())
    assert manifest["dtype"] == "float16" and "float16" in manifest["exporter"]
    target = load_target(f"onnx:{exported_fp16}")
    runtime = target.describe()["runtime"]
    assert runtime["dtype"] == "float16"
    assert runtime["input_types"] == {"image": {"pixel_values": "float16"},
                                      "text": {"input_ids": "int64", "attention_mask": "int64"}}  # fmt: skip
    images = [s.load_image() for s in DATA]
    got, want = target.embed_images(images), bt.tiny_clip().embed_images(images)
    assert got.dtype == np.float32  # fed float32 pixels, cast to the graph's float16, answered float32
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() > 0.999 and 0 < np.abs(got - want).max() < 0.05, "half precision: close, not equal"


@pytest.mark.check_contract("backend_differential", "clean")
def test_backend_differential_at_float16_passes_within_its_gates_and_reports_the_deviation(model_dir: Path) -> None:
    check = BackendDifferential(BackendDifferentialParams(dtype="float16"))
    findings = {f.evidence["modality"]: f for f in _run(check, bt.tiny_clip())}
    image, text = findings["image"], findings["text"]
    assert image.verdict == text.verdict == Verdict.PASS, (image.message, text.message)
    assert "(float16)" in image.title and 1e-5 < image.metrics["max_rel_diff"] < 1e-2
    assert image.evidence["input_types"] == {"pixel_values": {"graph": "float16", "fed": "float32", "intended": True}}
    assert "pixel_values float32 -> float16" in image.message
    assert text.evidence["input_types"] == {}, "token ids stay int64 in a float16 graph"


@pytest.mark.check_contract("backend_differential", "broken")
def test_backend_differential_at_float16_fails_a_model_whose_activations_overflow_half_precision(
    model_dir: Path,
) -> None:
    check = BackendDifferential(BackendDifferentialParams(dtype="float16", batch_sizes=[2]))
    image = next(f for f in _run(check, bt.fp16_overflow()) if f.evidence["modality"] == "image")
    assert image.verdict == Verdict.FAIL and "non-finite values" in image.message, image.message


@pytest.mark.check_contract("backend_differential", "broken")
def test_backend_differential_flags_token_ids_of_another_element_type_than_the_graph_takes(model_dir: Path) -> None:
    check = BackendDifferential(BackendDifferentialParams(batch_sizes=[2]))
    findings = {f.evidence["modality"]: f for f in _run(check, bt.int32_token_ids())}
    text = findings["text"]
    assert text.verdict == Verdict.FAIL
    assert text.title.startswith("text: graph input input_ids takes int64 but the pipeline feeds int32")
    assert text.evidence["input_types"]["input_ids"] == {"graph": "int64", "fed": "int32", "intended": False}
    assert text.metrics["max_rel_diff"] < 1e-4, "cast, the numbers agree: the failure is the type alone"
    assert findings["image"].verdict == Verdict.PASS


def test_backend_differential_skips_black_box_targets(exported: Path) -> None:
    check = BackendDifferential()
    assert check.missing_capabilities(load_target(f"onnx:{exported}")) is not None
    assert check.missing_capabilities(fakes.HashEmbedTarget()) is not None


def test_a_processor_swapped_into_an_export_is_refused(exported: Path, tmp_path: Path) -> None:
    findings = _run(FingerprintMatch(FingerprintMatchParams(probe=False)), load_target(f"onnx:{exported}"))
    assert findings[0].verdict == Verdict.PASS, findings[0].title
    swapped = tmp_path / "swapped"
    shutil.copytree(exported, swapped)
    bt.mismatched_dir("processor_norm", swapped, src=exported)
    [finding] = _run(FingerprintMatch(FingerprintMatchParams(probe=False)), load_target(f"onnx:{swapped}"))
    assert finding.verdict == Verdict.FAIL and finding.title.startswith("processor does not belong")
    assert "differs from the recorded" in finding.title


def test_export_errors_are_typed(exported: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not empty"):
        export_onnx(bt.tiny_clip(), exported)
    with pytest.raises(CapabilityError, match="no torch module"):
        export_onnx(fakes.HashEmbedTarget(), tmp_path / "x")
    with pytest.raises(TargetLoadError, match="neither"):
        load_target(f"onnx:{tmp_path}")
    with pytest.raises(TargetLoadError, match="not a directory"):
        load_target(f"onnx:{tmp_path / 'missing'}")


def test_export_command(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import typer

    from mmchaos.cli import main as cli_main
    from mmchaos.cli.export_cmd import register

    app = typer.Typer()
    register(app)

    @app.command("noop")
    def _noop() -> None:  # a second command keeps typer from flattening the app into one command
        pass

    out = tmp_path / "cli-export"
    try:
        app(["export", "py:tests.fakes.broken_targets:tiny_clip", str(out), "--no-validate"], standalone_mode=False)
    except SystemExit as exc:  # pragma: no cover - typer exits 0 on success in some versions
        assert not exc.code
    assert (out / "image_encoder.onnx").is_file()
    assert f"onnx:{out}" in capsys.readouterr().out
    with pytest.raises(ConfigError):
        app(["export", "py:tests.fakes.broken_targets:tiny_clip", str(out)], standalone_mode=False)
    with pytest.raises(ConfigError, match="choose one of float32, float16") as refused:
        app(["export", "py:tests.fakes.broken_targets:tiny_clip", str(tmp_path / "bf"), "--dtype", "bf16"],
            standalone_mode=False)  # fmt: skip
    assert refused.value.code == "bad_export_dtype" and not (tmp_path / "bf").exists()
    assert callable(cli_main)


def test_onnx_target_tokenizes_as_shipped_and_context_boundary_sees_early_truncation(
    exported: Path, tmp_path: Path
) -> None:
    """Issue 14: the tokenizer's own limit applies (no override with the model's positions)."""
    from mmchaos.checks.engine.context_boundary import ContextBoundary

    early = tmp_path / "early"
    shutil.copytree(exported, early)
    cfg_path = early / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["model_max_length"] = 8
    cfg_path.write_text(json.dumps(cfg))
    target = load_target(f"onnx:{early}")
    ids = target.tokenize(["a photo of a small red circle at the top left on a white background"])["input_ids"]  # type: ignore[attr-defined]
    assert ids.shape[-1] == 8
    assert target.text_limits()["tokenizer"] == 8  # type: ignore[attr-defined]
    stages = [f for f in _run(ContextBoundary(), target) if f.evidence.get("part") == "stages"]
    assert stages and stages[0].verdict == Verdict.FAIL and "8" in stages[0].title


SMALL_SUITE = """
name: onnx-options
seed: 3
checks:
  - check: batch_invariance
    params: {samples: 4, batch_sizes: [1, 3]}
"""


def test_validate_applies_threads_to_onnx_sessions_and_refuses_a_device_it_cannot_run_on(
    exported: Path, tmp_path: Path, run_cli: Any
) -> None:
    """Issue 19: ``--threads`` on ``onnx:`` is applied (read back from ONNX Runtime), never dropped."""
    import onnxruntime

    suite = tmp_path / "suite.yaml"
    suite.write_text(SMALL_SUITE)

    def validate(*flags: str) -> tuple[int, str, str]:
        return run_cli(  # type: ignore[no-any-return]
            "validate", "--target", f"onnx:{exported}", "--suite", str(suite), "--data", "builtin:shapes?n=6",
            "--out", str(tmp_path / "out"), "--store", str(tmp_path / "runs.db"), *flags,
        )  # fmt: skip

    code, out, err = validate("--threads", "2")
    assert code in (0, 1), err
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    runtime = results["target"]["runtime"]
    assert {k: runtime[k] for k in ("providers", "intra_op_threads", "dtype")} == {
        "providers": ["CPUExecutionProvider"], "intra_op_threads": 2, "dtype": "float32"}  # fmt: skip
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        code, out, err = validate("--device", "cuda")
        assert code == 2 and "onnx_provider_missing" in err and "Traceback" not in out + err
    code, out, err = validate("--trust-remote-code")
    assert code == 2 and "its options: device, threads" in err
