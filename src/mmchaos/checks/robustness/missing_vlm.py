"""The missing-modality probes of a generative target (a VLM): blank, absent and image-only.

* A **blank image** (black, white, gray) with questions about its content: the answers must be
  abstentions ("none", "there is no shape", a refusal), not a colour or shape the image does
  not hold. Scored: the hallucination rate (answers that are not abstentions) and, where the
  target gives logprobs, the confident ones (mean token probability at or above a threshold).
* **No image** at all, the same questions as text only: the same scoring, and no crash.
* An **image-only** request (no text part): an answer or a clean typed refusal, never a crash.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmchaos.data.base import Dataset
from mmchaos.data.vqa import QUESTIONS
from mmchaos.errors import MMChaosError
from mmchaos.targets.base import Target
from mmchaos.targets.generation import GenerationParams, GenerationResult, Message
from mmchaos.tasks.answers import is_abstention

__all__ = ["Answer", "VLMProbe", "ask_one", "probe_questions", "vlm_probes"]


@dataclass
class Answer:
    """One question's outcome: the text, its confidence where known, or the exception raised."""

    question: str
    text: str = ""
    confidence: float | None = None
    error: BaseException | None = None

    @property
    def refused(self) -> bool:
        return isinstance(self.error, MMChaosError)

    @property
    def crashed(self) -> bool:
        return self.error is not None and not self.refused

    @property
    def hallucinated(self) -> bool:
        return self.error is None and not is_abstention(self.text)

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"question": self.question, "answer": self.text}
        if self.confidence is not None:
            out["confidence"] = round(self.confidence, 6)
        if self.error is not None:
            code = getattr(self.error, "code", None)
            out["error"] = f"{type(self.error).__name__}{f' ({code})' if code else ''}: {self.error}"[:300]
        return out


@dataclass
class VLMProbe:
    """A named request shape: an image (or none) sent with each question (or with no text)."""

    name: str
    image: np.ndarray | None
    questions: Sequence[str]


def probe_questions(dataset: Dataset, limit: int) -> list[str]:
    """The dataset's own distinct questions (first ``limit``), else one built-in question per kind."""
    if dataset.has_questions:
        seen = list(dict.fromkeys(s.question or "" for s in dataset))
        if seen:
            return seen[:limit]
    return [qs[0] for qs in QUESTIONS.values()][:limit]


def _confidence(result: GenerationResult) -> float | None:
    lps = result.logprobs
    if not lps:
        return None
    return float(math.exp(sum(lps) / len(lps)))


def ask_one(target: Target, content: tuple[Any, ...], question: str, max_new_tokens: int) -> Answer:
    """One request; any exception is captured (the point of the probe), typed ones as refusals."""
    params = GenerationParams(max_new_tokens=max_new_tokens, logprobs=True)
    try:
        result = target.generate([Message("user", content)], (), params)
    except Exception as exc:
        return Answer(question, error=exc)
    return Answer(question, text=result.text, confidence=_confidence(result))


def vlm_probes(blanks: dict[str, np.ndarray], questions: Sequence[str]) -> Iterator[VLMProbe]:
    for name, image in blanks.items():
        yield VLMProbe(name, image, questions)
    yield VLMProbe("no_image", None, questions)
