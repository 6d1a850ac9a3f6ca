"""Step 4 checks on real (tiny) transformers CLIP models: correct twins pass, broken ones fail.

The model is the built-in tiny-clip when installed, else a random-weight tiny CLIP built here;
each broken target adds one realistic bug to it (see tests/fakes/broken_targets.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from mmchaos.checks.engine.batch_invariance import BatchInvariance, BatchInvarianceParams
from mmchaos.checks.engine.context_boundary import ContextBoundary, ContextBoundaryGate
from mmchaos.checks.engine.precision import Precision, PrecisionGate, PrecisionParams, cast_module
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Finding, Verdict
from tests.fakes import broken_targets as bt
from tests.support import run_check

pytestmark = pytest.mark.integration  # real models (and torch) throughout

DATA = make_shapes(24, seed=2)


def _run(check: Any, target: Any, data: Any = DATA) -> list[Finding]:
    return run_check(check, target, data)


def _parts(findings: list[Finding]) -> dict[str, Finding]:
    return {f.evidence["part"]: f for f in findings}


@pytest.mark.check_contract("precision", "clean")
def test_precision_passes_the_model_and_restores_it_bit_for_bit(model_dir: Path) -> None:
    import numpy as np

    target = bt.tiny_clip()
    before = target.embed_images([DATA[0].load_image()])
    # the default gate, trained or random model: near-ties are not gated (see test_hf_pipeline)
    findings = _run(Precision(PrecisionParams(samples=16), PrecisionGate()), target)
    by_dtype = {f.evidence["dtype"]: f for f in findings}
    assert set(by_dtype) == {"float16", "bfloat16"}
    for f in findings:
        assert f.verdict == Verdict.PASS, f.title
        assert f.metrics["image_nonfinite_rows"] == 0 and f.metrics["image_min_cosine"] > 0.99
    assert np.array_equal(before, target.embed_images([DATA[0].load_image()])), "fp32 weights must come back exactly"


@pytest.mark.check_contract("precision", "broken")
def test_precision_names_the_layer_that_overflows_in_fp16(model_dir: Path) -> None:
    findings = _run(Precision(PrecisionParams(samples=16, dtypes=["float16", "bfloat16"])), bt.fp16_overflow())
    fp16 = next(f for f in findings if f.evidence["dtype"] == "float16")
    assert fp16.verdict == Verdict.FAIL
    origin = fp16.evidence["nonfinite_origin"]
    last = len(bt.fp16_overflow().model.vision_model.encoder.layers) - 1
    assert origin["module"] == f"vision_model.encoder.layers.{last}.mlp.fc2" and origin["module_type"] == "Linear"
    assert origin["modality"] == "image"
    assert origin["input_index"] == fp16.evidence["nonfinite_inputs"]["image"][0], "the first input that overflows"
    assert f"'vision_model.encoder.layers.{last}.mlp.fc2'" in fp16.title
    assert fp16.artifacts and fp16.artifacts[0].name.endswith(".png"), "the triggering image is saved"
    bf16 = next(f for f in findings if f.evidence["dtype"] == "bfloat16")
    assert bf16.evidence.get("nonfinite_origin") is None, "bf16 has fp32's range: no overflow"


def test_precision_names_the_layer_where_error_grows_when_nothing_overflows(model_dir: Path) -> None:
    """Every value stays finite, so no NaN origin names a module; the per-layer errors against fp32
    still name the MLP whose offset cancellation loses the signal (issue 25, item 4)."""
    findings = _run(Precision(PrecisionParams(samples=8, dtypes=["float16"])), bt.fp16_cancellation())
    [fp16] = findings
    assert fp16.verdict == Verdict.FAIL and "nonfinite_origin" not in fp16.evidence
    layers = fp16.evidence["layer_error"]
    assert layers["growth"]["module"] == "vision_model.encoder.layers.0.mlp.fc2", layers["largest_growth"]
    assert layers["growth"]["output_error"] > 10 * layers["growth"]["input_error"]
    assert "error grows most at module 'vision_model.encoder.layers.0.mlp.fc2'" in fp16.title


def test_precision_reports_per_layer_error_on_a_clean_model_too(model_dir: Path) -> None:
    [fp16] = _run(Precision(PrecisionParams(samples=8, dtypes=["float16"])), bt.tiny_clip())
    layers = fp16.evidence["layer_error"]
    assert fp16.verdict == Verdict.PASS and layers["modules_compared"] > 20
    assert layers["final_output_error"] < 0.05 and not layers["truncated"]


def test_cast_module_restores_the_original_tensors() -> None:
    import torch

    module = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    storage = [p.data.data_ptr() for p in module.parameters()]
    with cast_module(module, torch.float16):
        assert all(p.dtype == torch.float16 for p in module.parameters())
    assert [p.data.data_ptr() for p in module.parameters()] == storage
    assert module[1].running_mean.dtype == torch.float32


@pytest.mark.check_contract("context_boundary", "clean")
def test_context_boundary_passes_a_target_that_rejects_over_long_text(model_dir: Path) -> None:
    parts = _parts(_run(ContextBoundary(), bt.rejects_long_text()))
    assert {k: f.verdict for k, f in parts.items()} == {
        "stages": Verdict.PASS,
        "within": Verdict.PASS,
        "beyond": Verdict.PASS,
    }, [f.title for f in parts.values()]
    assert "rejected with a typed error" in parts["beyond"].title


def test_context_boundary_warns_on_the_plain_models_truncation_at_its_own_limit(model_dir: Path) -> None:
    parts = _parts(_run(ContextBoundary(), bt.tiny_clip()))
    assert parts["stages"].verdict == Verdict.PASS and parts["stages"].evidence["stages"]["model"] == 32
    assert parts["within"].verdict == Verdict.PASS and parts["eos"].verdict == Verdict.PASS
    beyond = parts["beyond"]
    assert beyond.verdict == Verdict.WARN and "at the model's own limit of 32 tokens" in beyond.title
    allowed = _parts(_run(ContextBoundary(gate=ContextBoundaryGate(allow_silent_truncation=True)), bt.tiny_clip()))
    assert allowed["beyond"].verdict == Verdict.PASS and "allowed by the gate" in allowed["beyond"].title


@pytest.mark.check_contract("context_boundary", "broken")
def test_context_boundary_finds_a_tokenizer_that_truncates_early(model_dir: Path) -> None:
    target = bt.early_truncation()
    parts = _parts(_run(ContextBoundary(), target))
    within = parts["within"]
    limit = target.max_text_tokens
    assert parts["beyond"].verdict == Verdict.FAIL, "silent truncation before the limit is not the at-limit warning"
    assert within.verdict == Verdict.FAIL
    assert within.metrics["effective_limit"] == limit - 6
    assert f"stops changing after {limit - 6} tokens, 6 before the model's limit of {limit}" in within.title


def test_context_boundary_finds_eos_lost_in_truncation(model_dir: Path) -> None:
    findings = _run(ContextBoundary(), bt.eos_dropping())
    eos = findings[-1]
    assert eos.verdict == Verdict.FAIL and "not EOS" in eos.title
    assert eos.evidence["last_token_id"] != eos.evidence["eos_token_id"]


def test_batch_invariance_padding_side_and_heterogeneous_sizes(model_dir: Path) -> None:
    params = BatchInvarianceParams(samples=6, batch_sizes=[1, 3], compositions=2)
    target = bt.tiny_clip()
    shipped = target.tokenizer
    good = {f.evidence["modality"]: f for f in _run(BatchInvariance(params), target)}
    assert target.tokenizer is shipped and shipped.padding_side == "right", "the other side is tried on a copy"
    assert {k: f.verdict for k, f in good.items()} == {"image": Verdict.PASS, "text": Verdict.PASS}
    assert good["image"].evidence["neighbour_sizes"], "image batches mixed sizes"
    text = good["text"]
    assert text.evidence["padding_side"] == "right" and "keep 'right'" in text.evidence["padding_side_note"]
    assert text.evidence["padding_deviation"]["right"] <= 1e-4 < text.evidence["padding_deviation"]["left"]
    bad = {f.evidence["modality"]: f for f in _run(BatchInvariance(params), bt.left_padding())}
    assert bad["image"].verdict == Verdict.PASS
    assert bad["text"].verdict == Verdict.FAIL
    side = bad["text_padding_side"]
    assert side.verdict == Verdict.FAIL and "padding on the left changes outputs" in side.title
    assert "padding_side='right' would keep it invariant" in side.title


def test_precision_gates_flips_of_confident_decisions_not_near_ties() -> None:
    import numpy as np

    prompts = np.eye(3, dtype=np.float32)
    ref = {"image": np.array([[1.0, 0.0, 0.0], [0.5, 0.499, 0.0]], np.float32), "prompts": prompts}
    tie_flips = {"image": np.array([[1.0, 0.0, 0.0], [0.499, 0.5, 0.0]], np.float32), "prompts": prompts}
    m = Precision._decisions(ref, tie_flips, [0, 0], min_margin=0.01)
    assert m["top1_agreement_all"] == 0.5 and m["confident_samples"] == 1 and m["top1_agreement"] == 1.0
    assert m["flips_explained_by_margin"] == 1
    confident_flips = {"image": np.array([[0.0, 1.0, 0.0], [0.5, 0.499, 0.0]], np.float32), "prompts": prompts}
    m = Precision._decisions(ref, confident_flips, [0, 0], min_margin=0.01)
    assert m["top1_agreement"] == 0.0 and m["metric_drop"] == 1.0
    assert m["logit_deviation_max"] == pytest.approx(1.0)
