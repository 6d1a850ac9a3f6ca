"""Small generative targets for the chat server and streaming tests, without torch.

``WordsTarget`` is honest: its answer is a deterministic function of the request (one word per
image naming its dominant colour, then the words of the last text, then ``w0 w1 ...``), one token a
word, so ``max_new_tokens``, stop strings, seeds and ``n`` all have exact expected answers, and its
stream yields exactly the text ``generate`` returns. The others break one thing each:

- ``DropLastDeltaTarget``: its stream loses the last delta (the streamed text is shorter);
- ``SlowStreamTarget`` (honest): long answers streamed a word every ``delay`` seconds; it records
  when its stream was closed (a client that left mid-stream);
- ``UninterruptibleStreamTarget``: once its stream is closed it keeps "generating" for ``hold_s``
  seconds (a model call that cannot be interrupted): a server that waits for it holds the slot;
- ``SharedRequestStateTarget``: keeps the request being answered in an attribute of the target, so
  concurrent calls answer each other's requests (thread safety);
- ``UnseededSamplingTarget``: samples from an unseeded RNG whatever ``seed`` says (determinism);
- ``WarmCacheTarget``: its greedy answer changes after the first call with a request (determinism).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import (
    Completion,
    FinishReason,
    GenerationParams,
    GenerationResult,
    Message,
    as_messages,
    cut_at_stop,
)

COLOURS = ("red", "green", "blue")
NATURAL_WORDS = 12
"""An answer ends by itself (finish_reason "stop") after this many words."""


class WordsTarget(Target):
    """Honest: a deterministic word generator; one token a word."""

    uri = "fake:words"
    capabilities = frozenset({Capability.GENERATE})

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def _words(self, messages: Sequence[Message]) -> list[str]:
        words = []
        for m in messages:
            for img in m.images():
                words.append(COLOURS[int(np.argmax(img.reshape(-1, 3).mean(0)))])
        last = next((p for m in reversed(messages) for p in reversed(m.parts()) if isinstance(p, str)), "")
        words += last.split()[:4]
        words += [f"w{i}" for i in range(NATURAL_WORDS)]
        return words[:NATURAL_WORDS]

    def _answer(self, words: list[str], params: GenerationParams, index: int) -> Completion:
        if not params.greedy:
            rng = random.Random(None if params.seed is None else params.seed + index)
            words = list(words)
            rng.shuffle(words)
        finish: FinishReason = "stop"
        if len(words) > params.max_new_tokens:
            words, finish = words[: params.max_new_tokens], "length"
        text = " ".join(words)
        text, hit = cut_at_stop(text, params.stop)
        if hit:
            finish = "stop"
            words = text.split()
        ids = tuple(sum(map(ord, w)) for w in words)
        logprobs = tuple(-0.1 * (i + 1) for i in range(len(ids)))
        kept = logprobs if params.logprobs else None
        return Completion(text=text, finish_reason=finish, token_ids=ids, logprobs=kept)

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[Any] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        params = params or GenerationParams()
        with self.lock:
            self.calls += 1
        words = self._words(as_messages(prompt, images))
        rows = tuple(self._answer(words, params, i) for i in range(params.n))
        return GenerationResult(completions=rows, prompt_tokens=7 + len(words))

    def generate_stream(
        self, prompt: str | Sequence[Message], images: Sequence[Any] = (), params: GenerationParams | None = None
    ) -> Iterator[str]:
        text = self.generate(prompt, images, params).text
        words = text.split(" ")
        for i, w in enumerate(words):
            yield w if i == len(words) - 1 else w + " "


class DropLastDeltaTarget(WordsTarget):
    """Broken: the stream loses its last delta (a flush missing at the end of the stream)."""

    uri = "fake:drop-last-delta"

    def generate_stream(
        self, prompt: str | Sequence[Message], images: Sequence[Any] = (), params: GenerationParams | None = None
    ) -> Iterator[str]:
        deltas = list(super().generate_stream(prompt, images, params))
        yield from deltas[:-1]


class SlowStreamTarget(WordsTarget):
    """Honest but slow: answers ``w0 w1 ...`` up to ``max_new_tokens`` words, streamed one word every
    ``delay`` seconds (the same text as ``generate``); records when its stream is closed early."""

    uri = "fake:slow-stream"

    def __init__(self, delay: float = 0.05) -> None:
        super().__init__()
        self.delay = delay
        self.closed = threading.Event()
        self.streams_started = 0

    def _words(self, messages: Sequence[Message]) -> list[str]:
        return [f"w{i}" for i in range(10_000)]

    def generate_stream(
        self, prompt: str | Sequence[Message], images: Sequence[Any] = (), params: GenerationParams | None = None
    ) -> Iterator[str]:
        self.streams_started += 1
        text = self.generate(prompt, images, params).text
        try:
            for i, word in enumerate(text.split(" ")):
                time.sleep(self.delay)
                yield word if i == 0 else " " + word
        except GeneratorExit:
            self.closed.set()
            raise


class UninterruptibleStreamTarget(SlowStreamTarget):
    """Broken: closing its stream blocks for ``hold_s`` (a model call that runs to its end)."""

    uri = "fake:uninterruptible"

    def __init__(self, delay: float = 0.05, hold_s: float = 4.0) -> None:
        super().__init__(delay)
        self.hold_s = hold_s

    def generate_stream(
        self, prompt: str | Sequence[Message], images: Sequence[Any] = (), params: GenerationParams | None = None
    ) -> Iterator[str]:
        try:
            yield from super().generate_stream(prompt, images, params)
        finally:
            time.sleep(self.hold_s)


class SharedRequestStateTarget(WordsTarget):
    """Broken: the request in flight lives on the target (``self.current``), read back after a pause
    that stands for the model's work, so a concurrent call's request replaces it."""

    uri = "fake:shared-request-state"

    def __init__(self, pause_s: float = 0.002) -> None:
        super().__init__()
        self.pause_s = pause_s
        self.current: list[Message] = []

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[Any] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        self.current = as_messages(prompt, images)
        time.sleep(self.pause_s)
        return super().generate(self.current, (), params)


class UnseededSamplingTarget(WordsTarget):
    """Broken: sampling draws from a fresh unseeded RNG, so the same seed gives different samples."""

    uri = "fake:unseeded-sampling"

    def _answer(self, words: list[str], params: GenerationParams, index: int) -> Completion:
        if params.greedy:
            return super()._answer(words, params, index)
        shuffled = list(words)
        random.Random().shuffle(shuffled)
        greedy = GenerationParams(max_new_tokens=params.max_new_tokens, stop=params.stop, logprobs=params.logprobs)
        return super()._answer(shuffled, greedy, index)


class WarmCacheTarget(WordsTarget):
    """Broken: a request seen before is answered from a "warm" path that drops its first word."""

    uri = "fake:warm-cache"

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def _words(self, messages: Sequence[Message]) -> list[str]:
        words = super()._words(messages)
        key = " ".join(words)
        if key in self.seen:
            return words[1:]
        self.seen.add(key)
        return words
