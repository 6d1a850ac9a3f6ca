"""Generative targets that break one generation parameter each, for ``generation_semantics``'s fast tier.

Each is the honest :class:`~tests.fakes.generative.WordsTarget` (one token a word, answers of 12
words that end by themselves) with one thing wrong, as a serving layer gets it wrong:

- ``IgnoresMaxTokensTarget``: drops ``max_new_tokens`` (answers run to the server's own 64);
- ``CutSaysStopTarget``: cuts at ``max_new_tokens`` but reports ``finish_reason`` "stop";
- ``StopLeftInTarget``: stops at a stop string but leaves it in the text;
- ``OneChoiceTarget``: answers one choice whatever ``n`` asks;
- ``RunOnTarget``: never ends an answer by itself (every answer runs to the limit: a wrong EOS).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from mmchaos.targets.generation import Completion, GenerationParams, GenerationResult, Message
from tests.fakes.generative import WordsTarget


class IgnoresMaxTokensTarget(WordsTarget):
    """Broken: the request's max_new_tokens never reaches the engine."""

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[Any] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        return super().generate(prompt, images, dataclasses.replace(params or GenerationParams(), max_new_tokens=64))


class CutSaysStopTarget(WordsTarget):
    """Broken: an answer cut at max_new_tokens says it ended by itself."""

    def _answer(self, words: list[str], params: GenerationParams, index: int) -> Completion:
        return dataclasses.replace(super()._answer(words, params, index), finish_reason="stop")


class StopLeftInTarget(WordsTarget):
    """Broken: the stop string that ended the answer is left at its end."""

    def _answer(self, words: list[str], params: GenerationParams, index: int) -> Completion:
        done = super()._answer(words, params, index)
        full = " ".join(words)
        for stop in params.stop:
            if stop in full:
                return dataclasses.replace(done, text=full[: full.find(stop) + len(stop)])
        return done


class OneChoiceTarget(WordsTarget):
    """Broken: one completion whatever n is."""

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[Any] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        return super().generate(prompt, images, dataclasses.replace(params or GenerationParams(), n=1))


class RunOnTarget(WordsTarget):
    """Broken: no answer ends before the token limit (the EOS generate stops on is never emitted)."""

    def _words(self, messages: Sequence[Message]) -> list[str]:
        return super()._words(messages) * 100
