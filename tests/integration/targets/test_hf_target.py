"""The hf: adapter on CLIP and SigLIP models built from config here (no hub downloads)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from mmchaos.errors import TargetLoadError  # noqa: E402
from mmchaos.targets import TargetOptions, load_target  # noqa: E402
from mmchaos.targets.base import Capability  # noqa: E402
from mmchaos.targets.builtin import TINY_CLIP_DIR  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json")
pytestmark = pytest.mark.integration


def _copy_tokenizer(dst: Path) -> int:
    for name in TOKENIZER_FILES:
        if (TINY_CLIP_DIR / name).exists():
            shutil.copy(TINY_CLIP_DIR / name, dst / name)
    return int(transformers.AutoTokenizer.from_pretrained(str(dst)).__len__())


def _text_cfg(vocab: int) -> dict:
    return {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "max_position_embeddings": 32}  # fmt: skip


def _vision_cfg(size: int) -> dict:
    return {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "image_size": size, "patch_size": 8}  # fmt: skip


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("clip")
    vocab = _copy_tokenizer(d)
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    text = _text_cfg(vocab) | {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id,
                               "bos_token_id": tok.bos_token_id}  # fmt: skip
    cfg = transformers.CLIPConfig(text_config=text, vision_config=_vision_cfg(32), projection_dim=16)
    torch.manual_seed(0)
    transformers.CLIPModel(cfg).save_pretrained(str(d))
    transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(
        str(d)
    )
    return d


@pytest.fixture(scope="module")
def siglip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("siglip")
    vocab = _copy_tokenizer(d)
    cfg = transformers.SiglipConfig(text_config=_text_cfg(vocab), vision_config=_vision_cfg(32))
    torch.manual_seed(0)
    transformers.SiglipModel(cfg).save_pretrained(str(d))
    transformers.SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(str(d))
    return d


IMAGES = [np.random.default_rng(i).integers(0, 256, (40 + 8 * i, 48, 3), dtype=np.uint8) for i in range(3)]
TEXTS = ["a red circle", "a much longer caption about a small blue square at the top left", ""]


@pytest.mark.parametrize("which", ["clip_dir", "siglip_dir"])
def test_hf_adapter_embeds_images_and_texts(which: str, request: pytest.FixtureRequest) -> None:
    d = request.getfixturevalue(which)
    target = load_target(f"hf:{d}")
    assert target.uri == f"hf:{d}"
    assert target.has(Capability.EMBED_IMAGE, Capability.EMBED_TEXT, Capability.TORCH_MODULE)
    img, txt = target.embed_images(IMAGES), target.embed_texts(TEXTS)
    assert img.shape[0] == 3 and txt.shape[0] == 3 and img.shape[1] == txt.shape[1]
    assert img.dtype == np.float32 and np.isfinite(img).all() and np.isfinite(txt).all()
    # batch invariance of a correct model: alone == in a batch, within fp32 noise
    alone = target.embed_texts(TEXTS[:1])[0]
    np.testing.assert_allclose(alone, txt[0], rtol=1e-4, atol=1e-5)
    fp = target.fingerprint()
    assert fp.weights and fp.tokenizer and fp.processor and fp.config and fp.versions["transformers"]


def test_fingerprint_changes_with_the_weights(clip_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(clip_dir, other)
    model = transformers.CLIPModel.from_pretrained(str(other))
    with torch.no_grad():
        model.logit_scale.add_(1.0)
    model.save_pretrained(str(other))
    a, b = load_target(f"hf:{clip_dir}").fingerprint(), load_target(f"hf:{other}").fingerprint()
    assert a.weights != b.weights and a.tokenizer == b.tokenizer and a.digest != b.digest


def test_pickle_weights_refused_unless_allowed(clip_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "bin"
    shutil.copytree(clip_dir, d)
    model = transformers.CLIPModel.from_pretrained(str(d))
    (d / "model.safetensors").unlink()
    torch.save(model.state_dict(), d / "pytorch_model.bin")
    with pytest.raises(TargetLoadError, match="safetensors"):
        load_target(f"hf:{d}")
    target = load_target(f"hf:{d}", TargetOptions(use_safetensors=False))
    assert target.embed_texts(["x"]).shape[0] == 1


def test_remote_code_is_never_run_without_the_flag(clip_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "remote"
    shutil.copytree(clip_dir, d)
    marker = tmp_path / "remote-code-ran"
    (d / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    cfg = json.loads((d / "config.json").read_text())
    cfg["auto_map"] = {"AutoModel": "evil.EvilModel", "AutoConfig": "evil.EvilConfig"}
    (d / "config.json").write_text(json.dumps(cfg))
    target = load_target(f"hf:{d}")  # the native CLIP class; the repository's code is ignored
    assert type(target.torch_module()).__name__ == "CLIPModel"
    assert not marker.exists(), "remote code ran without --trust-remote-code"
    with pytest.raises(TargetLoadError):  # asked for: the code runs (and this EvilModel does not exist)
        load_target(f"hf:{d}", TargetOptions(trust_remote_code=True))
    assert marker.exists()


def test_non_contrastive_model_is_refused(tmp_path: Path) -> None:
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32)  # fmt: skip
    transformers.BertModel(cfg).save_pretrained(str(tmp_path))
    with pytest.raises(TargetLoadError, match="not a contrastive image-text model"):
        load_target(f"hf:{tmp_path}")


def test_hub_id_not_in_cache_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TargetLoadError, match="local hub cache"):
        load_target("hf:openai/clip-vit-base-patch32")
