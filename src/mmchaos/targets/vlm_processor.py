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
import inspect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmchaos._lazy import require
from mmchaos.errors import TargetLoadError
from mmchaos.targets.generation import Message

__all__ = [
    "PLAIN_TEMPLATE",
    "encode",
    "expected_prompt_tokens",
    "load_processor",
    "needs_image",
    "processor_facts",
    "render_chat",
    "use_plain_prompts",
]

PLAIN_TEMPLATE = (
    "{%- for m in messages -%}{%- if not loop.first -%} {% endif -%}"
    "{%- if m['content'] is string -%}{{ m['content'] }}"
    "{%- else -%}{%- for p in m['content'] -%}{%- if p['type'] == 'text' -%}{{ p['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{%- endfor -%}"
)
"""The plain-text prompt form: the turns' text joined by spaces, no role tags, no image
placeholder (the processors of the families prompted this way put the image in themselves)."""

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
        return with_saved_template(transformers.AutoProcessor.from_pretrained(str(path), **kwargs), path)
    except Exception as exc:
        first = exc
    second = ""
    if importlib.util.find_spec("torchvision") is None:
        try:
            return with_saved_template(_processor_without_video(path, transformers, kwargs), path)
        except TargetLoadError:
            pass  # not a processor with a video part: the first error is the one to tell
        except Exception as exc:  # the family's processor refuses to build (a missing package, ...)
            second = f"; built without its video part: {type(exc).__name__}: {_one_line(exc)}"
    if not second and "torchvision" in str(first).lower() and importlib.util.find_spec("torchvision") is None:
        raise TargetLoadError(
            f"cannot load the processor of {path}: its image processor needs torchvision, which is not installed "
            f"(transformers has no PIL version of it); install the torchvision build that matches torch "
            f"{_torch_version()} to test this family",
            code="missing_dependency",
        ) from None
    raise TargetLoadError(f"cannot load the processor of {path}: {_one_line(first)}{second}") from None


def _torch_version() -> str:
    try:
        return str(require("torch").__version__)
    except Exception:  # torch is there whenever a processor is loaded; the message must not fail
        return "(not installed)"


def saved_template(path: Path) -> str | None:
    """The chat template saved in ``path`` (``chat_template.jinja``, else ``chat_template.json``)."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        text = (path / "chat_template.jinja").read_text(encoding="utf-8")
        if text.strip():
            return text
    with contextlib.suppress(OSError, ValueError, AttributeError):
        value = json.loads((path / "chat_template.json").read_text(encoding="utf-8")).get("chat_template")
        if isinstance(value, str) and value.strip():
            return value
    return None


def with_saved_template(processor: Any, path: Path) -> Any:
    """``processor`` with the chat template saved beside it where it came back without one: some
    processor classes (BLIP-2, InstructBLIP, Kosmos-2, Florence-2 in transformers 5) do not read
    the template file their directory holds, though it is the model's."""
    if not getattr(processor, "chat_template", None):
        template = saved_template(path)
        if template is not None:
            with contextlib.suppress(AttributeError):
                processor.chat_template = template
                # recorded in the run (describe()): the prompt form is the directory's, not the processor's
                processor._mmchaos_template_source = "directory (its processor class does not read it)"
    return processor


def use_plain_prompts(processor: Any) -> Any:
    """``processor`` rendering every request in the plain-text prompt form (``prompt_form: plain``),
    whatever template it or its directory holds: how Kosmos-2 and Florence-2 are prompted."""
    processor.chat_template = PLAIN_TEMPLATE
    processor._mmchaos_template_source = "plain text (prompt_form: plain): each request's text, no template"
    return processor


def _processor_without_video(path: Path, transformers: Any, kwargs: dict[str, Any]) -> Any:
    saved: dict[str, Any] = {}
    for name in ("preprocessor_config.json", "processor_config.json"):  # the processor's own keys win
        with contextlib.suppress(OSError, ValueError):
            saved.update(json.loads((path / name).read_text(encoding="utf-8")))
    base = getattr(transformers, str(saved.get("processor_class", "")), None)
    if base is None or "video_processor" not in base.get_attributes():
        raise TargetLoadError(f"no known processor class in {path}")
    template_file = path / "chat_template.jinja"
    template = template_file.read_text(encoding="utf-8") if template_file.is_file() else None
    return images_only(base)(
        image_processor=transformers.AutoImageProcessor.from_pretrained(str(path), **kwargs),
        tokenizer=transformers.AutoTokenizer.from_pretrained(str(path), **kwargs),
        video_processor=None,
        chat_template=template,
        **processor_init_keys(base, path),
    )


def processor_init_keys(base: Any, path: Path) -> dict[str, Any]:
    """Every key of ``path``'s ``processor_config.json`` that ``base``'s constructor names (its
    image-token count, feature strategy, image token...), as ``from_pretrained`` would pass them.

    Only the keys the constructor names: the file also holds keys the processor class writes for
    itself (``processor_class``) or its parts' settings, which the constructor would reject.
    """
    try:
        saved = json.loads((path / "processor_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    own = {"image_processor", "tokenizer", "video_processor", "chat_template", "self"}
    named = set(inspect.signature(base.__init__).parameters) - own
    return {k: v for k, v in saved.items() if k in named} if isinstance(saved, dict) else {}


class _NoVideoProcessor:
    """Stands where a processor reads its video processor when it was built without one: the
    family's own code reads its defaults (SmolVLM2's ``apply_chat_template`` reads ``num_frames``
    and ``fps`` for every chat, video or not), and a video request gets a one-line refusal."""

    num_frames = None
    fps = None
    model_input_names: tuple[str, ...] = ()
    _auto_class = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("videos need torchvision, which is not installed (this processor was built for images only)")


def images_only(base: Any) -> Any:
    """``base`` (a processor class with a video part) as built with ``video_processor=None``."""

    class ImagesOnly(base):  # type: ignore[misc]
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

        @property
        def video_processor(self) -> Any:
            return self.__dict__.get("video_processor") or _NoVideoProcessor()

        @video_processor.setter
        def video_processor(self, value: Any) -> None:
            self.__dict__["video_processor"] = value

    ImagesOnly.images_only_of = base.__name__
    return ImagesOnly


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


def needs_image(processor: Any) -> bool:
    """Whether ``processor`` refuses text without an image (PaliGemma's demands one with every
    prompt) while its tokenizer takes the text: such a processor's text-only requests are encoded
    by the tokenizer alone, as the family's text-only prompts are. Decided once per processor."""
    known = getattr(processor, "_mmchaos_needs_image", None)
    if isinstance(known, bool):
        return known
    try:
        processor(text=["a"], return_tensors="np")
        answer = False
    except Exception:  # processors raise ValueError, TypeError, ...: the tokenizer decides below
        tokenizer = getattr(processor, "tokenizer", None)
        try:
            answer = tokenizer is not None and bool(len(tokenizer(["a"])["input_ids"][0]))
        except Exception:
            answer = False
    with contextlib.suppress(AttributeError):
        processor._mmchaos_needs_image = answer
    return answer


def encode(processor: Any, texts: Sequence[str], images: Sequence[Sequence[Any]], **kwargs: Any) -> Any:
    """The processor's model inputs for rendered ``texts`` with their ``images`` (one list per text):
    image placeholders expanded; text-only batches through the tokenizer where the processor
    demands an image (:func:`needs_image`)."""
    if any(images):
        return processor(text=list(texts), images=[list(i) for i in images], **kwargs)
    if needs_image(processor):
        return processor.tokenizer(list(texts), **kwargs)
    return processor(text=list(texts), **kwargs)


def expected_prompt_tokens(processor: Any, messages: Sequence[Message]) -> int:
    """How many prompt tokens ``processor`` makes of ``messages``: template rendered, images expanded."""
    text = render_chat(processor, messages)
    pictures = [img for m in messages for img in m.images()]
    batch = encode(processor, [text], [pictures], return_tensors="np")
    return int(batch["input_ids"].shape[1])
