"""The known-answer evidence of issue 26, in process: how answers are scored against the truth, what
counts as an echo (a cache) and what does not (a model that reads, a blind or a question-blind one),
and ``image_cache_isolation`` / ``multi_turn_consistency`` judged on it for targets without
logprobs (the honest pixel-reading VQA fake, and the cache and stale-image bugs around it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from mmchaos.checks.integration._known_answers import Item, Pass, is_right, judge_echoes, rotations
from mmchaos.checks.integration.image_cache_isolation import ImageCacheIsolation
from mmchaos.checks.integration.multi_turn_consistency import MultiTurnConsistency
from mmchaos.data.shapes import make_shapes
from mmchaos.data.vqa import known_answer_samples
from mmchaos.findings import Verdict
from mmchaos.targets.generation import GenerationParams, GenerationResult, Message
from mmchaos.tasks.answers import names_answer
from tests.fakes import broken_vlms as bv
from tests.fakes.vlm import PixelVQATarget
from tests.support import run_check

DATA = make_shapes(4, seed=5)
COLOURS = ["red", "green", "blue", "yellow", "purple", "orange", "none"]


def test_an_answer_names_its_truth_in_a_sentence_and_nothing_else() -> None:
    assert names_answer("The shape is red.", ["red"], COLOURS)
    assert names_answer("RED", ["red"], COLOURS)
    assert not names_answer("red or blue", ["red"], COLOURS)
    assert not names_answer("blue", ["red"], COLOURS)
    assert not names_answer("I do not understand the question.", ["red"], COLOURS)
    positions = ["top left", "top center", "center", "middle left"]
    assert names_answer("top center", ["top center"], positions)  # "center" inside it is not a second answer
    assert not names_answer("top center", ["center", "middle"], positions)
    assert names_answer("in the middle", ["center", "middle", "middle center"], positions)


def test_known_answer_samples_differ_in_their_answer_and_replay() -> None:
    first = known_answer_samples(6, "colour", seed=3)
    assert len({s.answer for s in first}) == 6 and all(s.meta["size"] == "medium" for s in first)
    assert [s.id for s in known_answer_samples(6, "colour", seed=3)] == [s.id for s in first]
    assert first[0].meta["answers_by_kind"]["count"] == ["one"]
    with pytest.raises(ValueError):
        known_answer_samples(7, "colour")


def test_the_pixel_reader_knows_every_probe_answer() -> None:
    # The honest fake the server fakes wrap must answer the probe right, or the tests prove nothing.
    reader = PixelVQATarget()
    for s in known_answer_samples(6, "colour", seed=0) + known_answer_samples(6, "colour", seed=1, split="val"):
        for kind, question in (("colour", "What colour is the shape?"), ("position", "Where is the shape?")):
            assert is_right(reader.answer(s.load_image(), question), kind, s.meta["answers_by_kind"][kind])


# -- judge_echoes on hand-made passes ----------------------------------------------------------------

IMAGE = np.zeros((4, 4, 3), np.uint8)
TRUTH = ["red", "green", "blue"]
ITEMS = [Item(f"image {i + 1}", IMAGE, "q", "colour", (t,)) for i, t in enumerate(TRUTH)]


def passes(answer: Any) -> list[Pass]:
    """Three rotated passes; ``answer(pass, order, j)`` is the text of the ``j``-th request."""
    out = []
    for m, order in enumerate(rotations(3)):
        run = Pass([ITEMS[i] for i in order], {"pass": m})
        run.answers = [answer(m, order, j) for j in range(3)]
        out.append(run)
    return out


def test_a_cache_echoes_the_lead_in_every_pass() -> None:
    judged = judge_echoes(passes(lambda m, order, j: TRUTH[order[0]]))
    assert judged.cache_shown and judged.echo_passes == 3 and len(judged.echoes) == 6
    assert judged.echoes[0]["earlier_item"] == "image 1" and judged.echoes[0]["right_answer"] == "green"


def test_a_model_that_reads_its_input_never_echoes_even_when_wrong() -> None:
    wrong = {0: "red", 1: "red", 2: "blue"}  # it takes image 2 for red, whatever the order
    judged = judge_echoes(passes(lambda m, order, j: wrong[order[j]]))
    assert not judged.echoes and judged.conclusive
    assert not judge_echoes(passes(lambda m, order, j: TRUTH[order[j]])).echoes


def test_a_blind_model_is_neither_a_cache_nor_judged() -> None:
    judged = judge_echoes(passes(lambda m, order, j: "red"))
    assert not judged.cache_shown and not judged.echoes and not judged.conclusive


def test_one_pass_that_looks_like_a_cache_is_not_enough() -> None:
    judged = judge_echoes(passes(lambda m, order, j: TRUTH[order[0]] if m == 0 else TRUTH[order[j]]))
    assert judged.echo_passes == 1 and not judged.cache_shown


# -- the checks on in-process targets without logprobs -----------------------------------------------


class QuestionBlind(PixelVQATarget):
    """Names the colour whatever it is asked (the same answer to different prompts about one image)."""

    def answer(self, img: np.ndarray | None, question: str) -> str:
        return super().answer(img, "What colour is the shape?")


class FirstImageOfTheChat(PixelVQATarget):
    """Answers the last turn about the chat's first image (stale per-conversation features)."""

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[Any] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        if isinstance(prompt, str):
            return super().generate(prompt, images, params)
        first = next(img for m in prompt for img in m.images())
        text = " ".join(p for p in prompt[-1].parts() if isinstance(p, str))
        return super().generate([Message("user", (first, text))], (), params)


@pytest.mark.check_contract("image_cache_isolation", "clean")
def test_cache_isolation_passes_a_model_that_reads_without_logprobs() -> None:
    for target in (PixelVQATarget(), QuestionBlind()):
        [finding] = run_check(ImageCacheIsolation(), target, DATA)
        assert finding.verdict == Verdict.PASS, (type(target).__name__, finding.title)
        assert finding.evidence["method"] == "black-box probe"


@pytest.mark.check_contract("image_cache_isolation", "broken")
def test_cache_isolation_fails_text_and_image_keyed_caches_without_logprobs() -> None:
    [text] = run_check(ImageCacheIsolation(), bv.TextKeyedCacheVLM(PixelVQATarget()), DATA)
    [image] = run_check(ImageCacheIsolation(), bv.ImageKeyedCacheVLM(PixelVQATarget()), DATA)
    assert text.verdict == image.verdict == Verdict.FAIL, (text.title, image.title)
    assert text.metrics["echo_passes_same_text"] == 3 and "prompt text alone" in (text.message or "")
    assert image.metrics["echo_passes_same_image"] == 3 and "the image alone" in (image.message or "")


@pytest.mark.check_contract("multi_turn_consistency", "clean")
@pytest.mark.check_contract("multi_turn_consistency", "broken")
def test_multi_turn_scores_the_last_turn_against_the_truth_without_logprobs() -> None:
    [clean] = run_check(MultiTurnConsistency(), PixelVQATarget(), DATA)
    [stale] = run_check(MultiTurnConsistency(), FirstImageOfTheChat(), DATA)
    assert clean.verdict == Verdict.PASS and clean.evidence["method"] == "black-box probe", clean.title
    assert stale.verdict == Verdict.FAIL, stale.title
    assert stale.metrics["stale_last_answers"] == 3 and stale.evidence["chats"][0]["names"] == "the first image"
