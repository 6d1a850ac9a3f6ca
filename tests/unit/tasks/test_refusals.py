"""A request refused for its content scores as a wrong answer, in the multi-image tasks too; a
serving failure still raises."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from mmchaos.data.vqa import make_vqa
from mmchaos.errors import TargetCallError
from mmchaos.targets.base import Capability, Fingerprint, Target
from mmchaos.targets.generation import Completion, GenerationParams, GenerationResult, Message, as_messages
from mmchaos.tasks.frames import ask_with_images
from mmchaos.tasks.generative import VQAAccuracy

DATA = make_vqa(6, seed=0)


class ShortContextVLM(Target):
    """Answers every question right, refuses a prompt over 12 words as a small model would."""

    uri = "py:tests.unit.tasks.test_refusals:ShortContextVLM"
    capabilities = frozenset({Capability.GENERATE})

    def __init__(self, code: str = "context_exceeded") -> None:
        self.code = code
        self.answers = {s.question: s.answer for s in DATA}

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[np.ndarray] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        text = " ".join(p for p in as_messages(prompt, images)[-1].parts() if isinstance(p, str))
        if len(text.split()) > 12:
            raise TargetCallError("the prompt exceeds the model's positions", code=self.code)
        return GenerationResult((Completion(self.answers.get(text, "?") or "?", "stop"),))

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(weights="short-context")


def test_refused_requests_score_wrong_and_the_rest_are_still_answered() -> None:
    texts = [s.question or "" for s in DATA]
    texts[1] = texts[3] = "filler " * 20 + texts[1]
    result = VQAAccuracy(batch_size=4).evaluate(ShortContextVLM(), DATA, texts=texts)
    assert result.outputs[1] == result.outputs[3] == ""
    assert result.per_sample.tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]


def test_a_serving_failure_is_not_a_wrong_answer() -> None:
    texts = ["filler " * 20] * len(DATA)
    with pytest.raises(TargetCallError) as info:
        VQAAccuracy().evaluate(ShortContextVLM(code="timeout"), DATA, texts=texts)
    assert info.value.code == "timeout"


def test_a_document_request_past_the_context_is_refused_alone() -> None:
    page = np.zeros((8, 8, 3), np.uint8)
    questions = [DATA[0].question or "", "filler " * 20, DATA[2].question or ""]
    got = ask_with_images(ShortContextVLM(), questions, [[page, page]] * 3, GenerationParams(), batch=3)
    assert list(got) == [DATA[0].answer, "", DATA[2].answer] and got.refused == {1: "context_exceeded"}
    assert got.refusal_extra() == {"refused_rate": 1 / 3}
