"""Tiny transformers models built from config here (no downloads), one packaging bug each.

Where tests/fakes/broken_targets.py breaks a loaded target in memory, these break the *directory* the
way a release goes wrong: a tokenizer whose limit disagrees with the model's positions, a
checkpoint of another architecture (weights missing at load), and the model families whose inputs
differ from CLIP's (SigLIP 2's patch masks, AltCLIP's RoBERTa position offset).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from tests.fakes.broken_targets import build_tiny_clip

__all__ = [
    "build_align",
    "build_altclip",
    "build_blip_retrieval",
    "build_chinese_clip",
    "build_metaclip2",
    "build_siglip",
    "build_siglip2",
    "clip_with_tokenizer_limit",
    "set_tokenizer_limit",
]

_WORDS = [
    "a",
    "photo",
    "of",
    "red",
    "green",
    "blue",
    "circle",
    "square",
    "triangle",
    "cross",
    "on",
    "the",
    "at",
    "top",
    "left",
    "right",
    "small",
    "large",
]


def set_tokenizer_limit(model_dir: Path, limit: int) -> Path:
    """Rewrite ``model_max_length`` in the saved tokenizer config (the packaging bug of issue 14)."""
    path = model_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["model_max_length"] = limit
    path.write_text(json.dumps(cfg, indent=2))
    return model_dir


def clip_with_tokenizer_limit(out: Path, tokenizer_limit: int, positions: int = 32) -> Path:
    """A random tiny CLIP with ``positions`` text positions whose tokenizer says ``tokenizer_limit``."""
    build_tiny_clip(out, max_len=positions)
    return set_tokenizer_limit(out, tokenizer_limit)


def _quiet() -> Any:
    import transformers

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", module="transformers")
    return transformers


def _word_tokenizer(out: Path, limit: int) -> Any:
    """A whole-word tokenizer with RoBERTa's special ids: <s>=0, <pad>=1, </s>=2, <unk>=3."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    transformers = _quiet()
    vocab = {w: i for i, w in enumerate(["<s>", "<pad>", "</s>", "<unk>", *_WORDS])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()  # type: ignore[assignment]
    tk.post_processor = processors.TemplateProcessing(  # type: ignore[assignment]
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        model_max_length=limit,
    )  # fmt: skip
    tok.save_pretrained(str(out))
    return tok


def _vision(size: int = 32, patch: int = 8) -> dict[str, int]:
    return {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "image_size": size, "patch_size": patch}  # fmt: skip


def build_altclip(out: Path, *, tokenizer_limit: int = 32, positions: int = 34) -> Path:
    """A random tiny AltCLIP (XLM-R text tower): ``positions`` position embeddings, of which
    ``positions - pad_token_id - 1`` are usable, because RoBERTa numbers positions from pad+1."""
    import torch

    transformers = _quiet()
    out.mkdir(parents=True, exist_ok=True)
    tok = _word_tokenizer(out, tokenizer_limit)
    text = {"vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "max_position_embeddings": positions, "pad_token_id": tok.pad_token_id,
            "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "project_dim": 16}  # fmt: skip
    torch.manual_seed(0)
    cfg = transformers.AltCLIPConfig(text_config=text, vision_config=_vision(), projection_dim=16)
    transformers.AltCLIPModel(cfg).save_pretrained(str(out))
    transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(
        str(out)
    )
    return out


def build_siglip2(out: Path, *, positions: int = 64) -> Path:
    """A random tiny SigLIP 2 (NaFlex): its processor returns patches, a patch mask and the grid
    shapes, and the vision tower needs all three. Patch size, patch budget and text length are the
    processor class's defaults (16 px, 256 patches, 64 tokens), which it passes on every call;
    ``positions`` below 64 is the packaging bug of a text tower shorter than the processor pads to."""
    import torch

    transformers = _quiet()
    out.mkdir(parents=True, exist_ok=True)
    tok = _word_tokenizer(out, positions)
    text = {"vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "max_position_embeddings": positions, "pad_token_id": tok.pad_token_id,
            "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}  # fmt: skip
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "patch_size": 16, "num_patches": 256}  # fmt: skip
    torch.manual_seed(0)
    transformers.Siglip2Model(transformers.Siglip2Config(text_config=text, vision_config=vision)).save_pretrained(
        str(out)
    )
    cls = getattr(transformers, "Siglip2ImageProcessorPil", None) or transformers.Siglip2ImageProcessor
    cls(patch_size=16, max_num_patches=256).save_pretrained(str(out))
    return out


def build_blip_retrieval(out: Path, *, saved_as: str | None = None) -> Path:
    """A random tiny BlipForImageTextRetrieval checkpoint (mmchaos loads it as that class, its ITC
    head). ``saved_as`` rewrites the architecture its config.json names: the packaging bug of a
    config that says ``BlipModel`` over retrieval weights, whose text tower, projections and logit
    scale are then not in the checkpoint (newly initialised)."""
    import torch

    transformers = _quiet()
    out.mkdir(parents=True, exist_ok=True)
    text = {"vocab_size": 50, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "max_position_embeddings": 32, "encoder_hidden_size": 32,
            "bos_token_id": 0, "pad_token_id": 1, "eos_token_id": 2, "sep_token_id": 2}  # fmt: skip
    cfg = transformers.BlipConfig(
        text_config=text, vision_config=_vision(), projection_dim=16, image_text_hidden_size=16
    )
    torch.manual_seed(0)
    transformers.BlipForImageTextRetrieval(cfg).save_pretrained(str(out))
    _word_tokenizer(out, 32)
    transformers.BlipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(str(out))
    if saved_as is not None:
        config = json.loads((out / "config.json").read_text(encoding="utf-8"))
        config["architectures"] = [saved_as]
        (out / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return out


def _text(tok: Any, positions: int = 32, **extra: Any) -> dict[str, Any]:
    return {"vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "max_position_embeddings": positions, "pad_token_id": tok.pad_token_id,
            "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, **extra}  # fmt: skip


def _save(model: Any, image_processor: Any, out: Path) -> Path:
    model.save_pretrained(str(out))
    image_processor.save_pretrained(str(out))
    return out


def build_siglip(out: Path) -> Path:
    """A random tiny SigLIP: sigmoid-trained, so its texts are padded to the full length."""
    import torch

    transformers = _quiet()
    out.mkdir(parents=True, exist_ok=True)
    tok = _word_tokenizer(out, 32)
    torch.manual_seed(0)
    config = transformers.SiglipConfig(text_config=_text(tok), vision_config=_vision())
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    return _save(transformers.SiglipModel(config), SiglipImageProcessorPil(size={"height": 32, "width": 32}), out)


def build_metaclip2(out: Path) -> Path:
    """A random tiny MetaCLIP 2 (CLIP's architecture, its own model type; the hub model's
    tokenizer is XLM-V's, a whole-word one here)."""
    import torch

    transformers = _quiet()
    out.mkdir(parents=True, exist_ok=True)
    tok = _word_tokenizer(out, 32)
    torch.manual_seed(0)
    config = transformers.MetaClip2Config(text_config=_text(tok), vision_config=_vision(), projection_dim=16)
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return _save(transformers.MetaClip2Model(config), image_processor, out)


def build_chinese_clip(out: Path) -> Path:
    """A random tiny Chinese-CLIP: a BERT text tower pooled at its first token, a CLIP vision tower."""
    import torch

    transformers = _quiet()
    out.mkdir(parents=True, exist_ok=True)
    tok = _word_tokenizer(out, 32)
    torch.manual_seed(0)
    config = transformers.ChineseCLIPConfig(text_config=_text(tok), vision_config=_vision(), projection_dim=16)
    from transformers.models.chinese_clip.image_processing_pil_chinese_clip import ChineseCLIPImageProcessorPil

    image_processor = ChineseCLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return _save(transformers.ChineseCLIPModel(config), image_processor, out)


def build_align(out: Path) -> Path:
    """A random tiny ALIGN: an EfficientNet image tower (convolutions and batch norm, no patches)
    and a BERT text tower pooled at its first token."""
    import torch

    transformers = _quiet()
    out.mkdir(parents=True, exist_ok=True)
    tok = _word_tokenizer(out, 64)  # ALIGN's processor pads every text to 64 tokens
    # No projection on the image side: the last block's channels are the embedding (= projection_dim).
    vision = {"image_size": 32, "width_coefficient": 1.0, "depth_coefficient": 1.0, "kernel_sizes": [3, 3],
              "in_channels": [32, 16], "out_channels": [16, 16], "strides": [1, 2], "num_block_repeats": [1, 1],
              "expand_ratios": [1, 2], "hidden_dim": 64, "depthwise_padding": []}  # fmt: skip
    torch.manual_seed(0)
    config = transformers.AlignConfig(text_config=_text(tok, 64), vision_config=vision, projection_dim=16)
    from transformers.models.efficientnet.image_processing_pil_efficientnet import EfficientNetImageProcessorPil

    image_processor = EfficientNetImageProcessorPil(size={"height": 32, "width": 32},
                                                    crop_size={"height": 32, "width": 32})  # fmt: skip
    return _save(transformers.AlignModel(config), image_processor, out)
