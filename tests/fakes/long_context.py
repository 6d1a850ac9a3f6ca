"""Readers of long prompts for ``long_context_recall``: one that reads them whole, two serving bugs.

Deterministic models, not mocks: a word is a token (plus two for the template), and the answer is
read from the tokens the model sees, as attention would. :class:`RecallTarget` (correct) sees every
token up to its ``context_tokens`` and refuses longer prompts with a typed error. The broken ones
state the same limit:

- :class:`LeftTruncatingTarget`: the serving layer cuts prompts to ``keep`` tokens from the left
  (a truncation length smaller than the model's), counting only what it kept;
- :class:`PositionRestartTarget`: position ids restart at 0 every ``window`` tokens and the model's
  cache is keyed on position ids, so each later token shadows the earlier one at its id: the start
  of a prompt longer than the window is never read, though every token is counted.

:func:`restart_positions` does the same to a real transformers model (its rotary embedding gets
position ids modulo a window), for the white-box position-id probe.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from mmchaos.errors import TargetCallError
from mmchaos.targets.base import Capability, Fingerprint, Target
from mmchaos.targets.generation import Completion, GenerationParams, GenerationResult, Message, as_messages

_TEMPLATE = 2


class RecallTarget(Target):
    """Correct: reads the whole prompt (up to its limit) and answers the code it was told."""

    uri = "py:tests.fakes.long_context:RecallTarget"
    capabilities = frozenset({Capability.GENERATE})

    def __init__(self, context_tokens: int = 1024, *, states_limit: bool = True) -> None:
        self.limit = context_tokens
        self.context_tokens: int | None = context_tokens if states_limit else None

    def seen(self, tokens: list[str]) -> list[str]:
        return tokens

    def counted(self, tokens: list[str]) -> int:
        return len(tokens)

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[Any] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        params = params or GenerationParams()
        messages = as_messages(prompt, images)
        tokens = ["<s>", "<user>"][:_TEMPLATE] + " ".join(
            p for m in messages for p in m.parts() if isinstance(p, str)
        ).split()
        if len(tokens) + params.max_new_tokens > self.limit:
            raise TargetCallError(
                f"{len(tokens)} prompt tokens + {params.max_new_tokens} exceed the {self.limit}-token context",
                code="context_length_exceeded",
            )
        seen = " ".join(self.seen(tokens))
        asked = re.search(r"secret code of (\w+)\?", seen)
        told = re.search(rf"secret code of {asked.group(1)} is (\d+)\.", seen) if asked else None
        text = told.group(1) if told else "I do not know."
        return GenerationResult((Completion(text, "stop"),), prompt_tokens=self.counted(tokens))

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(weights=f"fake-{type(self).__name__}")


class LeftTruncatingTarget(RecallTarget):
    """Broken: prompts are cut to their last ``keep`` tokens, silently (and counted as kept)."""

    uri = "py:tests.fakes.long_context:LeftTruncatingTarget"

    def __init__(self, context_tokens: int = 1024, keep: int = 400) -> None:
        super().__init__(context_tokens)
        self.keep = keep

    def seen(self, tokens: list[str]) -> list[str]:
        return tokens[-self.keep :]

    def counted(self, tokens: list[str]) -> int:
        return min(len(tokens), self.keep)


class PositionRestartTarget(RecallTarget):
    """Broken: position ids restart at 0 every ``window`` tokens; a cache keyed on the id keeps the
    last token at each id, so only the last ``window`` tokens are read (all of them are counted)."""

    uri = "py:tests.fakes.long_context:PositionRestartTarget"

    def __init__(self, context_tokens: int = 1024, window: int = 400) -> None:
        super().__init__(context_tokens)
        self.window = window

    def seen(self, tokens: list[str]) -> list[str]:
        by_id: dict[int, tuple[int, str]] = {}
        for i, tok in enumerate(tokens):
            by_id[i % self.window] = (i, tok)  # the later token at each position id wins
        return [tok for _, tok in sorted(by_id.values())]


def recall() -> Target:
    return RecallTarget()


def left_truncating() -> Target:
    return LeftTruncatingTarget()


def position_restart() -> Target:
    return PositionRestartTarget()


def restart_positions(module: Any, window: int) -> list[Any]:
    """Make a real transformers model's position ids restart at 0 every ``window`` tokens (a forward
    pre-hook on its rotary embedding, as a chunked-prefill or packing bug would hand them to it).
    Returns the hook handles (``.remove()`` undoes it)."""
    from mmchaos.checks.engine.long_context import rotary_modules

    def restart(mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if len(args) > 1:
            return (args[0], args[1] % window, *args[2:]), kwargs
        if kwargs.get("position_ids") is not None:
            return args, {**kwargs, "position_ids": kwargs["position_ids"] % window}
        return args, kwargs

    return [m.register_forward_pre_hook(restart, with_kwargs=True) for m in rotary_modules(module)]
