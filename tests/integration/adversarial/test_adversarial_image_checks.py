"""The typographic attack and the semantic margin on real models (tiny-clip and broken copies of it).

Integration tier: every test here that takes ``model_dir`` loads the real tiny-clip.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mmchaos.checks.adversarial.semantic_margin import SemanticMargin
from mmchaos.checks.adversarial.typographic_attack import TypographicAttack
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Step, Verdict
from tests.fakes.adversarial import RecordingClock, checker_gain, reads_text
from tests.fakes.broken_targets import is_trained
from tests.support import run_check_class

DATA = make_shapes(16)


def _trained(model_dir: Path) -> None:
    if not is_trained(model_dir):
        pytest.skip("needs the trained built-in tiny-clip")  # pragma: no cover


@pytest.mark.check_contract("typographic_attack", "broken")
def test_typographic_attack_fails_a_model_that_reads_the_written_word(model_dir: Path) -> None:
    target = reads_text(model_dir, DATA.classes)
    [finding] = run_check_class(TypographicAttack, target, {"samples": 16}, data=DATA)
    assert finding.verdict == Verdict.FAIL and finding.step == Step.ADVERSARIAL
    assert finding.metrics["targeted_rate"] > 0.5  # it read the word, not just lost the object under it
    assert finding.metrics["attack_success_rate"] >= finding.metrics["targeted_rate"]
    worst = finding.evidence["worst_cases"]
    assert worst and any(e["written"] == e["prediction"] for e in worst)
    names = {a.name for a in finding.artifacts}
    assert {worst[0]["clean_artifact"], worst[0]["perturbed_artifact"]} <= names
    assert worst[0]["perturbed_score"] < worst[0]["clean_score"]
    # The recorded parameters replay the saved attacked image, byte for byte.
    import io

    from PIL import Image

    from mmchaos.attacks.typographic import replay

    saved = next(a.data for a in finding.artifacts if a.name == worst[0]["perturbed_artifact"])
    again = replay(DATA[worst[0]["index"]].load_image(), worst[0]["params"])
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(saved))), again)


@pytest.mark.check_contract("typographic_attack", "clean")
def test_typographic_attack_passes_tiny_clip(model_dir: Path) -> None:
    _trained(model_dir)
    from mmchaos.targets.hf import HFContrastiveTarget

    [finding] = run_check_class(TypographicAttack, HFContrastiveTarget(str(model_dir)), {"samples": 16}, data=DATA)
    assert finding.verdict == Verdict.PASS, finding.title
    assert finding.metrics["attacked"] >= 12
    assert finding.metrics["targeted_rate"] < 0.25  # a model that never saw text does not read it


def test_typographic_examples_replay_from_their_parameters(model_dir: Path) -> None:
    from mmchaos.attacks.typographic import render, replay

    image = DATA[0].load_image()
    attacked, params = render(image, "blue cross", 4, np.random.default_rng(7))
    assert params["word"] == "blue cross"
    assert np.array_equal(replay(image, params), attacked) and not np.array_equal(attacked, image)


@pytest.mark.check_contract("semantic_margin", "broken")
def test_semantic_margin_fails_a_checkerboard_gain_model(model_dir: Path) -> None:
    _trained(model_dir)
    [finding] = run_check_class(SemanticMargin, checker_gain(model_dir), {"samples": 16}, data=DATA)
    assert finding.verdict == Verdict.FAIL, finding.title
    assert finding.metrics["median"] < 1.0
    assert finding.evidence["per_class_median"] and finding.artifacts
    assert finding.evidence["worst_cases"][0]["moved_to"] != finding.evidence["worst_cases"][0]["truth"]


@pytest.mark.check_contract("semantic_margin", "clean")
def test_semantic_margin_passes_tiny_clip(model_dir: Path) -> None:
    _trained(model_dir)
    from mmchaos.targets.hf import HFContrastiveTarget

    [finding] = run_check_class(SemanticMargin, HFContrastiveTarget(str(model_dir)), {"samples": 16}, data=DATA)
    assert finding.verdict == Verdict.PASS, finding.title
    assert finding.metrics["median"] >= 1.0 and finding.metrics["not_flipped"] == 0
    assert finding.metrics["min"] <= finding.metrics["p10"] <= finding.metrics["median"]


@pytest.mark.integration  # imports torch, which the fast tier does not pay for
def test_deepfool_finds_the_exact_distance_to_a_linear_boundary() -> None:
    """On a linear embedding the linearisation is exact: the margin is |gap| / ||gradient||."""
    torch = pytest.importorskip("torch")
    from mmchaos.attacks.semantic import deepfool_margins

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(2, 3 * 4 * 4, generator=gen)
    x0 = torch.rand(3, 3, 4, 4, generator=gen) * 0.2 + 0.4  # away from the [0, 1] box walls

    def forward(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(len(x), -1) @ w.T + 5.0  # embeddings near (5, 5): cosines nearly linear

    classes = torch.nn.functional.normalize(torch.tensor([[1.0, 0.2], [0.2, 1.0]]), dim=-1)
    with torch.no_grad():
        labels = (torch.nn.functional.normalize(forward(x0), dim=-1) @ classes.T).argmax(1)
    result = deepfool_margins(forward, x0, labels, classes, norm="l2", bisection_steps=20)
    assert np.isfinite(result.l2).all() and (result.flipped_to != labels.numpy()).all()
    with torch.no_grad():  # the found perturbation flips, and half of it does not
        moved = torch.nn.functional.normalize(forward(x0 + result.deltas), dim=-1) @ classes.T
        half = torch.nn.functional.normalize(forward(x0 + 0.5 * result.deltas), dim=-1) @ classes.T
    assert (moved.argmax(1) != labels).all() and (half.argmax(1) == labels).all()
    assert np.allclose(result.l2, result.deltas.reshape(3, -1).norm(dim=1).numpy(), rtol=1e-4)


def test_semantic_margin_counts_its_gradient_work_as_model_time(model_dir: Path) -> None:
    """Before: DeepFool called the torch module directly, outside any model call, so the report's
    model time left out nearly all of this check's model work."""
    import time

    from mmchaos.runner import TimedTarget
    from mmchaos.targets.hf import HFContrastiveTarget

    inner = HFContrastiveTarget(str(model_dir))
    forwards: list[tuple[float, float]] = []
    started: list[float] = []
    tower = inner.model.vision_model
    tower.register_forward_pre_hook(lambda *a: started.append(time.perf_counter()))
    tower.register_forward_hook(lambda *a: forwards.append((started.pop(), time.perf_counter())))
    clock = RecordingClock()
    params = {"samples": 4, "max_iter": 3, "bisection_steps": 2}
    run_check_class(SemanticMargin, TimedTarget(inner, clock), params, data=DATA)
    assert len(forwards) >= 5  # the DeepFool steps and bisections, not just the clean pass
    assert clock.uncounted(forwards) == []
