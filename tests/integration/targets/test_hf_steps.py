"""Step-by-step decoding (mmchaos.targets.hf_steps): rows that join a running batch at different
steps, and leave it when they end, decode the tokens the model's own ``generate`` gives each
request alone, family by family; a twin that numbers positions by the batch's columns instead of
each row's own tokens fails that comparison; and the families whose cache or positions the steps
do not handle are refused in one line, before any decoding."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mmchaos.data import load_dataset
from mmchaos.errors import TargetCallError
from mmchaos.targets.generation import GenerationParams, Message
from mmchaos.targets.hf_steps import StepBatch, steps_supported
from mmchaos.targets.hf_vlm import HFVisionLanguageTarget
from tests.fakes.step_batches import ColumnPositions
from tests.support.vlms import loaded_vlms

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")

MAX_NEW = 12
SHAPES = list(load_dataset("builtin:shapes?n=6&seed=0"))
REQUESTS: list[list[Message]] = [
    [Message("user", (SHAPES[0].image, "What colour is the shape?"))],
    [Message("user", (SHAPES[1].image, "Describe the image."))],
    [Message("user", (SHAPES[2].image, "What shape is it?"))],
    [Message("user", "hi there, a question with no image")],
    [Message("user", (SHAPES[4].image, "What is in the picture? Answer in words."))],
]
JOINS = {0: [0, 1], 3: [2], 5: [3, 4]}
"""Step -> the requests that join then: two at once, one alone mid-decoding, a text-only one beside
an image one later, so rows of different prompt lengths share the cache."""


@pytest.fixture(scope="module")
def vlm(tiny_vlm_dirs: Any) -> Iterator[Callable[[str], HFVisionLanguageTarget]]:
    yield from loaded_vlms(tiny_vlm_dirs)


@pytest.fixture(scope="module")
def tiny_vlm() -> HFVisionLanguageTarget:
    from mmchaos.targets.builtin import load_builtin

    target = load_builtin("tiny-vlm")
    inner = getattr(target, "inner", target)
    assert isinstance(inner, HFVisionLanguageTarget)
    return inner


def decode_with_joins(target: HFVisionLanguageTarget, batch: StepBatch | None = None) -> dict[int, list[int]]:
    """Greedy tokens of every request, decoded in one StepBatch that requests join at the steps of
    ``JOINS`` and leave at end of sequence or ``MAX_NEW`` tokens."""
    steps = batch if batch is not None else target.step_batch()
    eos = target._eos_ids()
    out: dict[int, list[int]] = {}
    rows: list[int] = []
    with torch.inference_mode():
        for step in range(4 * MAX_NEW):
            if step in JOINS:
                if rows:  # the running rows take their step first, as the engine does
                    for i, logits in zip(rows, steps.step([out[i][-1] for i in rows]), strict=True):
                        out[i].append(int(logits.argmax()))
                joining = JOINS[step]
                joined = steps.join(target.step_inputs([REQUESTS[i] for i in joining]))
                for i, logits in zip(joining, joined, strict=True):
                    out[i] = [int(logits.argmax())]
                rows += joining
            elif rows:
                for i, logits in zip(rows, steps.step([out[i][-1] for i in rows]), strict=True):
                    out[i].append(int(logits.argmax()))
            kept = [k for k, i in enumerate(rows) if out[i][-1] not in eos and len(out[i]) < MAX_NEW]
            steps.keep(kept)
            rows = [rows[k] for k in kept]
            if not rows and len(out) == len(REQUESTS):
                break
    assert len(steps) == 0 and steps.columns == 0, "every row left, and its columns with it"
    return out


def alone(target: HFVisionLanguageTarget) -> dict[int, list[int]]:
    params = GenerationParams(max_new_tokens=MAX_NEW)
    return {i: list(target.generate(r, params=params).completions[0].token_ids) for i, r in enumerate(REQUESTS)}


def test_rows_joining_and_leaving_decode_what_generate_gives_each_request_alone(
    tiny_vlm: HFVisionLanguageTarget,
) -> None:
    reference = alone(tiny_vlm)
    assert len({tuple(v) for v in reference.values()}) >= 4, "the trained model answers the requests apart"
    assert decode_with_joins(tiny_vlm) == reference


@pytest.mark.parametrize("family", ["llava_next", "llava_onevision", "idefics3", "smolvlm2", "internvl", "janus"])
def test_each_supported_family_decodes_step_by_step_as_its_generate(family: str, vlm: Any) -> None:
    target = vlm(family)
    assert target.steps_unsupported is None
    assert decode_with_joins(target) == alone(target)


def test_a_batch_that_numbers_positions_by_column_fails_the_comparison(tiny_vlm: HFVisionLanguageTarget) -> None:
    broken = decode_with_joins(tiny_vlm, ColumnPositions(tiny_vlm.model, torch))
    reference = alone(tiny_vlm)
    differ = [i for i in reference if broken[i] != reference[i]]
    assert differ, "numbering positions by column changed no answer: the test tested nothing"


@pytest.mark.parametrize(
    ("family", "needle"),
    [("qwen2_vl", "not among the families"), ("gemma3", "not among the families"), ("florence2", "not among")],
)
def test_families_the_steps_do_not_handle_are_refused_in_one_line(family: str, needle: str, vlm: Any) -> None:
    target = vlm(family)
    assert target.steps_unsupported is not None and needle in target.steps_unsupported
    with pytest.raises(TargetCallError) as err:
        target.step_batch()
    assert err.value.code == "steps_unsupported" and "\n" not in err.value.message


def test_a_generation_config_that_adds_a_logits_processor_is_refused(tiny_vlm: HFVisionLanguageTarget) -> None:
    config = tiny_vlm.model.generation_config
    assert steps_supported(tiny_vlm.model) is None
    config.repetition_penalty = 1.3
    try:
        why = steps_supported(tiny_vlm.model)
    finally:
        config.repetition_penalty = 1.0
    assert why is not None and "repetition_penalty=1.3" in why
