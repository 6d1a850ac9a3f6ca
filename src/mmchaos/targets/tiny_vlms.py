"""Tiny, randomly initialised generative VLMs of each supported family, built from config offline.

They exist so the ``hf:`` generative path is exercised through the real code of each family (the
processor's image-token expansion, the saved chat template, the model's own ``generate``) without
downloading anything: tests, deliberately broken fixtures and the tiny-vlm training script build
on them. Each builder returns a directory that ``load_target("hf:" + path)`` loads.

The tokenizer is byte-level BPE with no merges (every text encodes, decoding is exact) plus the
family's special tokens, wrapped in transformers' fast tokenizer class.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmchaos._lazy import require

__all__ = ["FAMILIES", "build_tiny_vlm", "byte_tokenizer", "chat_template"]

HIDDEN = 32
"""Width of every tiny tower: small enough that a family's test runs in seconds on one core."""

#: A generic chat template: ``{image}`` is the family's image placeholder, the roles and turn
#: separators follow the family's own template closely enough that the same code paths run.
_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{ ROLE_OPEN[m['role']] }}"
    "{%- if m['content'] is string -%}{{ m['content'] }}"
    "{%- else -%}{%- for p in m['content'] -%}"
    "{%- if p['type'] == 'image' -%}{{ IMAGE }}{%- elif p['type'] == 'text' -%}{{ p['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ TURN_END }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ GEN_PROMPT }}{%- endif -%}"
)


def chat_template(roles: dict[str, str], image: str, turn_end: str, gen_prompt: str) -> str:
    """A Jinja chat template: ``roles`` opens each turn, ``image`` stands for an image part,
    ``turn_end`` closes a turn and ``gen_prompt`` starts the assistant's answer."""
    values = {"ROLE_OPEN": roles, "IMAGE": image, "TURN_END": turn_end, "GEN_PROMPT": gen_prompt}
    return "".join("{%- set " + k + " = " + json.dumps(v) + " -%}" for k, v in values.items()) + _TEMPLATE


def _save_processor(
    out: Path, processor_class: str, image_processor: Any, tokenizer: Any, template: str, **keys: Any
) -> None:
    """Save a processor's parts as a hub repository holds them, without a video processor (which
    transformers cannot build without torchvision); ``keys`` are the processor's own settings in
    ``processor_config.json`` (image-token counts, feature strategy), as the hub's files hold them."""
    image_processor.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    config = {"processor_class": processor_class, **keys}
    (out / "processor_config.json").write_text(json.dumps(config), encoding="utf-8")


_QWEN_ROLES = {"system": "<|im_start|>system\n", "user": "<|im_start|>user\n", "assistant": "<|im_start|>assistant\n"}


def byte_tokenizer(specials: list[str], *, bos: str, eos: str, pad: str, named: dict[str, str] | None = None) -> Any:
    """A byte-level tokenizer (256 byte symbols, no merges) with ``specials`` as special tokens;
    ``named`` special tokens also become attributes (InternVL's processor reads
    ``tokenizer.start_image_token``, as its hub tokenizer config declares them)."""
    tokenizers = require("tokenizers")
    transformers = require("transformers")
    from tokenizers import decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {sym: i for i, sym in enumerate(sorted(alphabet))}
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    ordered = list(dict.fromkeys([bos, eos, pad, *specials, *(named or {}).values()]))
    tok.add_special_tokens([tokenizers.AddedToken(s, special=True, normalized=False) for s in ordered])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad, extra_special_tokens=dict(named or {})
    )


def _llama(vocab: int, **extra: Any) -> dict[str, Any]:
    return {"vocab_size": vocab, "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 256, **extra}  # fmt: skip


def _llava(out: Path) -> None:
    t = require("transformers")
    tok = byte_tokenizer(["<image>"], bos="<s>", eos="</s>", pad="<pad>")
    ids = tok.convert_tokens_to_ids
    vision = t.CLIPVisionConfig(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
                                num_attention_heads=2, image_size=28, patch_size=14, projection_dim=HIDDEN)  # fmt: skip
    text = t.LlamaConfig(**_llama(len(tok), bos_token_id=ids("<s>"), eos_token_id=ids("</s>"),
                                  pad_token_id=ids("<pad>")))  # fmt: skip
    config = t.LlavaConfig(vision_config=vision, text_config=text, image_token_index=ids("<image>"),
                           vision_feature_layer=-1, vision_feature_select_strategy="default")  # fmt: skip
    config.pad_token_id = ids("<pad>")
    t.LlavaForConditionalGeneration(config).save_pretrained(out)
    template = chat_template(
        {"system": "", "user": "USER: ", "assistant": "ASSISTANT: "}, "<image>\n", "</s>", "ASSISTANT:"
    )
    image_processor = t.CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    processor = t.LlavaProcessor(
        image_processor=image_processor, tokenizer=tok, patch_size=14, vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=template,
    )  # fmt: skip
    processor.save_pretrained(out)


def _qwen2_vl(out: Path, *, v25: bool = False) -> None:
    t = require("transformers")
    specials = ["<|im_start|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tok = byte_tokenizer(specials, bos="<|endoftext|>", eos="<|im_end|>", pad="<|endoftext|>")
    ids = tok.convert_tokens_to_ids
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}  # sums to head_dim / 2
    text = _llama(len(tok), rope_parameters=rope, bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"),
                  pad_token_id=ids("<|endoftext|>"))  # fmt: skip
    common = {
        "image_token_id": ids("<|image_pad|>"), "video_token_id": ids("<|video_pad|>"),
        "vision_start_token_id": ids("<|vision_start|>"), "vision_end_token_id": ids("<|vision_end|>"),
    }  # fmt: skip
    if v25:
        vision = {"depth": 2, "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_heads": 2,
                  "out_hidden_size": HIDDEN, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                  "window_size": 56, "fullatt_block_indexes": [1]}  # fmt: skip
        config = t.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **common)
        model: Any = t.Qwen2_5_VLForConditionalGeneration(config)
    else:
        vision = {"depth": 2, "embed_dim": HIDDEN, "hidden_size": HIDDEN, "mlp_ratio": 2, "num_heads": 2,
                  "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}  # fmt: skip
        config = t.Qwen2VLConfig(text_config=text, vision_config=vision, **common)
        model = t.Qwen2VLForConditionalGeneration(config)
    model.save_pretrained(out)
    template = chat_template(
        {"system": "<|im_start|>system\n", "user": "<|im_start|>user\n", "assistant": "<|im_start|>assistant\n"},
        "<|vision_start|><|image_pad|><|vision_end|>", "<|im_end|>\n", "<|im_start|>assistant\n")  # fmt: skip
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    pixels = {"shortest_edge": 28 * 28 * 4, "longest_edge": 56 * 56}  # 1 to 4 merged tokens an image
    image_processor = Qwen2VLImageProcessorPil(size=pixels, patch_size=14, merge_size=2, temporal_patch_size=2)
    _save_processor(out, "Qwen2_5_VLProcessor" if v25 else "Qwen2VLProcessor", image_processor, tok, template)


def _idefics3(out: Path) -> None:
    """Idefics3, which is also SmolVLM(-Instruct)'s architecture; one image is 4 tokens, unsplit."""
    t = require("transformers")
    specials = ["<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>", "<|im_start|>"]
    specials += [f"<row_{r}_col_{c}>" for r in range(1, 3) for c in range(1, 3)]
    tok = byte_tokenizer(specials, bos="<|im_start|>", eos="<end_of_utterance>", pad="<|endoftext|>")
    ids = tok.convert_tokens_to_ids
    text = t.LlamaConfig(**_llama(len(tok), bos_token_id=ids("<|im_start|>"), eos_token_id=ids("<end_of_utterance>"),
                                  pad_token_id=ids("<|endoftext|>")))  # fmt: skip
    vision = {"hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_hidden_layers": 2,
              "num_attention_heads": 2, "image_size": 56, "patch_size": 14}  # fmt: skip
    config = t.Idefics3Config(vision_config=vision, text_config=text, scale_factor=2, image_token_id=ids("<image>"),
                              pad_token_id=ids("<|endoftext|>"))  # fmt: skip
    t.Idefics3ForConditionalGeneration(config).save_pretrained(out)
    template = chat_template({"system": "<|im_start|>System: ", "user": "<|im_start|>User:", "assistant": "Assistant:"},
                         "<image>", "<end_of_utterance>\n", "Assistant:")  # fmt: skip
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": 56}, max_image_size={"longest_edge": 56}, do_image_splitting=False
    )
    t.Idefics3Processor(image_processor=image_processor, tokenizer=tok, image_seq_len=4,
                        chat_template=template).save_pretrained(out)  # fmt: skip


def _qwen2_text(tok: Any) -> Any:
    t = require("transformers")
    ids = tok.convert_tokens_to_ids
    return t.Qwen2Config(**_llama(len(tok), bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"),
                                  pad_token_id=ids("<|endoftext|>")))  # fmt: skip


def _siglip_vision(t: Any, image_size: int = 28) -> Any:
    return t.SiglipVisionConfig(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
                                num_attention_heads=2, image_size=image_size, patch_size=14)  # fmt: skip


def _llava_onevision(out: Path) -> None:
    """LLaVA-OneVision: SigLIP tower, Qwen2 text, any-resolution tiles (one 28x28 grid here); its
    processor counts image tokens from ``num_image_tokens`` and the feature strategy, both saved
    only in ``processor_config.json``."""
    t = require("transformers")
    tok = byte_tokenizer(["<|im_start|>", "<image>", "<video>"], bos="<|endoftext|>", eos="<|im_end|>",
                         pad="<|endoftext|>")  # fmt: skip
    ids = tok.convert_tokens_to_ids
    config = t.LlavaOnevisionConfig(
        vision_config=_siglip_vision(t), text_config=_qwen2_text(tok), image_token_index=ids("<image>"),
        video_token_index=ids("<video>"), vision_feature_select_strategy="full", vision_feature_layer=-1,
        image_grid_pinpoints=[[28, 28]], vision_aspect_ratio="anyres_max_1",
    )  # fmt: skip
    config.pad_token_id = ids("<|endoftext|>")
    t.LlavaOnevisionForConditionalGeneration(config).save_pretrained(out)
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )

    image_processor = LlavaOnevisionImageProcessorPil(size={"height": 28, "width": 28}, image_grid_pinpoints=[[28, 28]])
    template = chat_template(_QWEN_ROLES, "<image>\n", "<|im_end|>\n", "<|im_start|>assistant\n")
    _save_processor(out, "LlavaOnevisionProcessor", image_processor, tok, template, image_token="<image>",
                    video_token="<video>", num_image_tokens=4, vision_feature_select_strategy="full",
                    vision_aspect_ratio="anyres_max_1")  # fmt: skip


def _internvl(out: Path) -> None:
    """InternVL: its own tower, Qwen2 text; an image is ``<img>`` + ``image_seq_length`` context
    tokens per tile + ``</img>``, the count saved only in ``processor_config.json``."""
    t = require("transformers")
    named = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
             "video_token": "<video>"}  # fmt: skip
    tok = byte_tokenizer(["<|im_start|>"], bos="<|endoftext|>", eos="<|im_end|>", pad="<|endoftext|>", named=named)
    ids = tok.convert_tokens_to_ids
    vision = t.InternVLVisionConfig(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
                                    num_attention_heads=2, image_size=[28, 28], patch_size=[14, 14])  # fmt: skip
    config = t.InternVLConfig(vision_config=vision, text_config=_qwen2_text(tok), image_token_id=ids("<IMG_CONTEXT>"),
                              image_seq_length=1, downsample_ratio=0.5)  # fmt: skip
    config.pad_token_id = ids("<|endoftext|>")
    t.InternVLForConditionalGeneration(config).save_pretrained(out)
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    image_processor = GotOcr2ImageProcessorPil(size={"height": 28, "width": 28}, crop_to_patches=False)
    template = chat_template(_QWEN_ROLES, "<IMG_CONTEXT>\n", "<|im_end|>\n", "<|im_start|>assistant\n")
    _save_processor(out, "InternVLProcessor", image_processor, tok, template, image_seq_length=1)


def _smolvlm2(out: Path) -> None:
    """SmolVLM2 (``smolvlm``): Idefics3's layout with a video part; its processor reads the video
    processor's defaults in every ``apply_chat_template`` call and needs ``num2words``."""
    t = require("transformers")
    specials = ["<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>", "<|im_start|>"]
    specials += [f"<row_{r}_col_{c}>" for r in range(1, 3) for c in range(1, 3)]
    tok = byte_tokenizer(specials, bos="<|im_start|>", eos="<end_of_utterance>", pad="<|endoftext|>")
    ids = tok.convert_tokens_to_ids
    text = t.LlamaConfig(**_llama(len(tok), bos_token_id=ids("<|im_start|>"), eos_token_id=ids("<end_of_utterance>"),
                                  pad_token_id=ids("<|endoftext|>")))  # fmt: skip
    vision = {"hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_hidden_layers": 2,
              "num_attention_heads": 2, "image_size": 56, "patch_size": 14}  # fmt: skip
    config = t.SmolVLMConfig(vision_config=vision, text_config=text, scale_factor=2, image_token_id=ids("<image>"),
                             pad_token_id=ids("<|endoftext|>"))  # fmt: skip
    t.SmolVLMForConditionalGeneration(config).save_pretrained(out)
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    image_processor = SmolVLMImageProcessorPil(
        size={"longest_edge": 56}, max_image_size={"longest_edge": 56}, do_image_splitting=False
    )
    template = chat_template({"system": "<|im_start|>System: ", "user": "<|im_start|>User:", "assistant": "Assistant:"},
                             "<image>", "<end_of_utterance>\n", "Assistant:")  # fmt: skip
    _save_processor(out, "SmolVLMProcessor", image_processor, tok, template, image_seq_len=4)


def _paligemma(out: Path) -> None:
    """PaliGemma: SigLIP tower, Gemma text; its processor demands an image with every prompt and
    adds its location/segmentation tokens to the tokenizer (the embedding table is sized after)."""
    t = require("transformers")
    tok = byte_tokenizer(["<image>"], bos="<bos>", eos="<eos>", pad="<pad>")
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    image_processor = SiglipImageProcessorPil(size={"height": 28, "width": 28})
    image_processor.image_seq_length = 4  # type: ignore[attr-defined]  # PaliGemma's processor reads it
    template = chat_template({"system": "", "user": "", "assistant": ""}, "<image>", "\n", "")
    processor = t.PaliGemmaProcessor(image_processor=image_processor, tokenizer=tok, chat_template=template)
    ids = tok.convert_tokens_to_ids
    text = t.GemmaConfig(**_llama(len(tok), head_dim=16, bos_token_id=ids("<bos>"), eos_token_id=ids("<eos>"),
                                  pad_token_id=ids("<pad>")))  # fmt: skip
    config = t.PaliGemmaConfig(vision_config=_siglip_vision(t), text_config=text, image_token_index=ids("<image>"),
                               projection_dim=HIDDEN, hidden_size=HIDDEN)  # fmt: skip
    config.pad_token_id = ids("<pad>")
    t.PaliGemmaForConditionalGeneration(config).save_pretrained(out)
    processor.save_pretrained(out)


def _blip2(out: Path) -> None:
    """BLIP-2: a Q-Former's query tokens stand for the image (inserted by the processor, no
    placeholder in the prompt), OPT text; ``generate`` requires pixels, and its processor does not
    read the chat template file saved beside it."""
    t = require("transformers")
    tok = byte_tokenizer(["<image>"], bos="</s>", eos="</s>", pad="<pad>")
    ids = tok.convert_tokens_to_ids
    vision = {"hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_hidden_layers": 2,
              "num_attention_heads": 2, "image_size": 28, "patch_size": 14}  # fmt: skip
    qformer = {"hidden_size": HIDDEN, "num_hidden_layers": 2, "num_attention_heads": 2,
               "intermediate_size": 2 * HIDDEN, "encoder_hidden_size": HIDDEN, "vocab_size": 64}  # fmt: skip
    text = t.OPTConfig(vocab_size=len(tok), hidden_size=HIDDEN, ffn_dim=2 * HIDDEN, num_hidden_layers=2,
                       num_attention_heads=2, max_position_embeddings=256, word_embed_proj_dim=HIDDEN,
                       bos_token_id=ids("</s>"), eos_token_id=ids("</s>"), pad_token_id=ids("<pad>"))  # fmt: skip
    config = t.Blip2Config(vision_config=vision, qformer_config=qformer, text_config=text.to_dict(),
                           num_query_tokens=4, image_token_index=ids("<image>"))  # fmt: skip
    t.Blip2ForConditionalGeneration(config).save_pretrained(out)
    from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil

    image_processor = BlipImageProcessorPil(size={"height": 28, "width": 28})
    t.Blip2Processor(image_processor=image_processor, tokenizer=tok, num_query_tokens=4).save_pretrained(out)
    template = chat_template({"system": "", "user": "Question: ", "assistant": "Answer: "}, "", " ", "Answer:")
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")


def _gemma3(out: Path) -> None:
    """Gemma 3: SigLIP tower pooled to ``mm_tokens_per_image`` soft tokens; the prompt's placeholder
    is the start-of-image marker, which the processor expands to the marker, the soft tokens and
    the end-of-image marker (the processor's ``image_token_id`` is the marker's, not the soft token's)."""
    t = require("transformers")
    named = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    tok = byte_tokenizer(["<start_of_turn>", "<end_of_turn>"], bos="<bos>", eos="<eos>", pad="<pad>", named=named)
    ids = tok.convert_tokens_to_ids
    text = t.Gemma3TextConfig(**_llama(len(tok), head_dim=16, query_pre_attn_scalar=16, sliding_window=64,
                                       bos_token_id=ids("<bos>"), eos_token_id=ids("<eos>"),
                                       pad_token_id=ids("<pad>")))  # fmt: skip
    config = t.Gemma3Config(text_config=text, vision_config=_siglip_vision(t), mm_tokens_per_image=4,
                            boi_token_index=ids("<start_of_image>"), eoi_token_index=ids("<end_of_image>"),
                            image_token_index=ids("<image_soft_token>"))  # fmt: skip
    config.pad_token_id = ids("<pad>")
    t.Gemma3ForConditionalGeneration(config).save_pretrained(out)
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    image_processor = Gemma3ImageProcessorPil(size={"height": 28, "width": 28})
    roles = {"system": "<start_of_turn>user\n", "user": "<start_of_turn>user\n", "assistant": "<start_of_turn>model\n"}
    template = chat_template(roles, "<start_of_image>", "<end_of_turn>\n", "<start_of_turn>model\n")
    t.Gemma3Processor(image_processor=image_processor, tokenizer=tok, image_seq_length=4,
                      chat_template=template).save_pretrained(out)  # fmt: skip


FAMILIES: dict[str, Callable[[Path], None]] = {
    "llava": _llava,
    "qwen2_vl": _qwen2_vl,
    "qwen2_5_vl": lambda out: _qwen2_vl(out, v25=True),
    "idefics3": _idefics3,
    "llava_onevision": _llava_onevision,
    "internvl": _internvl,
    "smolvlm2": _smolvlm2,
    "paligemma": _paligemma,
    "blip2": _blip2,
    "gemma3": _gemma3,
}


def build_tiny_vlm(family: str, out: str | Path, *, seed: int = 0) -> Path:
    """Write a tiny random ``family`` VLM (weights, config, processor, chat template) to ``out``."""
    torch = require("torch")
    if family not in FAMILIES:
        raise ValueError(f"unknown tiny VLM family {family!r} (known: {', '.join(FAMILIES)})")
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    require("transformers").logging.disable_progress_bar()  # no "Writing model shards" bars
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        FAMILIES[family](path)
    pad_left(path)
    return path


def pad_left(directory: Path) -> None:
    """Save ``directory``'s tokenizer with left padding (where it names no side), as the hub's VLM
    tokenizers are saved: decoder-only batches need it, and the ``hf:`` target pads as the tokenizer
    was saved (a right-padded copy is a deliberately broken fixture, not the default)."""
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    if "padding_side" not in config:
        config["padding_side"] = "left"
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
