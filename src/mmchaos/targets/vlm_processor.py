"""A VLM's processor and chat template on their own: loading, rendering, and the facts that must
agree between what is served and the model directory.

A served VLM can run its weights with another directory's processor or chat template (a serving
image with its own ``preprocessor_config.json``, a ``--chat-template`` flag, an export that rewrote
them): the image is then cut into a different number of tokens, or the prompt wrapped in other role
tags, and the model answers worse without an error. :func:`processor_facts` names what decides that
(image token, image size, patch size, number of image tokens, the chat template's hash), and
:func:`expected_prompt_tokens` counts what the directory's own processor makes of a request, to
compare with the ``prompt_tokens`` a server reports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmchaos._lazy import require
from mmchaos.errors import TargetLoadError
from mmchaos.targets.generation import Message

__all__ = ["expected_prompt_tokens", "load_processor", "processor_facts", "render_chat"]

# Processor and image-processor attributes that decide how an image becomes tokens.
_PROCESSOR_KEYS = (
    "image_token", "patch_size", "num_additional_image_tokens", "vision_feature_select_strategy",
    "image_seq_length", "image_seq_len", "num_image_tokens",
)  # fmt: skip
_IMAGE_KEYS = ("size", "crop_size", "patch_size", "merge_size", "min_pixels", "max_pixels", "max_image_size",
               "do_image_splitting", "do_resize", "do_center_crop")  # fmt: skip


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_processor(path: Path, trust_remote_code: bool = False) -> Any:
    """The processor saved in ``path`` (tokenizer, image processor, chat template), loaded locally.

    Processors with a video part (Qwen2-VL, SmolVLM2) cannot be built by transformers when
    torchvision is absent, even for images only; then the same class is built without its video part.
    """
    transformers = require("transformers")
    kwargs = {"trust_remote_code": trust_remote_code, "local_files_only": True}
    try:
        return transformers.AutoProcessor.from_pretrained(str(path), **kwargs)
    except Exception as exc:
        first = exc
    if importlib.util.find_spec("torchvision") is None:
        with contextlib.suppress(Exception):
            return _processor_without_video(path, transformers, kwargs)
    raise TargetLoadError(f"cannot load the processor of {path}: {_one_line(first)}") from None


def _processor_without_video(path: Path, transformers: Any, kwargs: dict[str, Any]) -> Any:
    saved = {}
    for name in ("processor_config.json", "preprocessor_config.json"):
        with contextlib.suppress(OSError, ValueError):
            saved.update(json.loads((path / name).read_text(encoding="utf-8")))
    base = getattr(transformers, str(saved.get("processor_class", "")), None)
    if base is None or "video_processor" not in base.get_attributes():
        raise TargetLoadError(f"no known processor class in {path}")

    class _ImagesOnly(base):  # type: ignore[misc, valid-type]
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    template_file = path / "chat_template.jinja"
    template = template_file.read_text(encoding="utf-8") if template_file.is_file() else None
    extra = {k: v for k, v in saved.items() if k in ("image_seq_len", "patch_size", "num_additional_image_tokens")}
    return _ImagesOnly(
        image_processor=transformers.AutoImageProcessor.from_pretrained(str(path), **kwargs),
        tokenizer=transformers.AutoTokenizer.from_pretrained(str(path), **kwargs),
        video_processor=None,
        chat_template=template,
        **extra,
    )


def render_chat(processor: Any, messages: Sequence[Message]) -> str:
    """The prompt text ``processor``'s chat template makes of ``messages`` (before image expansion)."""
    chat = []
    for m in messages:
        parts: list[dict[str, str]] = [
            {"type": "text", "text": p} if isinstance(p, str) else {"type": "image"} for p in m.parts()
        ]
        chat.append({"role": m.role, "content": parts})
    return str(processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))


def _plain(value: Any) -> Any:
    """A JSON-able copy of a processor attribute (SizeDict and the like become dicts)."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items() if v is not None}
    if isinstance(value, dict) or hasattr(value, "keys"):
        with contextlib.suppress(Exception):
            return {str(k): _plain(value[k]) for k in value.keys() if value[k] is not None}  # noqa: SIM118
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def processor_facts(processor: Any) -> dict[str, Any]:
    """What decides how a request becomes tokens: image token, sizes, patching, image-token count
    settings (the processor's and its image processor's), and the chat template's sha256 (16 hex)."""
    facts: dict[str, Any] = {}
    for key in _PROCESSOR_KEYS:
        value = getattr(processor, key, None)
        if value is not None:
            facts[key] = _plain(value)
    image_processor = getattr(processor, "image_processor", None)
    for key in _IMAGE_KEYS:
        value = getattr(image_processor, key, None)
        if value is not None:
            facts[f"image_processor.{key}"] = _plain(value)
    template = getattr(processor, "chat_template", None) or getattr(
        getattr(processor, "tokenizer", None), "chat_template", None
    )
    if isinstance(template, str):
        facts["chat_template_sha256"] = hashlib.sha256(template.encode()).hexdigest()[:16]
    return facts


def expected_prompt_tokens(processor: Any, messages: Sequence[Message]) -> int:
    """How many prompt tokens ``processor`` makes of ``messages``: template rendered, images expanded."""
    text = render_chat(processor, messages)
    pictures = [img for m in messages for img in m.images()]
    if pictures:
        batch = processor(text=[text], images=[pictures], return_tensors="np")
    else:
        batch = processor(text=[text], return_tensors="np")
    return int(batch["input_ids"].shape[1])
