"""Step-by-step decoding of a transformers VLM, rows joining and leaving: continuous batching's model half.

``generate`` runs a batch from its first token to its last: a request that arrives meanwhile
waits for the whole batch, and a finished row keeps its place until the longest one ends. A
:class:`StepBatch` holds the running rows instead: each joins by its own prefill (prompt and
images through the model once), its KV cache is left-padded into the batch's, and from then on
one forward pass gives every row its next token. A row that ends leaves at once, and cache
columns no remaining row needs are cut.

What makes a joined row decode as ``generate`` decodes it alone:

- **Positions.** Each row's rotary positions count its own tokens (``cumsum(mask) - 1``, as
  ``generate`` makes them from a left-padded mask), not the batch's columns: a row that joined
  late with a short prompt starts at its own length.
- **The mask.** Padding columns are masked for the row they pad, in prefill and in every step.
- **Full attention and 1-D positions only** (:func:`steps_supported`): a sliding-window layer's
  cache is trimmed by its own count, and Qwen2-VL's 3-D rotary positions come from the image
  grid; those families keep whole-batch ``generate``.

The caller samples: :meth:`StepBatch.join` and :meth:`StepBatch.step` return each row's logits
for its next token, in float32 on the CPU. :class:`StepDecoder` is what a server's scheduler
holds of the target: the processor's inputs, the batch, and every forward pass as one model call
of the target (so a wrapper that times, counts or fails model calls sees each step).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mmchaos.errors import TargetCallError

if TYPE_CHECKING:
    from mmchaos.targets.generation import GenerationParams, Message

__all__ = ["STEP_FAMILIES", "StepBatch", "StepDecoder", "steps_supported"]

STEP_FAMILIES = frozenset({"llava", "llava_next", "llava_onevision", "idefics3", "smolvlm", "internvl", "janus"})
"""Model types whose language model takes 1-D positions and full attention over a ``DynamicCache``:
checked family by family against ``generate`` (tests/integration/targets/test_hf_steps.py)."""

_PROCESSOR_SETTINGS = (
    "repetition_penalty",
    "no_repeat_ngram_size",
    "bad_words_ids",
    "begin_suppress_tokens",
    "suppress_tokens",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "min_new_tokens",
    "min_length",
    "encoder_repetition_penalty",
    "sequence_bias",
)
_NEUTRAL: dict[str, Any] = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_length": 0, "min_new_tokens": 0}


def steps_supported(model: Any) -> str | None:
    """None when ``model`` decodes step by step as its ``generate`` does; else why not, in one line."""
    config = model.config
    kind = str(getattr(config, "model_type", ""))
    if kind not in STEP_FAMILIES:
        return f"{kind or type(model).__name__} is not among the families checked to decode step by step"
    if getattr(config, "is_encoder_decoder", False):
        return f"{kind} is an encoder-decoder"
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None) or ()
    if getattr(text, "sliding_window", None) and (not types or any(t != "full_attention" for t in types)):
        return f"{kind}'s language model has sliding-window layers"
    if any(t != "full_attention" for t in types):
        return f"{kind}'s language model has {sorted(set(types) - {'full_attention'})} layers"
    generation = getattr(model, "generation_config", None)
    for name in _PROCESSOR_SETTINGS:
        value = getattr(generation, name, None)
        if value not in (None, _NEUTRAL.get(name), [], ()):
            return f"its generation_config sets {name}={value!r}, a logits processor the steps do not apply"
    return None


def _cache_kwarg(model: Any) -> str:
    """The forward's name for the KV cache: ``cache`` from transformers 5.2x, ``past_key_values`` before."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class StepBatch:
    """The running rows of one model: their KV cache, attention mask and next positions.

    Not thread-safe: one engine thread owns it and calls the model under the target's lock.
    Rows are addressed by their place (0..``len(self) - 1``); :meth:`keep` renumbers them.
    """

    def __init__(self, model: Any, torch: Any, device: str = "cpu") -> None:
        self.model = model
        self.torch = torch
        self.device = device
        self._cache_key = _cache_kwarg(model)
        self.cache: Any = None
        self.mask: Any = None  # (rows, columns) long: 1 where a row has a token
        self.next_pos: Any = None  # (rows,) long: each row's next position

    def __len__(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[0])

    @property
    def columns(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[1])

    def _forward(self, **inputs: Any) -> Any:
        out = self.model(**inputs, use_cache=True, return_dict=True, logits_to_keep=1)
        cache = getattr(out, "cache", None)
        return out.logits[:, -1, :].float().cpu(), cache if cache is not None else out.past_key_values

    @staticmethod
    def positions(mask: Any) -> Any:
        """A left-padded prefill's positions: each row counts its own tokens, padding at 0."""
        return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)

    def join(self, inputs: dict[str, Any]) -> Any:
        """Prefill the left-padded ``inputs`` (the processor's batch of the joining requests) and
        append them as rows; returns their next-token logits ``(joined, vocab)``."""
        torch = self.torch
        mask = inputs["attention_mask"].to(self.device).long()
        logits, cache = self._forward(**{**inputs, "attention_mask": mask, "position_ids": self.positions(mask)})
        next_pos = mask.sum(-1)
        if len(self) == 0:
            self.cache, self.mask, self.next_pos = cache, mask, next_pos
            return logits
        width = max(self.columns, int(mask.shape[1]))
        for old, new in zip(self.cache.layers, cache.layers, strict=True):
            old.keys = torch.cat([_left_pad(torch, old.keys, width, 2), _left_pad(torch, new.keys, width, 2)])
            old.values = torch.cat([_left_pad(torch, old.values, width, 2), _left_pad(torch, new.values, width, 2)])
        self.mask = torch.cat([_left_pad(torch, self.mask, width, 1), _left_pad(torch, mask, width, 1)])
        self.next_pos = torch.cat([self.next_pos, next_pos])
        return logits

    def step(self, tokens: Sequence[int]) -> Any:
        """Feed each row its last sampled token; returns every row's next-token logits ``(rows, vocab)``."""
        torch = self.torch
        if len(tokens) != len(self):
            raise ValueError(f"{len(tokens)} tokens for {len(self)} rows")
        ids = torch.tensor([[int(t)] for t in tokens], dtype=torch.long, device=self.device)
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self), 1))], dim=1)
        logits, self.cache = self._forward(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=self.next_pos[:, None],
            **{self._cache_key: self.cache},
        )
        self.next_pos = self.next_pos + 1
        return logits

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in that order) and cut the leading columns that are padding for all of them."""
        torch = self.torch
        if not rows:
            self.cache = self.mask = self.next_pos = None
            return
        if list(rows) == list(range(len(self))):
            return
        index = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        mask = self.mask.index_select(0, index)
        start = int(mask.any(dim=0).long().argmax())  # the first column some kept row uses
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, start:, :]
            layer.values = layer.values.index_select(0, index)[:, :, start:, :]
        self.mask = mask[:, start:]
        self.next_pos = self.next_pos.index_select(0, index)


def _left_pad(torch: Any, tensor: Any, width: int, dim: int) -> Any:
    """``tensor`` with zeros before its ``dim`` axis up to ``width`` (masked columns)."""
    missing = width - int(tensor.shape[dim])
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _direct(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


@dataclasses.dataclass(frozen=True)
class StepDecoder:
    """A target's step-by-step decoding as a scheduler uses it (:mod:`mmchaos.server.continuous`).

    ``call(fn, *args)`` runs each forward pass: the target's wrappers route it through their own
    ``call`` (:meth:`mmchaos.targets.wrappers.DelegatingTarget.step_decoder`), as they route
    ``generate``. A model that raises is a ``generate_failed`` finding, as in ``generate``.
    """

    target: Any  # the HFVisionLanguageTarget
    call: Callable[..., Any] = _direct

    def routed(self, call: Callable[..., Any]) -> StepDecoder:
        """This decoder with its forward passes run through ``call`` (inside the current one)."""
        inner = self.call

        def routed(fn: Callable[..., Any], *args: Any) -> Any:
            @functools.wraps(fn)  # the outer call sees the pass by its name (_join, _step)
            def through(*given: Any) -> Any:
                return inner(fn, *given)

            return call(through, *args)

        return dataclasses.replace(self, call=routed)

    @property
    def tokenizer(self) -> Any:
        return self.target.tokenizer

    @property
    def eos_ids(self) -> frozenset[int]:
        return frozenset(self.target._eos_ids())

    @property
    def torch(self) -> Any:
        return self.target.torch

    def new_batch(self) -> StepBatch:
        batch: StepBatch = self.target.step_batch()
        return batch

    def inputs(self, requests: Sequence[Sequence[Message]]) -> dict[str, Any]:
        """The processor's left-padded batch of ``requests`` (refused as ``generate_batch`` refuses)."""
        return dict(self.target.step_inputs(requests))

    def check_context(self, prompt_tokens: int, params: GenerationParams) -> None:
        """``context_exceeded`` when the prompt plus ``max_new_tokens`` do not fit the model."""
        self.target._check_context(prompt_tokens, params)

    def image_tokens(self, input_ids: Any) -> int | None:
        """The image placeholder tokens in one row of the processor's ``input_ids``."""
        token = self.target.image_token_id
        return None if token is None else int((input_ids == token).sum().item())

    def join(self, batch: StepBatch, inputs: dict[str, Any]) -> Any:
        """Prefill ``inputs`` into ``batch`` (one model call); their next-token logits."""
        return self.call(self._join, batch, inputs)

    def step(self, batch: StepBatch, tokens: Sequence[int]) -> Any:
        """One decoding step of every row of ``batch`` (one model call); their next-token logits."""
        return self.call(self._step, batch, list(tokens))

    def _join(self, batch: StepBatch, inputs: dict[str, Any]) -> Any:
        return self._forward(batch.join, inputs)

    def _step(self, batch: StepBatch, tokens: list[int]) -> Any:
        return self._forward(batch.step, tokens)

    def _forward(self, fn: Callable[[Any], Any], arg: Any) -> Any:
        with self.target._lock, self.torch.inference_mode():
            try:
                return fn(arg)
            except Exception as exc:  # a model crash on this batch is a finding, with one line
                line = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                raise TargetCallError(f"generate failed: {line}", code="generate_failed") from None
