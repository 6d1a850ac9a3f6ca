"""Known-answer probes: the black-box evidence of the integration checks where a target gives no
logprobs (no check lives here).

Without logprobs two equal answers cannot tell a cache from a model that says the same words. Known
answers can: the probe's images come from the built-in data (medium-sized single shapes), so every
answer is scored against the truth. A probe asks its items (images under one question, or questions
about one fresh image) in *passes*: every pass in a rotated order, so each item leads one, and with
its own cache-busting change that cannot matter to a greedy model (the OpenAI ``user`` field and a
``seed``; for the same-question passes also the question reworded, then whitespace after it, since
a cache keyed on the prompt text ignores the rest).

An *echo* is a request whose answer is, character for character, the answer of an earlier request of
its pass that was right for that earlier item, while it is wrong for its own item, which the target
answered right when it led its own pass. A model that reads its input cannot echo in two passes led
by different items: its answer to an item does not depend on what was asked before it, and it knew
that item's answer. A cache's answers follow the request history, so it echoes in every pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from mmchaos.data.vqa import QUESTIONS
from mmchaos.targets.generation import GenerationParams
from mmchaos.tasks.answers import is_right

__all__ = ["METHOD", "EchoJudgement", "Item", "Pass", "busting_params", "is_right", "judge_echoes", "rotations"]

METHOD = "black-box probe"
"""How a finding judged on this evidence names its method (beside ``logprobs`` and ``gauge``)."""


@dataclass(frozen=True)
class Item:
    """One request of a probe: an image, a question about it and its right answers."""

    label: str
    image: npt.NDArray[np.uint8]
    question: str
    kind: str
    answers: tuple[str, ...]


@dataclass
class Pass:
    """One pass: its items in the order asked (the first leads), what it changed, what came back."""

    items: list[Item]
    variant: dict[str, Any]
    answers: list[str] = field(default_factory=list)

    @property
    def lead(self) -> Item:
        return self.items[0]


def rotations(n: int) -> list[list[int]]:
    """``n`` orders of ``range(n)``, each led by a different index."""
    return [[(m + j) % n for j in range(n)] for m in range(n)]


def busting_params(base: GenerationParams, index: int, tag: str) -> GenerationParams:
    """``base`` with its own ``user`` and ``seed``: a different cache key, the same greedy answer."""
    return GenerationParams(max_new_tokens=base.max_new_tokens, temperature=0.0, seed=1000 + index,
                            logprobs=False, user=f"mmchaos-{tag}-{index}")  # fmt: skip


def reworded(kind: str, index: int) -> str:
    """The ``index``-th wording of a ``kind`` question: the built-in rewordings, then with spaces after."""
    forms = QUESTIONS[kind]
    return forms[index % len(forms)] + " " * (index // len(forms))


@dataclass
class EchoJudgement:
    """What a set of passes shows: the requests that could have shown a cache, and the echoes."""

    passes: int
    testable: int
    """Later requests of passes whose lead was answered right, about an item answered right when it led."""
    testable_passes: int
    echoes: list[dict[str, Any]]
    echo_passes: int

    @property
    def cache_shown(self) -> bool:
        """Echoes in two passes led by different items: answers follow history, not content."""
        return self.echo_passes >= 2

    @property
    def conclusive(self) -> bool:
        """Whether a cache would have shown: two passes where it could have echoed."""
        return self.testable_passes >= 2


def judge_echoes(passes: Sequence[Pass], key: Callable[[Item], str] = lambda it: it.label) -> EchoJudgement:
    """Find the echoes of ``passes`` (items are matched across passes by ``key``)."""
    right_when_leading = {key(p.lead): is_right(p.answers[0], p.lead.kind, p.lead.answers) for p in passes}
    echoes: list[dict[str, Any]] = []
    testable = testable_passes = echo_passes = 0
    for m, p in enumerate(passes):
        right = [is_right(a, it.kind, it.answers) for it, a in zip(p.items, p.answers, strict=True)]
        tested = echoed = 0
        for j in range(1, len(p.items)):
            item, answer = p.items[j], p.answers[j]
            if not (right[0] and right_when_leading.get(key(item), False)):
                continue
            tested += 1
            if right[j]:
                continue
            earlier = next((i for i in range(j) if right[i] and p.answers[i] == answer), None)
            if earlier is None:
                continue
            echoed += 1
            echoes.append({"pass": m, "variant": p.variant, "request": j, "item": item.label,
                           "question": item.question, "answer": answer[:80], "right_answer": item.answers[0],
                           "earlier_item": p.items[earlier].label, "earlier_answer": p.answers[earlier][:80],
                           "order": [it.label for it in p.items]})  # fmt: skip
        testable += tested
        testable_passes += tested > 0
        echo_passes += echoed > 0
    return EchoJudgement(len(passes), testable, testable_passes, echoes, echo_passes)
