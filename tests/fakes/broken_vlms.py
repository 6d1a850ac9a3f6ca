"""Deliberately broken generative VLMs, each with one real bug, around real tiny VLMs.

Each wraps (or subclasses) a genuine ``hf:`` tiny VLM built from config, so everything but the one
bug runs the family's real processor, chat template and ``generate``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmchaos.errors import TargetCallError
from mmchaos.targets.base import ImageArray
from mmchaos.targets.generation import GenerationParams, GenerationResult, Message, as_messages
from mmchaos.targets.hf_vlm import HFVisionLanguageTarget
from mmchaos.targets.wrappers import DelegatingTarget

__all__ = [
    "BatchBiasedVLM",
    "FirstImageOnlyVLM",
    "ImageKeyedCacheVLM",
    "NoLogprobs",
    "OneImageBlindVLM",
    "OneImageVLM",
    "TextKeyedCacheVLM",
    "TruncatingLlava",
    "overflow_in_fp16",
    "shrink_context",
]


def _text_of(messages: Sequence[Message]) -> str:
    return "\x00".join(f"{m.role}:" + "".join(p for p in m.parts() if isinstance(p, str)) for m in messages)


class TextKeyedCacheVLM(DelegatingTarget):
    """A response cache keyed on the request's text alone: the second image under the same
    question gets the first image's answer (the prefix-cache bug class)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.cache: dict[tuple[str, GenerationParams | None], GenerationResult] = {}

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[ImageArray] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        key = (_text_of(as_messages(prompt, images)), params)
        if key not in self.cache:
            self.cache[key] = super().generate(prompt, images, params)
        return self.cache[key]


class FirstImageOnlyVLM(DelegatingTarget):
    """Answers every turn of a chat about the chat's first image (stale per-conversation features)."""

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[ImageArray] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        messages = as_messages(prompt, images)
        pictures = [img for m in messages for img in m.images()]
        if len(pictures) > 1:
            first = pictures[0]
            messages = [
                Message(
                    m.role,
                    m.content
                    if isinstance(m.content, str)
                    else tuple(p if isinstance(p, str) else first for p in m.content),
                )
                for m in messages
            ]
        return super().generate(messages, (), params)


class OneImageVLM(DelegatingTarget):
    """Keeps only a request's first image and drops the others silently (as a server with a
    one-image limit that truncates instead of refusing)."""

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[ImageArray] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        messages = as_messages(prompt, images)
        kept: list[Message] = []
        seen = 0
        for m in messages:
            parts = []
            for part in m.parts():
                if not isinstance(part, str):
                    seen += 1
                    if seen > 1:
                        continue
                parts.append(part)
            kept.append(Message(m.role, tuple(parts) if not isinstance(m.content, str) else m.content))
        return super().generate(kept, (), params)


class OneImageBlindVLM(DelegatingTarget):
    """Refuses a second image with a typed error, as a one-image model should, but answers the one
    image it takes without it (a request parser that drops the image part)."""

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[ImageArray] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        messages = as_messages(prompt, images)
        if sum(len(m.images()) for m in messages) > 1:
            raise TargetCallError("this model takes one image per request", code="processor_refused")
        text_only = [Message(m.role, "".join(p for p in m.parts() if isinstance(p, str))) for m in messages]
        return super().generate(text_only, (), params)


class _BatchBias:
    """A logits processor that shifts scores by an amount that grows with the batch size."""

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        rows = int(scores.shape[0])
        if rows == 1:
            return scores
        bias = scores.new_zeros(scores.shape[-1])
        bias[(7 * rows) % scores.shape[-1]] = 50.0  # a batch-size-dependent token wins greedy decoding
        return scores + bias


class BatchBiasedVLM(HFVisionLanguageTarget):
    """A real tiny VLM whose logits depend on how many requests share its batch."""

    def _generate_kwargs(self, params: GenerationParams, prompt_len: int) -> dict[str, Any]:
        kwargs = super()._generate_kwargs(params, prompt_len)
        kwargs["logits_processor"] = [_BatchBias()]
        return kwargs


def shrink_context(path: Path, positions: int) -> Path:
    """Give a tiny VLM directory ``positions`` context positions (rotary models have no position
    table, so only the config changes): a few images then fill the context."""
    config_file = path / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    for holder in (config, config.get("text_config") or {}):
        if "max_position_embeddings" in holder or holder is config.get("text_config"):
            holder["max_position_embeddings"] = positions
    config_file.write_text(json.dumps(config), encoding="utf-8")
    return path


class TruncatingLlava(HFVisionLanguageTarget):
    """LLaVA that truncates an over-long prompt to fit, cutting through image tokens and dropping
    the images whose tokens were cut, without a word (the silent truncation bug)."""

    reserve = 8  # positions left for generated tokens

    def _check_context(self, prompt_len: int, params: GenerationParams) -> None:
        return None  # the bug: no refusal, the prompt is cut instead (below)

    def build_inputs(self, prompt: str | Sequence[Message], images: Sequence[ImageArray] = ()) -> dict[str, Any]:
        inputs = super().build_inputs(prompt, images)
        keep = (self.context_tokens or 0) - self.reserve
        ids = inputs["input_ids"]
        if keep <= 0 or ids.shape[1] <= keep or self.image_token_id is None:
            return inputs
        per_image = int((ids == self.image_token_id).sum().item()) // max(int(inputs["pixel_values"].shape[0]), 1)
        ids = ids[:, :keep]
        left = int((ids == self.image_token_id).sum().item())
        whole = left // per_image if per_image else 0
        cut = left - whole * per_image  # tokens of a partly cut image: at the end of what is kept
        keep -= cut
        inputs["input_ids"] = inputs["input_ids"][:, :keep]
        inputs["attention_mask"] = inputs["attention_mask"][:, :keep]
        if whole:
            inputs["pixel_values"] = inputs["pixel_values"][:whole]
        else:
            inputs.pop("pixel_values")
        return inputs


def overflow_in_fp16(path: Path, scale: float = 1e7) -> str:
    """Scale the last language layer's MLP output weights of a tiny VLM directory past fp16's
    range (65504): fp32 stays finite (the next RMSNorm rescales the residual), fp16 gets Inf.
    Returns the scaled weight's name."""
    import torch
    from safetensors.torch import load_file, save_file

    weights_file = path / "model.safetensors"
    weights = load_file(str(weights_file))
    names = sorted(n for n in weights if "layers." in n and n.endswith("mlp.down_proj.weight") and "vision" not in n)
    name = names[-1]
    weights[name] = (weights[name].to(torch.float32) * scale).contiguous()
    save_file(weights, str(weights_file), metadata={"format": "pt"})
    return name


class ImageKeyedCacheVLM(DelegatingTarget):
    """A response cache keyed on the request's images alone: a second question about the same
    picture gets the first question's answer."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.cache: dict[bytes, GenerationResult] = {}

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[ImageArray] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        key = b"".join(img.tobytes() for m in as_messages(prompt, images) for img in m.images())
        if key not in self.cache:
            self.cache[key] = super().generate(prompt, images, params)
        return self.cache[key]


class NoLogprobs(DelegatingTarget):
    """An endpoint that returns text and tokens but no logprobs (servers that refuse ``logprobs``)."""

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[ImageArray] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        result = super().generate(prompt, images, params)
        completions = tuple(dataclasses.replace(c, logprobs=None) for c in result.completions)
        return dataclasses.replace(result, completions=completions)
