"""VQA accuracy and generated-text CER on generative targets, the built-in vqa set, and robustness
(image and text perturbations) on a VLM: degradation curves from a target that answers from the
pixels, a fail for a noise-fragile one."""

from __future__ import annotations

import numpy as np
import pytest

from mmchaos import tasks
from mmchaos.checks.base import CheckContext
from mmchaos.checks.robustness.robustness import Robustness, RobustnessGate, RobustnessParams
from mmchaos.data import load_dataset
from mmchaos.data.base import Dataset, Sample
from mmchaos.data.shapes import COLOURS, render_shape
from mmchaos.data.textlines import make_textlines
from mmchaos.data.vqa import ANSWERS, KINDS, NONE_ANSWERS, make_vqa
from mmchaos.errors import DataError
from mmchaos.findings import Verdict
from mmchaos.tasks.answers import exact_match, is_abstention, normalise_answer, normalised_match
from mmchaos.tasks.generative import GenerativeOCR, VQAAccuracy
from tests.fakes import vlm as vlm_fakes


def test_vqa_set_is_deterministic_index_stable_and_covers_every_kind() -> None:
    a, b = make_vqa(60, seed=3), make_vqa(90, seed=3)
    assert all(x.image.tobytes() == y.image.tobytes() and x.question == y.question for x, y in zip(a, b))
    assert make_vqa(5, seed=3, split="train")[0].image.tobytes() != a[0].image.tobytes()
    assert {s.meta["kind"] for s in a} == set(KINDS)
    assert a.has_questions and a.has_images and not a.has_captions and "question" in a.describe()["fields"]
    for s in b:
        kind = s.meta["kind"]
        assert s.answer == NONE_ANSWERS[kind] if s.meta["empty"] else s.answer in ANSWERS[kind]
    assert any(s.meta["empty"] for s in b), "some images hold no shape: their answer is none/zero"


def test_builtin_vqa_spec() -> None:
    d = load_dataset("builtin:vqa?n=6&seed=1&split=train")
    assert len(d) == 6 and d.source.endswith("n=6") and d[0].id.startswith("vqa-train-")
    with pytest.raises(DataError, match="split"):
        load_dataset("builtin:vqa?split=holdout")


def test_answer_normalisation_and_abstention() -> None:
    assert normalise_answer("  The Grey  Circle. ") == "gray circle"
    assert normalised_match("2", ["two"]) and normalised_match("Top-left", ["top left"])
    assert not normalised_match("", [""]) and not normalised_match("red circle", ["red"])
    assert exact_match(" red ", ["red"]) and not exact_match("Red", ["red"])
    for text in ("none", "Nothing.", "There is no shape in the image.", "I cannot see an image", "0", ""):
        assert is_abstention(text), text
    for text in ("red", "two", "top left", "It is a blue square."):
        assert not is_abstention(text), text


def _red_circle() -> np.ndarray:
    return render_shape("circle", COLOURS["red"], (245, 245, 245), 0.5, (0.5, 0.5), 64, 0.0, np.random.default_rng(0))


def test_vqa_task_scores_a_right_answer_1_and_a_wrong_one_0() -> None:
    img = _red_circle()
    data = Dataset("t", [
        Sample("right", image=img, question="What colour is the shape?", answer="red", meta={"kind": "colour"}),
        Sample("wrong", image=img, question="What colour is the shape?", answer="blue", meta={"kind": "colour"}),
        Sample("alt", image=img, question="How many shapes are there?", answer="1", meta={"kind": "count"}),
    ])  # fmt: skip
    task = VQAAccuracy(batch_size=2)
    assert task.supports(vlm_fakes.PixelVQATarget(), data)
    result = task.evaluate(vlm_fakes.PixelVQATarget(), data)
    assert result.outputs == ["red", "red", "one"]
    assert result.per_sample.tolist() == [1.0, 0.0, 1.0]  # "one" matches "1" after normalisation
    assert result.metric == pytest.approx(2 / 3)
    assert result.extra["exact_match"] == pytest.approx(1 / 3)
    assert result.extra["accuracy_colour"] == 0.5 and result.extra["accuracy_count"] == 1.0
    # texts replace the questions: a question it cannot parse is answered wrong
    bad = task.evaluate(vlm_fakes.PixelVQATarget(), data, texts=["Wht clr?"] * 3)
    assert bad.per_sample.tolist() == [0.0, 0.0, 0.0]


def test_vqa_is_the_default_task_for_generative_targets_and_not_for_others() -> None:
    data = make_vqa(4)
    target = vlm_fakes.PixelVQATarget()
    assert tasks.default_task("image", target, data) == "vqa"
    assert tasks.default_task("text", target, data) == "vqa"
    assert tasks.default_task("image", target, make_textlines(2)) == "vlm_ocr"
    from tests.fakes.targets import HashEmbedTarget

    assert not VQAAccuracy.supports(HashEmbedTarget(), data)


class _Reader(vlm_fakes.PixelVQATarget):
    """Reads a text line by returning the transcription it was built with (honest for the test)."""

    def __init__(self, texts: dict[bytes, str]) -> None:
        self.texts = texts

    def answer(self, img: np.ndarray | None, question: str) -> str:
        return self.texts.get(img.tobytes(), "") if img is not None else ""


def test_generative_ocr_task_measures_cer_of_the_generated_text() -> None:
    data = make_textlines(3, seed=2)
    truth = {s.load_image().tobytes(): s.text or "" for s in data}
    good = GenerativeOCR().evaluate(_Reader(truth), data)
    assert good.metric == 0.0 and good.per_sample.tolist() == [1.0, 1.0, 1.0]
    first = data[0].load_image().tobytes()
    truth[first] = truth[first][:-2]  # two characters short on one line
    worse = GenerativeOCR().evaluate(_Reader(truth), data)
    refs = sum(len(s.text or "") for s in data)
    assert worse.metric == pytest.approx(2 / refs) and worse.per_sample[0] < 1.0


def _robustness(target: object, names: list[str], samples: int = 48) -> list:
    data = make_vqa(samples, seed=0)
    ctx = CheckContext(target=target, dataset=data, seed=0, check_id="r")  # type: ignore[arg-type]
    params = RobustnessParams(perturbations=names, samples=samples, batch_size=16, worst_cases=2)
    return list(Robustness(params, RobustnessGate(min_relative=0.7)).run(ctx))


def test_robustness_on_a_vlm_gives_degradation_curves_for_image_and_text_perturbations() -> None:
    findings = _robustness(vlm_fakes.PixelVQATarget(), ["gaussian_noise", "keyboard_typo", "missing_modality"])
    by = {f.evidence.get("perturbation"): f for f in findings}
    for name in ("gaussian_noise", "keyboard_typo", "missing_modality"):
        f = by[name]
        assert f.evidence["task"] == "vqa", f.evidence
        curve = [f.metrics[f"s{s}"] for s in range(1, 6)]
        assert all(0.0 <= v <= 1.0 for v in curve) and f.metrics["clean"] > 0.8
    typo = by["keyboard_typo"]
    assert typo.metrics["s5"] < typo.metrics["clean"], "typos in the question degrade the answers"
    assert by["gaussian_noise"].verdict == Verdict.PASS
    assert "accuracy_colour_s1" in by["gaussian_noise"].metrics  # per-kind accuracy along the curve
    assert by["whole sweep"].verdict == Verdict.PASS and 0.0 < by["whole sweep"].metrics["score"] <= 1.0


def test_robustness_fails_a_vlm_that_noise_wrecks() -> None:
    findings = _robustness(vlm_fakes.OnePixelVQATarget(), ["gaussian_noise"])
    noise = next(f for f in findings if f.evidence.get("perturbation") == "gaussian_noise")
    assert noise.verdict == Verdict.FAIL
    assert noise.metrics["clean"] > 0.8 and noise.metrics["s3"] < 0.7 * noise.metrics["clean"]


def test_a_generative_target_is_validated_on_the_vqa_set_by_default() -> None:
    from mmchaos.runner import default_data
    from tests.fakes.targets import HashEmbedTarget

    assert default_data(vlm_fakes.PixelVQATarget()) == "builtin:vqa"
    assert default_data(HashEmbedTarget()) == "builtin:shapes"


def test_user_jsonl_carries_questions_and_answers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from PIL import Image

    Image.fromarray(_red_circle()).save(tmp_path / "a.png")
    rows = [{"image": "a.png", "question": "What colour is the shape?", "answer": "red"}]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    data = load_dataset(str(tmp_path / "d.jsonl"))
    assert data.has_questions and VQAAccuracy().evaluate(vlm_fakes.PixelVQATarget(), data).metric == 1.0
    (tmp_path / "e.jsonl").write_text(json.dumps({"image": "a.png", "question": "What colour?"}))
    with pytest.raises(DataError, match="go together"):
        load_dataset(str(tmp_path / "e.jsonl"))


def test_text_perturbations_reach_a_vlm_through_the_questions_even_when_captions_exist() -> None:
    from mmchaos.checks.robustness.robustness import _texts
    from tests.fakes.targets import HashEmbedTarget

    data = make_vqa(3)
    for s in data:
        s.caption = "a caption"
    assert _texts(data, vlm_fakes.PixelVQATarget()) == [s.question for s in data]
    assert _texts(data, HashEmbedTarget()) == ["a caption"] * 3
