"""The shipped ``builtin:tiny-clip`` weights: a genuine, offline-loadable transformers CLIPModel.

Trained by ``scripts/train_tiny_clip.py``; these tests load the saved directory with plain
transformers (no mmchaos adapter) and check format, size, tokenizer robustness, padding
invariance and held-out zero-shot accuracy on the built-in ``shapes`` test split.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.paths import REPO

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.integration

if importlib.util.find_spec("mmchaos") is None:  # not installed: use the checkout's src/
    sys.path.insert(0, str(REPO / "src"))

from mmchaos.data.shapes import CLASSES, make_shapes  # noqa: E402


def _model_dir() -> Path:
    spec = importlib.util.find_spec("mmchaos")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            cand = Path(loc) / "models" / "tiny-clip"
            if cand.is_dir():
                return cand
    return REPO / "src" / "mmchaos" / "models" / "tiny-clip"


MODEL_DIR = _model_dir()
CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)


def _feats(out: Any) -> Any:
    # transformers 5: get_*_features return BaseModelOutputWithPooling (pooler_output = projected)
    return out if isinstance(out, torch.Tensor) else out.pooler_output


@pytest.fixture(scope="module")
def loaded() -> tuple[Any, Any, dict[str, Any]]:
    from transformers import AutoProcessor, CLIPModel

    model, info = CLIPModel.from_pretrained(
        MODEL_DIR, use_safetensors=True, local_files_only=True, output_loading_info=True
    )
    processor = AutoProcessor.from_pretrained(MODEL_DIR, local_files_only=True)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return model.eval(), processor, info


def test_directory_format_and_size() -> None:
    files = {p.name: p for p in MODEL_DIR.iterdir() if p.is_file()}
    for name in ("config.json", "model.safetensors", "tokenizer.json", "training.json"):
        assert name in files, f"{name} missing from {MODEL_DIR}"
    assert not any(n.endswith((".bin", ".pt", ".pth", ".pkl")) for n in files), "pickle weights shipped"
    total = sum(p.stat().st_size for p in files.values())
    assert total <= 5 * 1024 * 1024, f"model dir is {total / 1e6:.2f} MB"
    from safetensors import safe_open

    with safe_open(str(files["model.safetensors"]), framework="pt") as f:
        assert any(k.startswith("text_model.") for k in f.keys())  # noqa: SIM118
        assert any(k.startswith("vision_model.") for k in f.keys())  # noqa: SIM118
    record = json.loads(files["training.json"].read_text())
    for key in ("seed", "steps", "wall_seconds", "eval", "versions"):
        assert key in record
    assert record["eval"]["zero_shot_accuracy"] >= 0.90


def test_loads_as_clip_model_without_missing_weights(loaded: tuple[Any, Any, dict[str, Any]]) -> None:
    from transformers import CLIPModel

    model, processor, info = loaded
    assert isinstance(model, CLIPModel)
    assert not info["missing_keys"], info["missing_keys"]
    assert not info["unexpected_keys"], info["unexpected_keys"]
    assert not info.get("mismatched_keys"), info.get("mismatched_keys")
    assert type(processor).__name__ == "CLIPProcessor"
    tcfg = model.config.text_config
    tok = processor.tokenizer
    assert tcfg.eos_token_id == tok.eos_token_id
    assert tcfg.pad_token_id == tok.pad_token_id
    assert tcfg.eos_token_id != 2  # CLIP's legacy argmax pooling would pick the wrong token
    assert tok.model_max_length == tcfg.max_position_embeddings


def test_auto_classes_load_offline() -> None:
    from transformers import AutoImageProcessor, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL_DIR, local_files_only=True)
    ip = AutoImageProcessor.from_pretrained(MODEL_DIR, local_files_only=True)
    assert len(tok("a photo of a red circle.")["input_ids"]) > 2
    assert ip.crop_size == {"height": 64, "width": 64}


def test_image_processor_matches_plain_normalisation(loaded: tuple[Any, Any, dict[str, Any]]) -> None:
    # the training script feeds (x/255 - mean)/std directly; it must equal the processor's output
    _, processor, _ = loaded
    images = [s.image for s in make_shapes(n=8, seed=3, split="train")]
    px = processor(images=images, return_tensors="pt")["pixel_values"].numpy()
    ref = ((np.stack(images).astype(np.float32) / 255 - CLIP_MEAN) / CLIP_STD).transpose(0, 3, 1, 2)
    assert px.shape == (8, 3, 64, 64)
    np.testing.assert_allclose(px, ref, atol=1e-5)


def test_tokenizer_handles_any_unicode_and_truncates(loaded: tuple[Any, Any, dict[str, Any]]) -> None:
    _, processor, _ = loaded
    tok = processor.tokenizer
    text = "café ｆｕｌｌ \u200bzero-width 红色 😀 cafe\u0301 ﬁ Ωmega \t\n tab"
    ids = tok(text)["input_ids"]
    specials = {tok.bos_token_id, tok.eos_token_id}
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    # unk and eos share "<|endoftext|>": no unknown token may appear inside the sequence
    assert not specials & set(ids[1:-1]), tok.convert_ids_to_tokens(ids)
    assert len(tok.get_vocab()) <= 1000
    long = tok(" ".join(["word"] * 500), truncation=True)["input_ids"]
    assert len(long) == tok.model_max_length
    assert long[-1] == tok.eos_token_id


@torch.no_grad()
def test_right_padding_invariance(loaded: tuple[Any, Any, dict[str, Any]]) -> None:
    model, processor, _ = loaded
    texts = ["a photo of a red circle.", "an image showing a blue cross in the top left over a beige background", "x"]
    batch = processor(text=texts, padding=True, truncation=True, return_tensors="pt")
    assert processor.tokenizer.padding_side == "right"
    padded = _feats(model.get_text_features(**batch))
    for i, t in enumerate(texts):
        single = processor(text=[t], truncation=True, return_tensors="pt")
        one = _feats(model.get_text_features(**single))[0]
        cos = torch.nn.functional.cosine_similarity(one, padded[i], dim=0).item()
        assert cos >= 1 - 1e-5, (t, cos)


@torch.no_grad()
def test_zero_shot_accuracy_on_held_out_shapes(loaded: tuple[Any, Any, dict[str, Any]]) -> None:
    model, processor, _ = loaded
    ds = make_shapes(n=300, seed=0, split="test")
    assert list(ds.classes) == CLASSES
    prompts = [f"a photo of a {c}." for c in CLASSES]
    text = processor(text=prompts, padding=True, truncation=True, return_tensors="pt")
    t = torch.nn.functional.normalize(_feats(model.get_text_features(**text)), dim=-1)
    px = processor(images=[s.image for s in ds], return_tensors="pt")["pixel_values"]
    im = torch.nn.functional.normalize(_feats(model.get_image_features(pixel_values=px)), dim=-1)
    pred = (im @ t.T).argmax(-1).numpy()
    gold = np.array([CLASSES.index(s.label) for s in ds])
    acc = float((pred == gold).mean())
    assert acc >= 0.90, acc
