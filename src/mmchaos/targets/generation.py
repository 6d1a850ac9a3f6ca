"""The types of the ``generate`` capability: a chat request with images, its parameters, its result.

Images are ``uint8 (H, W, 3)`` RGB arrays placed inside message content, so multi-image and
multi-turn requests say exactly where each image sits. A bare prompt with images is the common
case and :func:`as_messages` turns it into one user message (images first, as the VLM families'
own examples do).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from mmchaos.errors import TargetCallError

__all__ = [
    "Completion",
    "ContentPart",
    "FinishReason",
    "GenerationParams",
    "GenerationResult",
    "Message",
    "Role",
    "StreamUsage",
    "as_messages",
    "cut_at_stop",
]

Role = Literal["system", "user", "assistant"]
FinishReason = Literal["stop", "length"]
ContentPart = str | npt.NDArray[np.uint8]
"""A text part (``str``) or an image part (an RGB uint8 ``(H, W, 3)`` array)."""


@dataclass(frozen=True, eq=False)
class Message:
    """One chat turn; ``content`` is a string or an ordered sequence of text and image parts."""

    role: Role
    content: str | tuple[ContentPart, ...]

    def parts(self) -> tuple[ContentPart, ...]:
        return (self.content,) if isinstance(self.content, str) else self.content

    def images(self) -> list[npt.NDArray[np.uint8]]:
        return [p for p in self.parts() if not isinstance(p, str)]


@dataclass(frozen=True)
class GenerationParams:
    """Sampling parameters with OpenAI/vLLM meanings; ``temperature == 0`` is greedy decoding.

    ``seed`` makes sampling reproducible; ``stop`` strings end a completion (they are not part of
    its text); ``n`` completions are returned; ``logprobs`` asks for per-token log-probabilities;
    ``user`` is OpenAI's end-user id (sent to HTTP servers, meaningless to a model).
    """

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    logprobs: bool = True
    top_logprobs: int = 0
    """How many of the most likely tokens to give at each step (0: none), where the backend can."""
    user: str | None = None

    def __post_init__(self) -> None:
        problems = []
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            problems.append(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            problems.append(f"temperature must be finite and >= 0, got {self.temperature!r}")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            problems.append(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not (isinstance(self.n, int) and 1 <= self.n <= 128):
            problems.append(f"n must be an int in [1, 128], got {self.n!r}")
        if not (isinstance(self.top_logprobs, int) and 0 <= self.top_logprobs <= 20):
            problems.append(f"top_logprobs must be an int in [0, 20], got {self.top_logprobs!r}")
        if isinstance(self.stop, str) or any(not isinstance(s, str) or not s for s in self.stop):
            problems.append("stop must be a tuple of non-empty strings")
        if problems:
            raise TargetCallError("; ".join(problems), code="bad_generation_params")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Completion:
    """One generated continuation. ``token_ids``/``logprobs`` are None where the backend does not
    give them; ``logprobs[i]`` is the model's log-probability of ``token_ids[i]``."""

    text: str
    finish_reason: FinishReason
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[Mapping[int, float], ...] | None = None
    """The most likely tokens at each step (id -> logprob), where asked (``top_logprobs``) and given."""


@dataclass(frozen=True)
class GenerationResult:
    """What :meth:`Target.generate` returns: ``n`` completions plus usage where known."""

    completions: tuple[Completion, ...]
    prompt_tokens: int | None = None
    extra: dict[str, object] = field(default_factory=dict)
    """Backend details worth recording (e.g. the image tokens the processor expanded)."""

    @property
    def text(self) -> str:
        """The first completion's text (the only one when ``n == 1``)."""
        return self.completions[0].text

    @property
    def finish_reason(self) -> FinishReason:
        return self.completions[0].finish_reason

    @property
    def token_ids(self) -> tuple[int, ...] | None:
        return self.completions[0].token_ids

    @property
    def logprobs(self) -> tuple[float, ...] | None:
        return self.completions[0].logprobs


@dataclass(frozen=True)
class StreamUsage:
    """What a finished stream cost, counted as :meth:`Target.generate` counts it.

    A ``generate_stream`` generator may ``return`` one (PEP 380 carries it to whoever reads the
    stream to its end): the server's streamed ``usage`` then equals its non-streamed one, image
    tokens and the model's own token ids included, instead of the stream's text re-counted.
    """

    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def _check_image(part: object, index: int, max_pixels: int | None) -> None:
    from mmchaos.targets.decode import check_image_array

    if not isinstance(part, np.ndarray):
        raise TargetCallError(f"image {index} is {type(part).__name__}, not an image array", code="bad_content_part")
    check_image_array(part, index, max_pixels=max_pixels)


def as_messages(
    prompt: str | Sequence[Message], images: Sequence[npt.NDArray[np.uint8]] = (), *, max_pixels: int | None = None
) -> list[Message]:
    """Normalise (prompt, images) or a message list into validated messages.

    Images go either with a string prompt or inside the messages, not both: two places for the same
    thing is how image/placeholder mismatches start. Every image must be an ``(H, W, 3)`` uint8
    array of at most ``max_pixels`` (checked from its shape, before any copy).
    """
    if isinstance(prompt, str):
        for i, image in enumerate(images):
            _check_image(image, i, max_pixels)
        return [Message("user", (*images, prompt) if len(images) else prompt)]
    if len(images):
        raise TargetCallError("give images inside the messages or with a string prompt, not both", code="bad_messages")
    messages = list(prompt)
    if not messages:
        raise TargetCallError("no messages to answer", code="bad_messages")
    n_images = 0
    for i, m in enumerate(messages):
        if not isinstance(m, Message):
            raise TargetCallError(f"message {i} is {type(m).__name__}, not Message", code="bad_messages")
        if m.role not in ("system", "user", "assistant"):
            raise TargetCallError(f"message {i} has unknown role {m.role!r}", code="bad_messages")
        for part in m.parts():
            if not isinstance(part, str):
                _check_image(part, n_images, max_pixels)
                n_images += 1
    return messages


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the earliest stop string (excluded), and whether one was found."""
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)
