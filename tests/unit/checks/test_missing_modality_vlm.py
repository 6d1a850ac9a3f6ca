"""missing_modality on generative targets: questions about a blank or absent image must be answered
with an abstention (scored as a hallucination rate), and an image-only request must not crash."""

from __future__ import annotations

from mmchaos.checks.base import CheckContext
from mmchaos.checks.robustness.missing_modality import MissingModality, MissingModalityParams
from mmchaos.data.vqa import make_vqa
from mmchaos.findings import Verdict
from tests.fakes import vlm as vlm_fakes

DATA = make_vqa(12, seed=1)
PROBES = {"black_image", "white_image", "gray_image", "no_image", "image_only"}


def _run(target: object) -> dict[str, object]:
    ctx = CheckContext(target=target, dataset=DATA, seed=0, check_id="mm")  # type: ignore[arg-type]
    findings = list(MissingModality(MissingModalityParams(image_size=64)).run(ctx))
    return {f.evidence["probe"]: f for f in findings}


def test_a_vlm_that_abstains_passes() -> None:
    found = _run(vlm_fakes.PixelVQATarget())
    assert set(found) == PROBES
    for name, f in found.items():
        assert f.verdict == Verdict.PASS, (name, f.title)  # type: ignore[attr-defined]
    black = found["black_image"]
    assert black.metrics["hallucination_rate"] == 0.0 and black.metrics["questions"] == 4  # type: ignore[attr-defined]
    assert {a["answer"] for a in black.evidence["answers"]} <= {"none", "zero"}  # type: ignore[attr-defined]


def test_a_vlm_that_describes_a_blank_image_fails_with_its_hallucination_rate() -> None:
    found = _run(vlm_fakes.HallucinatingVQATarget())
    for name in ("black_image", "white_image", "gray_image", "no_image"):
        f = found[name]
        assert f.verdict == Verdict.FAIL, name  # type: ignore[attr-defined]
        assert f.metrics["hallucination_rate"] == 1.0 and f.metrics["crashed"] == 0.0  # type: ignore[attr-defined]
        assert f.artifacts or name == "no_image", "the blank image is saved as evidence"  # type: ignore[attr-defined]
    assert "answered as if it held content" in found["gray_image"].title  # type: ignore[attr-defined]
    assert found["image_only"].verdict == Verdict.PASS  # type: ignore[attr-defined]


def test_a_vlm_that_crashes_on_an_image_only_request_fails_that_probe_only() -> None:
    found = _run(vlm_fakes.CrashOnImageOnlyTarget())
    assert found["image_only"].verdict == Verdict.FAIL  # type: ignore[attr-defined]
    assert "IndexError" in found["image_only"].message  # type: ignore[attr-defined]
    assert all(found[n].verdict == Verdict.PASS for n in PROBES - {"image_only"})  # type: ignore[attr-defined]


def test_questions_come_from_the_dataset_when_it_has_them() -> None:
    found = _run(vlm_fakes.PixelVQATarget())
    asked = [a["question"] for a in found["no_image"].evidence["answers"]]  # type: ignore[attr-defined]
    assert asked == list(dict.fromkeys(s.question for s in DATA))[:4]
