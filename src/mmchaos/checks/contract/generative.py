"""Step 1 on a generative target: the hostile corpus as chat requests, and how an answer is judged.

A target that only generates (a VLM in-process, a chat endpoint over ``openai:``) gets each hostile
image as the image of one greedy request (encoded bytes go as they are: over ``openai:`` as the data
URL the server decodes) and each hostile text as the prompt. What a correct deployment does: a typed
refusal (a 4xx) for what has no correct answer, an answer for the rest. A 5xx, a reset or a dead
worker is a crash; an answer to an undecodable image, or an empty answer about an image (200 with
empty content), is silent garbage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from mmchaos.targets.base import Target
from mmchaos.targets.generation import GenerationParams

__all__ = ["GENERATIVE_METHODS", "PROMPT", "answer_verdict", "call"]

PROMPT = "Describe the image in a few words."
_GREEDY = GenerationParams(max_new_tokens=16, temperature=0.0)


def _images(target: Target, images: Sequence[Any]) -> list[str]:
    return [target.generate(PROMPT, [image], _GREEDY).text for image in images]


def _encoded_images(target: Target, blobs: Sequence[bytes]) -> list[str]:
    return [target.generate_encoded(PROMPT, [blob], _GREEDY).text for blob in blobs]


def _texts(target: Target, texts: Sequence[str]) -> list[str]:
    return [target.generate(text, (), _GREEDY).text for text in texts]


GENERATIVE_METHODS: dict[str, Callable[[Target, Sequence[Any]], list[str]]] = {
    "generate_images": _images,
    "generate_encoded_images": _encoded_images,
    "generate_texts": _texts,
}
"""The contract's generative routes: name -> ``fn(target, items) -> one answer per item``."""


def call(target: Target, method: str) -> Any:
    """The callable the contract runs for ``method``: a target method or a generative route."""
    fn = GENERATIVE_METHODS.get(method)
    if fn is None:
        return getattr(target, method)
    return lambda items: fn(target, items)


def answer_verdict(
    method: str, answer: str, expect: str, expected: str | None, wrong: dict[str, str]
) -> tuple[Literal["handled", "garbage"], str]:
    """(outcome, detail) of one generative answer: ``handled`` or ``garbage``."""
    about_image = method != "generate_texts"
    if expect == "reject":
        what = "200 with empty content" if not answer.strip() else f"an answer ({answer[:60]!r})"
        return "garbage", f"{what} to an input that has no correct answer, instead of a typed refusal (4xx)"
    if about_image and not answer.strip():
        return "garbage", "an empty answer about a decodable image (200 with empty content)"
    if expect != "equivalent" or expected is None:
        return "handled", f"answered ({answer[:60]!r})"
    if answer == expected:
        return "handled", f"the same answer as for the correct picture ({answer[:60]!r})"
    for bug, text in wrong.items():
        if text == answer and text != expected:
            return "garbage", f"answered {answer[:60]!r}, what the known bug '{bug}' gives (correct: {expected[:60]!r})"
    return "handled", f"answered {answer[:60]!r} (the correct picture: {expected[:60]!r}; greedy answers may part)"
