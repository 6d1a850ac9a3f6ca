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
from mmchaos.targets.vlm_processor import PLAIN_TEMPLATE

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


def byte_tokenizer(
    specials: list[str], *, bos: str, eos: str, pad: str, named: dict[str, str] | None = None, unk: str | None = None
) -> Any:
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
    ordered = list(dict.fromkeys([bos, eos, pad, *([unk] if unk else []), *specials, *(named or {}).values()]))
    tok.add_special_tokens([tokenizers.AddedToken(s, special=True, normalized=False) for s in ordered])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        unk_token=unk,
        extra_special_tokens=dict(named or {}),
    )


def _llama(vocab: int, **extra: Any) -> dict[str, Any]:
    return {"vocab_size": vocab, "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 256, **extra}  # fmt: skip


def _llava_parts(t: Any) -> tuple[Any, Any, Any]:
    """The tokenizer, CLIP vision config and Llama text config LLaVA and LLaVA-NeXT share: the two
    differ only in how an image becomes tokens (one tile against any-resolution tiles)."""
    tok = byte_tokenizer(["<image>"], bos="<s>", eos="</s>", pad="<pad>")
    ids = tok.convert_tokens_to_ids
    vision = t.CLIPVisionConfig(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
                                num_attention_heads=2, image_size=28, patch_size=14, projection_dim=HIDDEN)  # fmt: skip
    text = t.LlamaConfig(**_llama(len(tok), bos_token_id=ids("<s>"), eos_token_id=ids("</s>"),
                                  pad_token_id=ids("<pad>")))  # fmt: skip
    return tok, vision, text


def _llava(out: Path) -> None:
    t = require("transformers")
    tok, vision, text = _llava_parts(t)
    ids = tok.convert_tokens_to_ids
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


def _llava_next(out: Path) -> None:
    """LLaVA-NeXT: CLIP tower, any-resolution tiles (a base image plus the best-fitting grid of
    28-pixel tiles here), a newline token per row; the image's size decides its tokens."""
    t = require("transformers")
    tok, vision, text = _llava_parts(t)
    ids = tok.convert_tokens_to_ids
    grid = [[28, 28], [28, 56], [56, 28]]
    config = t.LlavaNextConfig(vision_config=vision, text_config=text, image_token_index=ids("<image>"),
                               vision_feature_layer=-1, vision_feature_select_strategy="default",
                               image_grid_pinpoints=grid)  # fmt: skip
    config.pad_token_id = ids("<pad>")
    t.LlavaNextForConditionalGeneration(config).save_pretrained(out)
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    image_processor = LlavaNextImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28},
                                                 image_grid_pinpoints=grid)  # fmt: skip
    template = chat_template({"system": "", "user": "[INST] ", "assistant": ""}, "<image>\n", " [/INST]", "")
    t.LlavaNextProcessor(image_processor=image_processor, tokenizer=tok, patch_size=14,
                         vision_feature_select_strategy="default", num_additional_image_tokens=1,
                         chat_template=template).save_pretrained(out)  # fmt: skip


def _qwen3_vl(out: Path) -> None:
    """Qwen3-VL: Qwen2-VL's dynamic resolution with 16-pixel patches, interleaved multimodal
    rotary positions and deepstack features from inner tower layers; a video part."""
    t = require("transformers")
    specials = ["<|im_start|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tok = byte_tokenizer(specials, bos="<|endoftext|>", eos="<|im_end|>", pad="<|endoftext|>")
    ids = tok.convert_tokens_to_ids
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3], "mrope_interleaved": True}
    text = _llama(len(tok), head_dim=16, rope_parameters=rope, bos_token_id=ids("<|endoftext|>"),
                  eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"))  # fmt: skip
    vision = {"depth": 2, "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_heads": 2,
              "out_hidden_size": HIDDEN, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
              "num_position_embeddings": 16, "deepstack_visual_indexes": [1]}  # fmt: skip
    config = t.Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
                             video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                             vision_end_token_id=ids("<|vision_end|>"))  # fmt: skip
    t.Qwen3VLForConditionalGeneration(config).save_pretrained(out)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    pixels = {"shortest_edge": 32 * 32 * 4, "longest_edge": 64 * 64}  # 1 to 4 merged tokens an image
    image_processor = Qwen2VLImageProcessorPil(size=pixels, patch_size=16, merge_size=2, temporal_patch_size=2)
    template = chat_template(_QWEN_ROLES, "<|vision_start|><|image_pad|><|vision_end|>", "<|im_end|>\n",
                             "<|im_start|>assistant\n")  # fmt: skip
    _save_processor(out, "Qwen3VLProcessor", image_processor, tok, template)


def _glm4v(out: Path) -> None:
    """GLM-4.1V: dynamic resolution (its image processor counts the temporal factor in its pixel
    budget), partial rotary positions in three sections, ``<|begin_of_image|>`` markers; a video part."""
    t = require("transformers")
    specials = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|begin_of_image|>",
                "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|video|>"]  # fmt: skip
    tok = byte_tokenizer(specials, bos="[gMASK]", eos="<|user|>", pad="<|endoftext|>")
    ids = tok.convert_tokens_to_ids
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5}
    text = _llama(len(tok), rope_parameters=rope, bos_token_id=ids("[gMASK]"), eos_token_id=ids("<|user|>"),
                  pad_token_id=ids("<|endoftext|>"))  # fmt: skip
    vision = {"depth": 2, "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_heads": 2,
              "out_hidden_size": HIDDEN, "image_size": 28, "patch_size": 14, "spatial_merge_size": 2,
              "temporal_patch_size": 2}  # fmt: skip
    config = t.Glm4vConfig(
        text_config=text, vision_config=vision, image_token_id=ids("<|image|>"), video_token_id=ids("<|video|>"),
        image_start_token_id=ids("<|begin_of_image|>"), image_end_token_id=ids("<|end_of_image|>"),
        video_start_token_id=ids("<|begin_of_video|>"), video_end_token_id=ids("<|end_of_video|>"),
    )  # fmt: skip
    t.Glm4vForConditionalGeneration(config).save_pretrained(out)
    from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil

    pixels = {"shortest_edge": 28 * 28 * 2, "longest_edge": 56 * 56 * 2}  # x2: the temporal factor
    image_processor = Glm4vImageProcessorPil(size=pixels, patch_size=14, merge_size=2,  # type: ignore[call-arg]
                                             temporal_patch_size=2)  # fmt: skip
    roles = {"system": "<|system|>\n", "user": "<|user|>\n", "assistant": "<|assistant|>\n"}
    template = "[gMASK]<sop>" + chat_template(roles, "<|begin_of_image|><|image|><|end_of_image|>", "",
                                              "<|assistant|>\n")  # fmt: skip
    _save_processor(out, "Glm4vProcessor", image_processor, tok, template)


def _mllama(out: Path) -> None:
    """Mllama (Llama 3.2 Vision): the image enters through cross-attention layers, not the token
    sequence; ``<|image|>`` is one token per image, the tower sees tiles and aspect-ratio ids."""
    t = require("transformers")
    specials = ["<|image|>", "<|python_tag|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = byte_tokenizer(specials, bos="<|begin_of_text|>", eos="<|eot_id|>", pad="<|finetune_right_pad_id|>")
    ids = tok.convert_tokens_to_ids
    vision = {"hidden_size": HIDDEN, "num_hidden_layers": 2, "num_global_layers": 1, "attention_heads": 2,
              "intermediate_size": 2 * HIDDEN, "vision_output_dim": 2 * HIDDEN, "image_size": 28, "patch_size": 14,
              "max_num_tiles": 1, "intermediate_layers_indices": [0], "supported_aspect_ratios": [[1, 1]]}  # fmt: skip
    text = _llama(len(tok), bos_token_id=ids("<|begin_of_text|>"), eos_token_id=ids("<|eot_id|>"),
                  pad_token_id=ids("<|finetune_right_pad_id|>"), cross_attention_layers=[1])  # fmt: skip
    config = t.MllamaConfig(vision_config=vision, text_config=text, image_token_index=ids("<|image|>"))
    t.MllamaForConditionalGeneration(config).save_pretrained(out)
    from transformers.models.mllama.image_processing_pil_mllama import MllamaImageProcessorPil

    image_processor = MllamaImageProcessorPil(size={"height": 28, "width": 28}, max_image_tiles=1)
    roles = {r: f"<|start_header_id|>{r}<|end_header_id|>\n\n" for r in ("system", "user", "assistant")}
    template = "<|begin_of_text|>" + chat_template(roles, "<|image|>", "<|eot_id|>",
                                                   "<|start_header_id|>assistant<|end_header_id|>\n\n")  # fmt: skip
    t.MllamaProcessor(image_processor=image_processor, tokenizer=tok, chat_template=template).save_pretrained(out)


def _aya_vision(out: Path) -> None:
    """Aya Vision: SigLIP tower, Cohere2 text, GOT-OCR2 tiling; ``<image>`` expands to a start
    marker, per-tile ``TILE_i`` tokens and patch tokens, a global tile and an end marker."""
    t = require("transformers")
    specials = ["<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|USER_TOKEN|>",
                "<|CHATBOT_TOKEN|>", "<image>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>",
                "<|IMG_LINE_BREAK|>", "TILE", "TILE_GLOBAL", "TILE_1", "TILE_2"]  # fmt: skip
    tok = byte_tokenizer(specials, bos="<BOS_TOKEN>", eos="<|END_OF_TURN_TOKEN|>", pad="<PAD>")
    ids = tok.convert_tokens_to_ids
    text = t.Cohere2Config(**_llama(len(tok), bos_token_id=ids("<BOS_TOKEN>"), pad_token_id=ids("<PAD>"),
                                    eos_token_id=ids("<|END_OF_TURN_TOKEN|>"), sliding_window=64,
                                    layer_types=["sliding_attention", "full_attention"]))  # fmt: skip
    # 28-pixel tiles of 2x2 patches, pixel-shuffled by 2: one token a tile
    config = t.AyaVisionConfig(vision_config=_siglip_vision(t), text_config=text,
                               image_token_index=ids("<|IMG_PATCH|>"), downsample_factor=2,
                               vision_feature_select_strategy="full", vision_feature_layer=-1)  # fmt: skip
    config.pad_token_id = ids("<PAD>")
    t.AyaVisionForConditionalGeneration(config).save_pretrained(out)
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    image_processor = GotOcr2ImageProcessorPil(size={"height": 28, "width": 28}, crop_to_patches=True, min_patches=1,
                                               max_patches=2)  # fmt: skip
    roles = {"system": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "user": "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>",
             "assistant": "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"}  # fmt: skip
    template = chat_template(roles, "<image>", "<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
    t.AyaVisionProcessor(image_processor=image_processor, tokenizer=tok, patch_size=14, img_size=28,
                         downsample_factor=2, chat_template=template).save_pretrained(out)  # fmt: skip


def _janus(out: Path) -> None:
    """Janus: a SigLIP-style understanding tower and a VQ-VAE image generator in one model; an
    image is ``<begin_of_image>`` + ``num_image_tokens`` placeholders + ``<end_of_image>``."""
    t = require("transformers")
    named = {"image_token": "<image_placeholder>", "boi_token": "<begin_of_image>", "eoi_token": "<end_of_image>"}
    tok = byte_tokenizer(["<|User|>", "<|Assistant|>"], bos="<|begin_of_sentence|>", eos="<|end_of_sentence|>",
                         pad="<|pad|>", named=named)  # fmt: skip
    ids = tok.convert_tokens_to_ids
    text = _llama(len(tok), bos_token_id=ids("<|begin_of_sentence|>"), eos_token_id=ids("<|end_of_sentence|>"),
                  pad_token_id=ids("<|pad|>"))  # fmt: skip
    vision = {"hidden_size": HIDDEN, "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 28,
              "patch_size": 14, "mlp_ratio": 2, "projection_dim": HIDDEN, "depth": 1,
              "num_image_tokens": 4}  # fmt: skip
    # the VQ-VAE's GroupNorm takes channels in multiples of 32
    vq = {"embed_dim": 8, "num_embeddings": 16, "latent_channels": 32, "base_channels": 32,
          "channel_multiplier": [1, 1], "num_res_blocks": 1, "projection_dim": HIDDEN, "image_token_embed_dim": HIDDEN,
          "num_hidden_layers": 1}  # fmt: skip
    config = t.JanusConfig(text_config=text, vision_config=vision, vq_config=vq,
                           image_token_id=ids("<image_placeholder>"))  # fmt: skip
    config.pad_token_id = ids("<|pad|>")
    t.JanusForConditionalGeneration(config).save_pretrained(out)
    from transformers.models.janus.image_processing_pil_janus import JanusImageProcessorPil

    image_processor = JanusImageProcessorPil(size={"height": 28, "width": 28})
    template = chat_template({"system": "", "user": "<|User|>: ", "assistant": "<|Assistant|>: "},
                             "<image_placeholder>\n", "\n\n", "<|Assistant|>:")  # fmt: skip
    t.JanusProcessor(image_processor=image_processor, tokenizer=tok, num_image_tokens=4,
                     chat_template=template).save_pretrained(out)  # fmt: skip


_PLAIN = PLAIN_TEMPLATE
"""The families below are prompted with plain text: their hub repositories hold no chat template
(or one their processor class does not read); saved here as the directory's template."""


def _instructblip(out: Path) -> None:
    """InstructBLIP: BLIP-2's Q-Former, which also reads the prompt (its own tokenizer, saved in
    ``qformer_tokenizer/``); Llama text; one image a request; its processor drops the saved template."""
    t = require("transformers")
    tok = byte_tokenizer(["<image>"], bos="<s>", eos="</s>", pad="<pad>")
    qformer_tok = byte_tokenizer([], bos="[CLS]", eos="[SEP]", pad="[PAD]")
    ids = tok.convert_tokens_to_ids
    vision = {"hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_hidden_layers": 2,
              "num_attention_heads": 2, "image_size": 28, "patch_size": 14}  # fmt: skip
    qformer = {"hidden_size": HIDDEN, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 2 * HIDDEN,
               "encoder_hidden_size": HIDDEN, "vocab_size": len(qformer_tok),
               "pad_token_id": qformer_tok.pad_token_id}  # fmt: skip
    text = t.LlamaConfig(**_llama(len(tok), bos_token_id=ids("<s>"), eos_token_id=ids("</s>"),
                                  pad_token_id=ids("<pad>")))  # fmt: skip
    config = t.InstructBlipConfig(vision_config=vision, qformer_config=qformer, text_config=text.to_dict(),
                                  num_query_tokens=4, image_token_index=ids("<image>"))  # fmt: skip
    t.InstructBlipForConditionalGeneration(config).save_pretrained(out)
    from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil

    image_processor = BlipImageProcessorPil(size={"height": 28, "width": 28})
    t.InstructBlipProcessor(image_processor=image_processor, tokenizer=tok, qformer_tokenizer=qformer_tok,
                            num_query_tokens=4).save_pretrained(out)  # fmt: skip
    (out / "chat_template.jinja").write_text(_PLAIN, encoding="utf-8")


def _kosmos2(out: Path) -> None:
    """Kosmos-2: its processor puts ``<image>``, 64 image-embedding slots (ids after ``<unk>``)
    and ``</image>`` before the text, and adds its grounding and patch-index tokens to the
    tokenizer; one image a request, no image token id; its processor drops the saved template."""
    t = require("transformers")
    tok = byte_tokenizer([], bos="<s>", eos="</s>", pad="<pad>", unk="<unk>")
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    processor = t.Kosmos2Processor(image_processor=image_processor, tokenizer=tok, num_patch_index_tokens=16)
    ids = tok.convert_tokens_to_ids
    # The 64 slots are ids unk+1 ... unk+64 (placeholders; their embeddings are replaced by the
    # image's): the table must hold them, as the hub model's 65k-token vocabulary does.
    # Positions must exceed the pad id (the sinusoidal table zeroes the pad row).
    text = {"vocab_size": len(tok) + 64, "embed_dim": HIDDEN, "layers": 2, "ffn_dim": 2 * HIDDEN,
            "attention_heads": 2, "max_position_embeddings": 512, "bos_token_id": ids("<s>"),
            "eos_token_id": ids("</s>"), "pad_token_id": ids("<pad>")}  # fmt: skip
    vision = {"hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_hidden_layers": 2,
              "num_attention_heads": 2, "image_size": 28, "patch_size": 14}  # fmt: skip
    config = t.Kosmos2Config(text_config=text, vision_config=vision, latent_query_num=64)
    t.Kosmos2ForConditionalGeneration(config).save_pretrained(out)
    processor.save_pretrained(out)
    (out / "chat_template.jinja").write_text(_PLAIN, encoding="utf-8")


def _florence2(out: Path) -> None:
    """Florence-2: a DaViT tower and a BART encoder-decoder (``generate`` returns decoder tokens
    only, not the prompt); its processor rewrites task tokens (``<CAPTION>``) into questions and
    wraps the prompt in ``image_seq_length`` image tokens; one image a request; drops the template."""
    t = require("transformers")
    tok = byte_tokenizer([], bos="<s>", eos="</s>", pad="<pad>", named={"image_token": "<image>"})
    ids = tok.convert_tokens_to_ids
    text = t.BartConfig(vocab_size=len(tok), d_model=HIDDEN, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=2 * HIDDEN,
                        decoder_ffn_dim=2 * HIDDEN, max_position_embeddings=256, bos_token_id=ids("<s>"),
                        eos_token_id=ids("</s>"), pad_token_id=ids("<pad>"), decoder_start_token_id=ids("</s>"),
                        forced_eos_token_id=None)  # fmt: skip
    # 28 pixels, strides 4 and 2: a 4x4 grid, plus one pooled token = 17 image tokens
    vision = {"depths": [1, 1], "patch_size": [7, 3], "patch_stride": [4, 2], "patch_padding": [3, 1],
              "patch_prenorm": [False, True], "embed_dim": [16, 32], "num_heads": [2, 2], "num_groups": [2, 2],
              "window_size": 2, "projection_dim": HIDDEN, "max_position_embeddings": 8,
              "max_temporal_embeddings": 2}  # fmt: skip
    # untied: a random tied head repeats its input token, here the decoder start (end-of-sequence)
    config = t.Florence2Config(text_config=text, vision_config=vision, image_token_id=ids("<image>"),
                               tie_word_embeddings=False)  # fmt: skip
    t.Florence2ForConditionalGeneration(config).save_pretrained(out)
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    image_processor = CLIPImageProcessorPil(size={"height": 28, "width": 28}, do_center_crop=False)
    image_processor.image_seq_length = 17  # type: ignore[attr-defined]  # Florence-2's processor reads it
    t.Florence2Processor(image_processor=image_processor, tokenizer=tok).save_pretrained(out)
    (out / "chat_template.jinja").write_text(_PLAIN, encoding="utf-8")


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
    "llava_next": _llava_next,
    "qwen3_vl": _qwen3_vl,
    "glm4v": _glm4v,
    "mllama": _mllama,
    "aya_vision": _aya_vision,
    "janus": _janus,
    "instructblip": _instructblip,
    "kosmos2": _kosmos2,
    "florence2": _florence2,
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
