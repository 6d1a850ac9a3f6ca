"""The frames and grounding datasets and tasks, and robustness's frame and box perturbations on a VLM.

The fakes answer from the pixels (tests/fakes/sequence.py): a correct reader scores high, one that
sees only the first image of a request or answers boxes in resized coordinates scores low, and
robustness runs ``frame_offset``/``frame_drop``/``bbox_shift`` through the tasks instead of skipping.
"""

from __future__ import annotations

import pytest

from mmchaos import tasks
from mmchaos.checks.base import CheckContext
from mmchaos.checks.robustness.robustness import Robustness, RobustnessGate, RobustnessParams
from mmchaos.data import load_dataset
from mmchaos.data.frames import FRAME_KINDS, make_frames
from mmchaos.data.grounding import GROUNDING_KINDS, make_grounding
from mmchaos.errors import DataError
from mmchaos.findings import Finding, Verdict
from mmchaos.tasks.frames import FramesVQA
from mmchaos.tasks.grounding import Grounding, iou, parse_box
from tests.fakes import sequence as sequence_fakes


def test_frames_set_is_deterministic_index_stable_and_covers_every_kind() -> None:
    a, b = make_frames(30, seed=2), make_frames(45, seed=2)
    for x, y in zip(a, b, strict=False):
        assert x.question == y.question and x.answer == y.answer
        assert all(f.tobytes() == g.tobytes() for f, g in zip(x.meta["frames"], y.meta["frames"], strict=True))
    assert {s.meta["kind"] for s in b} == set(FRAME_KINDS)
    assert all(len(s.meta["frames"]) == 4 and s.image is None for s in b)
    for s in b:  # the answer follows from what the frames show
        shown = [(m["colour"], m["shape"]) for m in s.meta["frame_meta"]]
        if s.meta["kind"] == "which_frame":
            colour, shape = s.question.rstrip("?").split()[-2:]
            assert shown.count((colour, shape)) == 1
            assert shown.index((colour, shape)) == ("one", "two", "three", "four").index(s.answer)
    assert not b.has_images and b.has_questions
    assert len(load_dataset("builtin:frames?n=3&frames=6")[0].meta["frames"]) == 6
    with pytest.raises(DataError, match="frames=2-8"):
        load_dataset("builtin:frames?frames=1")


def test_grounding_set_boxes_cover_the_shapes_and_region_questions_carry_their_box() -> None:
    d = make_grounding(40, seed=1)
    assert {s.meta["kind"] for s in d} == set(GROUNDING_KINDS) and d.has_images and d.has_questions
    for s in d:
        for obj in s.meta["objects"]:
            x0, y0, x1, y1 = (round(v) for v in obj["box"])
            inside = s.image[y0:y1, x0:x1].astype(int)
            assert (abs(inside - s.image[0, 0].astype(int)).sum(axis=2) > 60).mean() > 0.4, "box holds the shape"
        if s.meta["kind"] == "locate":
            assert s.meta["boxes"] == [] and parse_box(s.answer) is not None
        else:
            assert len(s.meta["boxes"]) == 1 and s.meta["template"].format(box="B") in s.question.replace(
                s.question[s.question.index("[") : s.question.index("]") + 1], "B"
            )
    with pytest.raises(DataError, match="builtin:grounding takes"):
        load_dataset("builtin:grounding?frames=3")


def test_box_parsing_and_iou() -> None:
    assert parse_box("It is at [10, 20, 30, 40].") == (10.0, 20.0, 30.0, 40.0)
    assert parse_box("(30,40) to (10,20)") == (10.0, 20.0, 30.0, 40.0)
    assert parse_box("top left") is None and parse_box("[1,2,3]") is None
    assert iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(1 / 3)
    assert iou((0, 0, 1, 1), (2, 2, 3, 3)) == 0.0 and iou((0, 0, 0, 0), (0, 0, 0, 0)) == 0.0


def test_frames_task_correct_reader_passes_first_image_only_fails() -> None:
    data = make_frames(40)
    task = tasks.REGISTRY.get("frames_vqa")(batch_size=8)
    good = task.evaluate(sequence_fakes.FramesPixelTarget(), data)
    broken = task.evaluate(sequence_fakes.FirstFrameOnlyTarget(), data)
    assert good.metric >= 0.85 and good.extra["accuracy_colour_at"] == 1.0
    assert broken.metric <= 0.4, "a server that drops every image after the first must score low"
    assert len(good.outputs) == len(data) and set(good.per_sample) <= {0.0, 1.0}
    assert FramesVQA.supports(sequence_fakes.FramesPixelTarget(), data)
    assert not FramesVQA.supports(sequence_fakes.FramesPixelTarget(), make_grounding(3))


def test_grounding_task_correct_boxes_pass_resized_boxes_fail() -> None:
    data = make_grounding(40)
    task = Grounding(batch_size=8)
    good = task.evaluate(sequence_fakes.GroundingPixelTarget(), data)
    broken = task.evaluate(sequence_fakes.ResizedBoxTarget(), data)
    assert good.metric >= 0.95 and good.extra["mean_iou"] >= 0.8 and good.extra["accuracy_locate"] >= 0.95
    assert broken.extra["accuracy_locate"] <= 0.1 and broken.extra["mean_iou"] <= 0.3
    assert broken.extra["accuracy_region"] == good.extra["accuracy_region"] == 1.0
    assert tasks.default_task("image", sequence_fakes.GroundingPixelTarget(), data) == "grounding"


def test_grounding_task_rerenders_region_questions_from_moved_boxes() -> None:
    data = make_grounding(12)
    region = [i for i, s in enumerate(data) if s.meta["kind"] == "region"]
    asked: list[str] = []

    class Recorder(sequence_fakes.GroundingPixelTarget):
        def answer(self, images: list, question: str) -> str:  # type: ignore[type-arg]
            asked.append(question)
            return super().answer(images, question)

    moved = [[[v + 3 for v in b] for b in s.meta["boxes"]] for s in data]
    Grounding(batch_size=4).evaluate_multimodal(Recorder(), data, boxes=moved)
    for i in region:
        box = [round(v + 3) for v in data[i].meta["boxes"][0]]
        assert asked[i] == f"What colour is the shape in the box [{box[0]},{box[1]},{box[2]},{box[3]}]?"
    assert all(asked[i] == data[i].question for i in range(len(data)) if i not in region)


def _robustness(target: object, spec: str, names: list[str]) -> list[Finding]:
    data = load_dataset(spec)
    ctx = CheckContext(target=target, dataset=data, seed=0, check_id="r")  # type: ignore[arg-type]
    params = RobustnessParams(perturbations=names, samples=len(data), batch_size=16, worst_cases=2)
    return list(Robustness(params, RobustnessGate()).run(ctx))


def test_robustness_runs_frame_perturbations_on_a_vlm_through_the_frames_task() -> None:
    found = _robustness(sequence_fakes.FramesPixelTarget(), "builtin:frames?n=24", ["frame_offset", "frame_drop"])
    by = {f.evidence.get("perturbation"): f for f in found}
    assert not [f for f in found if f.verdict == Verdict.SKIPPED]
    for name in ("frame_offset", "frame_drop"):
        assert by[name].evidence["task"] == "frames_vqa" and "s5" in by[name].metrics
        # the frames really moved: the answers about the clean clip stop holding as severity grows
        assert by[name].metrics["s5"] < by[name].metrics["clean"]


def test_robustness_runs_bbox_shift_on_a_vlm_through_the_grounding_task() -> None:
    found = _robustness(sequence_fakes.GroundingPixelTarget(), "builtin:grounding?n=24", ["bbox_shift"])
    (finding,) = [f for f in found if f.evidence.get("perturbation") == "bbox_shift"]
    assert finding.verdict == Verdict.PASS and finding.evidence["task"] == "grounding"
    assert "mean_iou_s1" in finding.metrics and "accuracy_region_s5" in finding.metrics
    assert not [f for f in found if f.verdict == Verdict.SKIPPED]


def test_frame_perturbations_still_skip_with_the_reason_on_a_dataset_without_frames() -> None:
    found = _robustness(sequence_fakes.GroundingPixelTarget(), "builtin:grounding?n=4", ["frame_drop"])
    (skip,) = found
    assert skip.verdict == Verdict.SKIPPED and "frames" in skip.evidence["reason"]
