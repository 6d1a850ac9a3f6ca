"""fingerprint / check_compatible / check_consistency: a tokenizer or processor that does not belong
with the weights is refused, naming the components; matching ones pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import mmchaos.guard.compat as compat
from mmchaos.errors import MMChaosError
from mmchaos.guard import (
    CompatibilityError,
    check_compatible,
    check_consistency,
    compare_processors,
    consistency_issues,
    fingerprint,
)
from mmchaos.targets.base import Fingerprint

CONFIG = {
    "model_type": "clip",
    "transformers_version": "4.45.0",
    "text_config": {"vocab_size": 100, "max_position_embeddings": 16},
    "vision_config": {"image_size": 32, "patch_size": 8, "num_channels": 3},
}

PROCESSOR = {
    "image_processor_type": "CLIPImageProcessor",
    "size": {"shortest_edge": 32},
    "crop_size": {"height": 32, "width": 32},
    "do_center_crop": True,
    "do_normalize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
}


def write(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1))


def model_dir(root: Path, *, vocab: int = 100, max_len: Any = 16, processor: dict[str, Any] | None = None) -> Path:
    root.mkdir(parents=True)
    write(root / "config.json", CONFIG)
    write(root / "preprocessor_config.json", processor or PROCESSOR)
    write(
        root / "tokenizer.json",
        {"model": {"type": "BPE", "vocab": {f"t{i}": i for i in range(vocab - 2)}}, "added_tokens": [
            {"id": vocab - 2, "content": "<|startoftext|>"}, {"id": vocab - 1, "content": "<|endoftext|>"}]},
    )  # fmt: skip
    write(root / "tokenizer_config.json", {"model_max_length": max_len})
    (root / "model.safetensors").write_bytes(bytes(range(256)) * 8)
    return root


@pytest.fixture()
def good(tmp_path: Path) -> Path:
    return model_dir(tmp_path / "good")


def test_identical_models_are_compatible(good: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(good, tmp_path / "copy")
    a, b = fingerprint(good), fingerprint(copy)
    assert a == b and a.digest == b.digest and a.versions == {"transformers": "4.45.0"}
    check_compatible(a, b)
    check_compatible(good, copy)
    check_compatible(a.to_dict(), copy)
    check_consistency(good)


@pytest.mark.parametrize(
    ("edit", "component"),
    [
        (
            lambda d: (d / "tokenizer.json").write_text((d / "tokenizer.json").read_text().replace("t5", "t5x")),
            "tokenizer",
        ),
        (lambda d: write(d / "preprocessor_config.json", {**PROCESSOR, "image_mean": [0.5, 0.5, 0.5]}), "processor"),
        (lambda d: (d / "model.safetensors").write_bytes(b"other weights"), "weights"),
        (lambda d: write(d / "config.json", {**CONFIG, "projection_dim": 64}), "config"),
        (lambda d: (d / "tokenizer_config.json").unlink() or (d / "tokenizer.json").unlink(), "tokenizer"),
        # A VLM's chat template places the image tokens; a new one is a different pipeline.
        (lambda d: (d / "chat_template.jinja").write_text("{{ messages }}"), "tokenizer"),
        (lambda d: write(d / "generation_config.json", {"max_new_tokens": 7}), "config"),
    ],
    ids=["tokenizer", "processor", "weights", "config", "tokenizer-missing", "chat-template", "generation-config"],
)
def test_a_changed_component_is_refused_by_name(good: Path, tmp_path: Path, edit: Any, component: str) -> None:
    deployed = Path(shutil.copytree(good, tmp_path / "deployed"))
    edit(deployed)
    with pytest.raises(CompatibilityError) as info:
        check_compatible(fingerprint(good), deployed)
    err = info.value
    assert err.code == "fingerprint_mismatch" and isinstance(err, MMChaosError)
    assert err.components == [component]
    assert component in err.message
    if component in ("tokenizer", "processor"):
        assert "does not belong with these weights" in err.message
    check_compatible(fingerprint(good), deployed, components=[c for c in compat.COMPONENTS if c != component])


def test_components_absent_on_both_sides_are_skipped() -> None:
    a = Fingerprint(weights="w1", tokenizer="", processor=compat.EMPTY_HASH)
    check_compatible(a, Fingerprint(weights="w1"))
    with pytest.raises(CompatibilityError) as info:
        check_compatible(a, Fingerprint(weights="w2", processor="p"))
    assert info.value.components == ["processor", "weights"]
    with pytest.raises(ValueError):
        check_compatible(a, a, components=["weights", "vocab"])


def test_semantic_mismatches_are_caught_without_hashes(good: Path, tmp_path: Path) -> None:
    big_crop = model_dir(tmp_path / "crop", processor={**PROCESSOR, "crop_size": {"height": 48, "width": 48}})
    with pytest.raises(CompatibilityError) as info:
        check_consistency(big_crop)
    assert info.value.code == "config_mismatch" and info.value.components == ["processor"]
    assert "image_size" in info.value.message

    big_vocab = model_dir(tmp_path / "vocab", vocab=120)
    with pytest.raises(CompatibilityError) as info:
        check_consistency(big_vocab)
    assert info.value.components == ["tokenizer"] and "embedding table" in info.value.message

    long_tokens = model_dir(tmp_path / "positions", max_len=77)
    with pytest.raises(CompatibilityError) as info:
        check_consistency(long_tokens)
    assert "position embeddings" in info.value.message

    two_channels = model_dir(tmp_path / "mean", processor={**PROCESSOR, "image_mean": [0.5, 0.5]})
    assert [d.reason for d in consistency_issues(two_channels)] == ["image_mean does not match num_channels"]


def test_a_tokenizer_or_processor_from_elsewhere_is_checked_against_the_weights(good: Path, tmp_path: Path) -> None:
    other = model_dir(tmp_path / "other-release", vocab=150, processor={**PROCESSOR, "crop_size": 40, "size": 40})
    with pytest.raises(CompatibilityError) as info:
        check_consistency(good, tokenizer_dir=other, processor_dir=other)
    assert info.value.components == ["processor", "tokenizer"]
    check_consistency(good, tokenizer_dir=good, processor_dir=good)


def test_unlimited_tokenizer_length_is_a_warning_only(tmp_path: Path) -> None:
    unlimited = model_dir(tmp_path / "unlimited", max_len=int(1e30))
    (issue,) = consistency_issues(unlimited)
    assert issue.severity == "warning" and issue.component == "tokenizer"
    check_consistency(unlimited)


def test_processor_comparison_is_semantic(good: Path) -> None:
    reformatted = {**PROCESSOR, "crop_size": 32, "image_processor_type": "SomethingElse", "auto_map": {}}
    assert compare_processors(PROCESSOR, reformatted) == []
    assert compare_processors(good, PROCESSOR) == []
    diffs = compare_processors(PROCESSOR, {**PROCESSOR, "image_std": [0.5, 0.5, 0.5], "resample": 2})
    assert sorted(d.reason for d in diffs) == ["image_std differs", "resample differs"]


def test_bad_directories_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(CompatibilityError) as info:
        fingerprint(tmp_path / "nope")
    assert info.value.code == "model_dir_missing"
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(CompatibilityError) as info:
        check_consistency(broken)
    assert info.value.code == "model_file_invalid"


def test_the_builtin_tiny_clip_directory_is_consistent() -> None:
    builtin = pytest.importorskip("mmchaos.targets.builtin")
    check_consistency(builtin.TINY_CLIP_DIR)
    check_compatible(fingerprint(builtin.TINY_CLIP_DIR), builtin.TINY_CLIP_DIR)
