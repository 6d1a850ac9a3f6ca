"""Typed refusals of a request, scored as wrong answers rather than ending the task.

A perturbed input may be one the target rightly refuses: ``context_overflow`` pushes a prompt of
four document pages past a small model's positions, and the model answers ``context_exceeded``.
That is the target doing its job, and the task lost the answer: it counts as wrong, the task
reports how many requests were refused, and the sweep goes on. Only refusals of the request's
content count (codes answered with 400, 413, 415 or 422); a timeout, a dropped connection or an
untyped exception still ends the task, so a serving failure never passes for a wrong answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from mmchaos.error_codes import status_of
from mmchaos.errors import TargetCallError

__all__ = ["REFUSED", "answer_each", "is_refusal"]

Request = TypeVar("Request")
REFUSED = ""
"""The answer a refused request gets: empty, which matches no reference."""
_CONTENT_STATUSES = frozenset({400, 413, 415, 422})


def is_refusal(exc: TargetCallError) -> bool:
    """Whether the target refused the request's content (not a transport or server failure)."""
    return status_of(exc.code) in _CONTENT_STATUSES


def answer_each(call: Callable[[Sequence[Request]], list[str]], requests: Sequence[Request]) -> tuple[list[str], int]:
    """``call(requests)``; if the batch is refused, each request alone, refused ones as :data:`REFUSED`.

    Returns the answers in order and how many requests were refused.
    """
    try:
        return call(requests), 0
    except TargetCallError as exc:
        if not is_refusal(exc):
            raise
    out: list[str] = []
    refused = 0
    for request in requests:
        try:
            out += call([request])
        except TargetCallError as exc:
            if not is_refusal(exc):
                raise
            out.append(REFUSED)
            refused += 1
    return out, refused
