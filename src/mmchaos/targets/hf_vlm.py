"""``hf:<path>`` for generative vision-language models (LLaVA, Qwen2-VL/2.5-VL, Idefics3/SmolVLM, ...).

The model is whatever ``AutoModelForImageTextToText`` maps its config to, with the processor and
chat template saved next to it: a request is rendered by the chat template, the processor expands
each image placeholder into the image tokens, and the model's own ``generate`` answers. Those are
the code paths a deployment runs, so they are the ones mmchaos tests.

Loading is local only, safetensors by default, no repository code unless ``trust_remote_code``;
a weight the checkpoint lacks (newly initialised at load) is a refusal, not a silently different
model. Every refusal is a one-line :class:`~mmchaos.errors.TargetLoadError`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import threading
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from mmchaos._lazy import require
from mmchaos.errors import TargetCallError, TargetLoadError
from mmchaos.targets.base import Capability, Fingerprint, ImageArray, Target
from mmchaos.targets.generation import (
    Completion,
    FinishReason,
    GenerationParams,
    GenerationResult,
    Message,
    StreamUsage,
    as_messages,
    cut_at_stop,
)
from mmchaos.targets.hub import directory_fingerprint, drop_length_notice, quiet_transformers, read_config
from mmchaos.targets.vlm_processor import encode, load_processor, render_chat, use_plain_prompts

if TYPE_CHECKING:
    from mmchaos.targets.hf_steps import StepBatch, StepDecoder

__all__ = ["HFVisionLanguageTarget", "is_generative_config", "saved_padding_side"]

_GENERATIVE_SUFFIXES = ("ForConditionalGeneration", "ForCausalLM", "ForImageTextToText", "ForVision2Seq")


def _architecture(config: dict[str, Any]) -> str:
    archs = config.get("architectures")
    return str(archs[0]) if isinstance(archs, list) and archs else ""


def _image_text_to_text_names() -> tuple[dict[str, Any], set[str]]:
    names = require("transformers.models.auto.modeling_auto").MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    classes: set[str] = set()
    for value in names.values():
        classes.update(value if isinstance(value, tuple | list) else (value,))
    return dict(names), classes


def is_generative_config(config: dict[str, Any]) -> bool:
    """Whether a model directory's config names a generative architecture (this loader's job)
    rather than a contrastive one (``hf.py``'s): decided from ``architectures``, which names the
    head, since families such as BLIP have both kinds under one ``model_type``."""
    arch = _architecture(config)
    if arch:
        return arch.endswith(_GENERATIVE_SUFFIXES) or arch in _image_text_to_text_names()[1]
    names, _ = _image_text_to_text_names()
    return str(config.get("model_type", "")) in names and "text_config" in config and "vision_config" in config


def saved_padding_side(tokenizer: Any) -> Literal["left", "right"]:
    """The side the tokenizer pads on as saved (``tokenizer_config.json``'s ``padding_side``, else
    the tokenizer class's default, which transformers' generic fast tokenizer has as right)."""
    return "left" if getattr(tokenizer, "padding_side", "right") == "left" else "right"


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def _generate_requires_pixels(model: Any) -> bool:
    try:
        param = inspect.signature(model.generate).parameters.get("pixel_values")
    except (TypeError, ValueError):
        return False
    return param is not None and param.default is inspect.Parameter.empty


def _processor_error(exc: BaseException, what: str) -> TargetCallError:
    """A processor's ValueError is its refusal of the input (``processor_refused``, the request's
    fault); any other exception (TypeError, AttributeError, ...) is the processor failing on a
    request it should take (``processor_failed``, the target's fault: a server answers 500)."""
    if isinstance(exc, ValueError):
        return TargetCallError(f"the processor refused the {what}: {_one_line(exc)}", code="processor_refused")
    return TargetCallError(f"the processor failed on the {what}: {_one_line(exc)}", code="processor_failed")


class _StopOnText:
    """Stops each sequence once its generated text contains a stop string (transformers'
    StoppingCriteria protocol: one bool per row)."""

    def __init__(self, tokenizer: Any, prompt_len: int, stop: Sequence[str]) -> None:
        self.tokenizer, self.prompt_len, self.stop = tokenizer, prompt_len, tuple(stop)

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_len :], skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.stop) for t in texts], device=input_ids.device)


class HFVisionLanguageTarget(Target):
    """A transformers image-text-to-text model with its processor and chat template."""

    capabilities = frozenset({Capability.GENERATE, Capability.TORCH_MODULE, Capability.PREPROCESS})

    def __init__(
        self,
        path: str | Path,
        *,
        uri: str | None = None,
        trust_remote_code: bool = False,
        use_safetensors: bool = True,
        device: str = "cpu",
        prompt_form: Literal["chat_template", "plain"] = "chat_template",
    ) -> None:
        self.torch = require("torch")
        transformers = require("transformers")
        transformers.logging.disable_progress_bar()
        drop_length_notice()
        self.path = Path(path)
        self.uri = uri or f"hf:{path}"
        self.device = device
        config = read_config(self.path)
        self.architecture = _architecture(config) or "<no architectures in config.json>"
        self.model_type = str(config.get("model_type", "?"))
        names, classes = _image_text_to_text_names()
        if self.model_type not in names and self.architecture not in classes:
            raise TargetLoadError(
                f"{self.architecture} (model_type {self.model_type}) at {self.path} is not a vision-language "
                "model mmchaos can generate with (it loads transformers' image-text-to-text families, e.g. "
                "llava, qwen2_vl, qwen2_5_vl, idefics3)",
                code="unsupported_architecture",
            )
        try:
            with quiet_transformers():  # its multi-line missing-weights table is ours to tell, in one line
                model, info = transformers.AutoModelForImageTextToText.from_pretrained(
                    str(self.path),
                    trust_remote_code=trust_remote_code,
                    use_safetensors=use_safetensors,
                    local_files_only=True,
                    output_loading_info=True,
                )
        except Exception as exc:  # transformers raises many types, with multi-KB messages
            hint = " (weights are loaded from safetensors by default)" if use_safetensors else ""
            raise TargetLoadError(f"cannot load {self.architecture} from {self.path}: {_one_line(exc)}{hint}") from None
        missing = sorted(set(info.get("missing_keys") or ()))
        if missing:
            raise TargetLoadError(
                f"{self.architecture} at {self.path}: {len(missing)} weights are not in the checkpoint and would be "
                f"randomly initialised (first: {missing[0]}); refusing to test a different model",
                code="weights_missing",
            )
        self.model = model.eval().to(device)
        self.processor = self._load_processor(trust_remote_code)
        self.tokenizer = self.processor.tokenizer
        if prompt_form == "plain":
            use_plain_prompts(self.processor)
        if not getattr(self.processor, "chat_template", None):
            raise TargetLoadError(
                f"{self.architecture} at {self.path} has no chat template: neither its processor nor the directory "
                "(chat_template.jinja/json) holds one. A family prompted with plain text (Kosmos-2, Florence-2's "
                "task tokens) takes the target option prompt_form: plain (each request's text as the prompt, "
                "recorded in the run), or a template saved with the model",
                code="chat_template_missing",
            )
        self.image_token_id = self._image_token_id()
        self.requires_image = _generate_requires_pixels(self.model)
        """Whether the model's ``generate`` takes no request without an image (BLIP-2's)."""
        positions = getattr(self.model.config.get_text_config(), "max_position_embeddings", None)
        self.context_tokens: int | None = int(positions) if positions else None
        """The model's positions: a prompt plus ``max_new_tokens`` past them is refused, as vLLM does."""
        self.padding_side: Literal["left", "right"] = saved_padding_side(self.tokenizer)
        """Where batched prompts are padded: as the tokenizer was saved, so a batch runs as the
        artefact ships. Decoder-only generation needs left; a tokenizer saved with right padding
        (the LLaVA-NeXT bug class) is reported by ``fingerprint_match`` and shows in
        ``generation_batch_invariance``, never silently overridden here."""
        self._lock = threading.Lock()  # seeded sampling forks the global torch RNG: one call at a time
        self._fingerprint: Fingerprint | None = None

    # -- loading ---------------------------------------------------------------------------------

    def _load_processor(self, trust_remote_code: bool) -> Any:
        return load_processor(self.path, trust_remote_code)

    @functools.cached_property
    def images_per_request(self) -> int | None:
        """How many images one request may carry: 1 where the processor places the image itself,
        once, before the prompt (the rendered chat holds no image placeholder: BLIP-2, InstructBLIP,
        Kosmos-2, Florence-2), whose model drops or crashes on a second one; else no limit here."""
        probe = render_chat(self.processor, [Message("user", (np.zeros((2, 2, 3), np.uint8), "x"))])
        token = self.image_token
        return None if token and token in probe else 1

    @property
    def image_token(self) -> str | None:
        """The processor's image placeholder text (BLIP-2's processor holds it as an ``AddedToken``)."""
        token = getattr(self.processor, "image_token", None)
        token = getattr(token, "content", token)
        return token if isinstance(token, str) and token else None

    def _image_token_id(self) -> int | None:
        """The token the model replaces with image features: its config's (``image_token_id`` or
        ``image_token_index``), else the processor's. They differ on Gemma 3, whose processor's
        ``image_token_id`` is the start-of-image marker (one per image) and not the soft tokens."""
        for key in ("image_token_id", "image_token_index"):
            value = getattr(self.model.config, key, None)
            if isinstance(value, int) and 0 <= value < len(self.tokenizer):
                return value
        token_id = getattr(self.processor, "image_token_id", None)
        if token_id is None:
            token = self.image_token
            token_id = self.tokenizer.convert_tokens_to_ids(token) if token else None
        return int(token_id) if isinstance(token_id, int) else None

    # -- requests --------------------------------------------------------------------------------

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt text the model's chat template makes of ``messages`` (before image expansion)."""
        return render_chat(self.processor, messages)

    def build_inputs(self, prompt: str | Sequence[Message], images: Sequence[ImageArray] = ()) -> dict[str, Any]:
        """The processor's model inputs for a request: chat template, image-token expansion, pixels.

        Mismatched images and placeholders, or images the processor cannot take, are a typed
        refusal (``processor_refused``), never a crash in the model.
        """
        messages = as_messages(prompt, images, max_pixels=self.max_image_pixels)
        text = self.render(messages)
        pictures = [img for m in messages for img in m.images()]
        self._check_placeholders([text], [pictures])
        try:
            batch = encode(self.processor, [text], [pictures], return_tensors="pt")
        except Exception as exc:  # processors raise ValueError, IndexError, TypeError, ...
            raise _processor_error(exc, "request") from None
        return {k: v.to(self.device) if hasattr(v, "to") else v for k, v in batch.items()}

    def _check_placeholders(self, texts: Sequence[str], pictures: Sequence[Sequence[ImageArray]]) -> None:
        """More image placeholders than images (a user who typed one) is the request's fault: refused
        here, before the processor, whose error for it would not say whose fault it is."""
        self._check_image_count(pictures)
        token = self.image_token
        if not token:
            return
        for i, (text, imgs) in enumerate(zip(texts, pictures, strict=True)):
            if text.count(token) > len(imgs):
                where = f"request {i} of {len(texts)}: " if len(texts) > 1 else ""
                raise TargetCallError(
                    f"{where}the prompt has {text.count(token)} image placeholders ({token}) for {len(imgs)} images",
                    code="processor_refused",
                )

    def _check_image_count(self, pictures: Sequence[Sequence[ImageArray]]) -> None:
        """More images than the model takes in one request is the request's fault, refused here:
        the family's model would drop the extra image silently or crash on it."""
        limit = self.images_per_request
        for i, imgs in enumerate(pictures):
            if limit is not None and len(imgs) > limit:
                where = f"request {i} of {len(pictures)}: " if len(pictures) > 1 else ""
                raise TargetCallError(
                    f"{where}{self.architecture} takes one image per request (its processor places the image before "
                    f"the prompt itself); {len(imgs)} were given",
                    code="processor_refused",
                )

    def _output_start(self, prompt_len: int) -> int:
        """Where the generated tokens start in what ``generate`` returns: after the prompt for a
        decoder-only model, after the decoder's start token for an encoder-decoder (Florence-2)."""
        return 1 if getattr(self.model.config, "is_encoder_decoder", False) else prompt_len

    def count_image_tokens(self, inputs: dict[str, Any]) -> int | None:
        """How many image placeholder tokens the processor put into ``inputs`` (None if unknown)."""
        if self.image_token_id is None:
            return None
        return int((inputs["input_ids"] == self.image_token_id).sum().item())

    def _eos_ids(self) -> set[int]:
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return {int(e) for e in (eos if isinstance(eos, list | tuple) else [eos]) if e is not None}

    def _rng(self, seed: int | None) -> Any:
        """A scope whose torch RNG starts at ``seed`` and leaves the process RNG as it was."""
        if seed is None:
            return contextlib.nullcontext()
        devices = [self.torch.device(self.device).index or 0] if self.device.startswith("cuda") else []
        scope = self.torch.random.fork_rng(devices=devices)

        @contextlib.contextmanager
        def seeded() -> Iterator[None]:
            with scope:
                self.torch.manual_seed(seed)
                yield

        return seeded()

    def _check_image_given(self, inputs: dict[str, Any]) -> None:
        """A model whose ``generate`` cannot run without pixels (BLIP-2, InstructBLIP) refuses a
        text-only request as the request's fault (``image_required``), before the model."""
        if self.requires_image and inputs.get("pixel_values") is None:
            raise TargetCallError(
                f"{self.architecture} answers only requests with an image (its generate requires pixel_values)",
                code="image_required",
            )

    def _check_context(self, prompt_len: int, params: GenerationParams) -> None:
        if self.context_tokens is not None and prompt_len + params.max_new_tokens > self.context_tokens:
            raise TargetCallError(
                f"the prompt ({prompt_len} tokens, images expanded) plus max_new_tokens {params.max_new_tokens} "
                f"exceeds the model's {self.context_tokens} positions",
                code="context_exceeded",
            )

    def _generate_kwargs(self, params: GenerationParams, prompt_len: int) -> dict[str, Any]:
        self._check_context(prompt_len, params)
        pad = self.tokenizer.pad_token_id
        kwargs: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens,
            "pad_token_id": pad if pad is not None else next(iter(self._eos_ids()), 0),
        }
        if params.greedy:
            kwargs["do_sample"] = False
        else:
            # top_k=0: no hidden top-k from transformers' defaults; the params say what is sampled.
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0,
                          num_return_sequences=params.n)  # fmt: skip
        if params.stop:
            kwargs["stopping_criteria"] = [_StopOnText(self.tokenizer, self._output_start(prompt_len), params.stop)]
        return kwargs

    def generate(
        self,
        prompt: str | Sequence[Message],
        images: Sequence[ImageArray] = (),
        params: GenerationParams | None = None,
    ) -> GenerationResult:
        params = params or GenerationParams()
        inputs = self.build_inputs(prompt, images)
        prompt_len = int(inputs["input_ids"].shape[1])
        self._check_image_given(inputs)
        kwargs = self._generate_kwargs(params, prompt_len)
        kwargs.update(return_dict_in_generate=True, output_logits=True)
        with self._lock, self._rng(params.seed), self.torch.inference_mode():
            try:
                out = self.model.generate(**inputs, **kwargs)
            except Exception as exc:  # a model crash on this input is a finding, with one line
                raise TargetCallError(f"generate failed: {_one_line(exc)}", code="generate_failed") from None
        rows = self._completions(out, prompt_len, params)
        if params.greedy and params.n > 1:
            rows = rows * params.n  # greedy decoding has one answer; n copies, as vLLM returns
        return GenerationResult(
            completions=tuple(rows), prompt_tokens=prompt_len, extra={"image_tokens": self.count_image_tokens(inputs)}
        )

    def generate_batch(
        self, requests: Sequence[str | Sequence[Message]], params: GenerationParams | None = None
    ) -> list[GenerationResult]:
        """One padded batch through the processor and ``generate`` (``padding_side`` padding)."""
        params = params or GenerationParams()
        if not requests:
            return []
        chats = [as_messages(r, max_pixels=self.max_image_pixels) for r in requests]
        pictures = [[img for m in c for img in m.images()] for c in chats]
        if self.images_per_request == 1 and len({bool(p) for p in pictures}) > 1:
            self._check_image_count(pictures)
            return self._batches_by_image(requests, params, [bool(p) for p in pictures])
        inputs = self._encode_batch(chats, self.padding_side)
        prompt_len = int(inputs["input_ids"].shape[1])
        if len(chats) > 1:  # name the request that does not fit, not the padded batch
            lengths = inputs["attention_mask"].sum(-1)
            longest = int(lengths.argmax())
            try:
                self._check_context(int(lengths[longest]), params)
            except TargetCallError as exc:
                raise TargetCallError(f"request {longest} of {len(chats)}: {exc.message}", code=exc.code) from None
        self._check_image_given(inputs)
        gen_kwargs = self._generate_kwargs(params, prompt_len)
        gen_kwargs.update(return_dict_in_generate=True, output_logits=True)
        with self._lock, self._rng(params.seed), self.torch.inference_mode():
            try:
                out = self.model.generate(**inputs, **gen_kwargs)
            except Exception as exc:
                raise TargetCallError(f"generate failed: {_one_line(exc)}", code="generate_failed") from None
        rows = self._completions(out, prompt_len, params)
        per = 1 if params.greedy else params.n
        results = []
        for i in range(len(chats)):
            mine = rows[i * per : (i + 1) * per] * (params.n if params.greedy else 1)
            ids = inputs["input_ids"][i]
            image_tokens = None if self.image_token_id is None else int((ids == self.image_token_id).sum().item())
            prompt_tokens = int(inputs["attention_mask"][i].sum().item())
            extra: dict[str, object] = {"image_tokens": image_tokens, "batch_size": len(chats)}
            results.append(GenerationResult(tuple(mine), prompt_tokens=prompt_tokens, extra=extra))
        return results

    def _encode_batch(
        self, chats: Sequence[Sequence[Message]], padding_side: str, what: str = "batch"
    ) -> dict[str, Any]:
        """The processor's padded batch of ``chats`` on the model's device, checked as one request is."""
        texts = [self.render(c) for c in chats]
        pictures = [[img for m in c for img in m.images()] for c in chats]
        self._check_placeholders(texts, pictures)
        try:
            batch = encode(self.processor, texts, pictures, padding=True, padding_side=padding_side,
                           return_tensors="pt")  # fmt: skip
        except Exception as exc:
            raise _processor_error(exc, what) from None
        return {k: v.to(self.device) if hasattr(v, "to") else v for k, v in batch.items()}

    # -- step-by-step decoding (continuous batching's model half: mmchaos.targets.hf_steps) -------------

    @functools.cached_property
    def steps_unsupported(self) -> str | None:
        """None when this model decodes step by step as its ``generate`` does; else why not."""
        from mmchaos.targets.hf_steps import steps_supported

        return steps_supported(self.model)

    def step_batch(self) -> StepBatch:
        """An empty :class:`~mmchaos.targets.hf_steps.StepBatch` of this model; a model that cannot
        decode step by step is refused (``steps_unsupported``), and keeps whole-batch ``generate``."""
        from mmchaos.targets.hf_steps import StepBatch

        if self.steps_unsupported is not None:
            raise TargetCallError(f"no step-by-step decoding: {self.steps_unsupported}", code="steps_unsupported")
        return StepBatch(self.model, self.torch, self.device)

    def step_decoder(self) -> StepDecoder | None:
        """Continuous batching's handle on this model (None: it keeps whole-batch ``generate``)."""
        from mmchaos.targets.hf_steps import StepDecoder

        return None if self.steps_unsupported is not None else StepDecoder(self)

    def step_inputs(self, requests: Sequence[str | Sequence[Message]]) -> dict[str, Any]:
        """The left-padded model inputs of joining ``requests`` for :meth:`StepBatch.join`, refused
        as :meth:`generate_batch` refuses them (image count, placeholders, a text-only request to a
        model that needs pixels)."""
        chats = [as_messages(r, max_pixels=self.max_image_pixels) for r in requests]
        inputs = self._encode_batch(chats, "left", "batch" if len(chats) > 1 else "request")
        self._check_image_given(inputs)
        return inputs

    def _batches_by_image(
        self, requests: Sequence[str | Sequence[Message]], params: GenerationParams, has_image: Sequence[bool]
    ) -> list[GenerationResult]:
        """A batch mixing requests with and without an image, for a family whose processor places
        the image itself (Kosmos-2's builds image slots for every row, and the model crashes): one
        padded batch of those with an image, one of those without, answered in the request order."""
        results: list[GenerationResult | None] = [None] * len(requests)
        for wanted in (True, False):
            rows = [i for i, has in enumerate(has_image) if has == wanted]
            try:
                answered = self.generate_batch([requests[i] for i in rows], params)
            except TargetCallError as exc:  # name the request by its place in the whole batch
                where = re.match(r"request (\d+) of \d+: ", exc.message)
                if where is None:
                    raise
                named = f"request {rows[int(where.group(1))]} of {len(requests)}: {exc.message[where.end() :]}"
                raise TargetCallError(named, code=exc.code) from None
            for i, result in zip(rows, answered, strict=True):
                results[i] = result
        return [r for r in results if r is not None]

    def generate_stream(
        self,
        prompt: str | Sequence[Message],
        images: Sequence[ImageArray] = (),
        params: GenerationParams | None = None,
    ) -> Iterator[str]:
        """Text deltas as the model produces them (transformers' TextIteratorStreamer); their
        concatenation equals :meth:`generate`'s text for the same request, stop strings included.
        Read to its end, the stream returns its :class:`StreamUsage` (the tokens ``generate`` counts)."""
        return self._stream(prompt, images, params or GenerationParams())

    def _stream(
        self, prompt: str | Sequence[Message], images: Sequence[ImageArray], params: GenerationParams
    ) -> Generator[str, None, StreamUsage]:
        transformers = require("transformers")
        if params.n != 1:
            raise TargetCallError("streaming gives one completion; use n=1", code="bad_generation_params")
        inputs = self.build_inputs(prompt, images)
        self._check_image_given(inputs)
        prompt_len = int(inputs["input_ids"].shape[1])
        kwargs = self._generate_kwargs(params, prompt_len)
        streamer = transformers.TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        failure: list[BaseException] = []
        sequences: list[Any] = []

        def run() -> None:
            try:
                with self._lock, self._rng(params.seed), self.torch.inference_mode():
                    sequences.append(self.model.generate(**inputs, **kwargs, streamer=streamer))
            except Exception as exc:
                failure.append(exc)
                streamer.end()  # wake the reader

        # The model runs in its own thread; a reader that stops early leaves it to finish its
        # max_new_tokens (bounded) with the lock held, as a server's cancelled request would.
        worker = threading.Thread(target=run, name="mmchaos-hf-stream", daemon=True)
        worker.start()
        held = max((len(s) for s in params.stop), default=1) - 1  # text a stop string may still claim
        text, sent = "", 0
        for delta in streamer:
            text += delta
            cut, hit = cut_at_stop(text, params.stop)
            if hit:
                if len(cut) > sent:
                    yield cut[sent:]
                sent = len(cut)
                break
            safe = len(text) - held
            if safe > sent:
                yield text[sent:safe]
                sent = safe
        else:
            if len(text) > sent:
                yield text[sent:]
        worker.join()  # generation ends by itself: at a stop string, end of sequence or max_new_tokens
        if failure:
            raise TargetCallError(f"generate failed: {_one_line(failure[0])}", code="generate_failed")
        spent = self._spent_tokens(sequences[0], prompt_len, params) if sequences else None
        return StreamUsage(prompt_tokens=prompt_len, completion_tokens=spent)

    def _spent_tokens(self, sequences: Any, prompt_len: int, params: GenerationParams) -> int:
        """The tokens a streamed completion spent, counted as :meth:`_completions` counts them
        (up to and including EOS, or up to the stop string)."""
        ids = [int(t) for t in sequences[0, prompt_len:].tolist()]
        eos = self._eos_ids()
        end = next((i + 1 for i, tok in enumerate(ids) if tok in eos), len(ids))
        ids = ids[:end]
        if params.stop and cut_at_stop(self.tokenizer.decode(ids, skip_special_tokens=True), params.stop)[1]:
            return self._tokens_until_stop(ids, params.stop)
        return len(ids)

    def _completions(self, out: Any, prompt_len: int, params: GenerationParams) -> list[Completion]:
        torch = self.torch
        new = out.sequences[:, self._output_start(prompt_len) :].to("cpu")
        steps = len(out.logits)
        logprobs = None
        tops: list[list[dict[int, float]]] | None = None
        if params.logprobs and steps:
            stacked = torch.stack([s.float() for s in out.logits], dim=1).to("cpu")  # (rows, steps, vocab)
            picked = stacked.log_softmax(-1).gather(-1, new[:, :steps, None].long())[..., 0]
            logprobs = picked.tolist()
            if params.top_logprobs:
                values, ids_k = stacked.log_softmax(-1).topk(params.top_logprobs, dim=-1)
                tops = [
                    [dict(zip(i_row, v_row, strict=True)) for i_row, v_row in zip(ir, vr, strict=True)]
                    for ir, vr in zip(ids_k.tolist(), values.tolist(), strict=True)
                ]
        eos = self._eos_ids()
        rows = []
        for r in range(new.shape[0]):
            ids = [int(t) for t in new[r, :steps].tolist()]
            finish: FinishReason = "length"
            end = len(ids)
            for i, tok in enumerate(ids):
                if tok in eos:
                    end, finish = i + 1, "stop"
                    break
            ids = ids[:end]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            if params.stop:
                text, hit = cut_at_stop(text, params.stop)
                if hit:
                    finish = "stop"
                    end = self._tokens_until_stop(ids, params.stop)
                    ids = ids[:end]
            lp = None if logprobs is None else tuple(float(x) for x in logprobs[r][: len(ids)])
            top = None if tops is None else tuple(tops[r][: len(ids)])
            rows.append(
                Completion(text=text, finish_reason=finish, token_ids=tuple(ids), logprobs=lp, top_logprobs=top)
            )
        return rows

    def _tokens_until_stop(self, ids: list[int], stop: Sequence[str]) -> int:
        """The shortest token prefix whose text contains a stop string (the tokens the model spent)."""
        for k in range(1, len(ids) + 1):
            if cut_at_stop(self.tokenizer.decode(ids[:k], skip_special_tokens=True), stop)[1]:
                return k
        return len(ids)

    # -- the rest of the Target interface ----------------------------------------------------------

    def torch_module(self) -> Any:
        return self.model

    def fingerprint(self) -> Fingerprint:
        if self._fingerprint is None:
            self._fingerprint = directory_fingerprint(self.path)
        return self._fingerprint

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        cls = type(self.processor)
        processor = getattr(cls, "images_only_of", cls.__name__)
        out["model"] = {"architecture": self.architecture, "model_type": self.model_type, "processor": processor,
                        "image_token_id": self.image_token_id, "images_per_request": self.images_per_request,
                        "chat_template": getattr(self.processor, "_mmchaos_template_source", "processor")}  # fmt: skip
        return out
