"""Saliency that finds key regions: attention rollout on the real tiny-clip against random cells.

Integration tier: it loads the real tiny-clip (``model_dir``). The comparison is seeded and
deterministic; 96 samples, so the margin asserted (0.3 of clean accuracy at 20% of the area;
measured: rollout leaves 0.15, random cells 0.83) is far above what a different draw could move.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mmchaos import perturb
from mmchaos.checks.adversarial.occlusion import OcclusionAttack
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Finding, Step, Verdict
from mmchaos.perturb.base import BindContext
from tests.fakes.broken_targets import is_trained
from tests.support import run_check_class

DATA = make_shapes(96)


@pytest.fixture(scope="module")
def clip(model_dir: Path) -> Any:
    if not is_trained(model_dir):
        pytest.skip("needs the trained built-in tiny-clip")  # pragma: no cover
    from mmchaos.targets.hf import HFContrastiveTarget

    return HFContrastiveTarget(str(model_dir))


@pytest.fixture(scope="module")
def finding(clip: Any) -> Finding:
    [found] = run_check_class(OcclusionAttack, clip, {"samples": 96, "severities": [1, 3]}, data=DATA)
    return found


@pytest.mark.check_contract("occlusion_attack", "clean")
def test_occlusion_attack_passes_tiny_clip_and_keeps_the_random_baseline(finding: Finding) -> None:
    assert finding.verdict == Verdict.PASS, finding.title
    assert finding.step == Step.ADVERSARIAL
    assert finding.evidence["method"] == "attention_rollout" and finding.evidence["fallback"] is None
    assert "random cells of the same area" in finding.title
    for pct in ("5pct", "20pct"):
        assert {f"saliency_relative_{pct}", f"random_relative_{pct}"} <= set(finding.metrics)
    assert finding.metrics["saliency_relative_5pct"] >= 0.3  # the gate: a model of the whole object


def test_attention_rollout_hurts_tiny_clip_more_than_random_cells_of_the_same_area(finding: Finding) -> None:
    m = finding.metrics
    assert m["clean_quality"] > 0.9
    assert m["saliency_relative_20pct"] < m["random_relative_20pct"] - 0.3, m
    assert m["saliency_relative_5pct"] < m["random_relative_5pct"] - 0.2, m


def test_rollout_switches_sdpa_to_eager_for_the_weights_and_back(clip: Any) -> None:
    module = clip.torch_module()
    before = module.config._attn_implementation
    p = perturb.get("saliency_occlusion").bind(BindContext(target=clip, labels=tuple(DATA.classes),
                                                           prompt_template=DATA.prompt_template))  # fmt: skip
    images = [s.load_image() for s in DATA.samples[:4]]
    out, rec = p(images, severity=3, rng=0)
    assert [r["method"] for r in rec.items] == ["attention_rollout"] * 4
    assert all("fallback" not in r for r in rec.items)
    assert module.config._attn_implementation == before, "the target's attention kernel is put back"
    # the cells cover the object: its pixels differ from the background far more than the rest's
    for image, r in zip(images, rec.items, strict=True):
        inside = np.zeros(image.shape[:2], bool)
        for top, left, h, w in r["boxes"]:
            inside[top : top + h, left : left + w] = True
        bg = np.median(np.concatenate([image[0], image[-1]]), axis=0)
        differs = np.linalg.norm(image.astype(float) - bg, axis=2) > 60
        assert differs[inside].mean() > differs[~inside].mean()


def test_attention_rollout_hurts_tiny_clip_more_than_one_random_block_of_the_same_area(
    clip: Any, finding: Finding
) -> None:
    """The issue's defect: at 20% of the area, gradient saliency left 33% of clean accuracy and one
    random block (``block_occlusion``, a random colour) 29%. Rollout must hurt more than the block."""
    from mmchaos.attacks.judge import Judge

    images = [s.load_image() for s in DATA.samples]
    blocked, _ = perturb.get("block_occlusion")(images, severity=3, rng=0)
    block = float(Judge(clip, DATA).correct(list(blocked), list(range(len(DATA)))).mean())
    block_relative = block / finding.metrics["clean_quality"]
    assert finding.metrics["saliency_relative_20pct"] < block_relative - 0.05, (block_relative, finding.metrics)


def test_a_tower_without_attention_weights_falls_back_to_gradients_and_says_why(clip: Any) -> None:
    class NoWeights:
        """The tiny-clip module whose image tower drops its attention weights (a fused kernel)."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.vision_model = self

        encoder = property(lambda self: self.inner.vision_model.encoder)

        def __call__(self, **kwargs: Any) -> Any:
            out = self.inner.vision_model(**kwargs)
            out.attentions = None
            return out

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    class Wrapped(type(clip)):  # type: ignore[misc]
        def __init__(self, inner: Any) -> None:
            self.__dict__.update(inner.__dict__)
            self._module = NoWeights(inner.torch_module())

        def torch_module(self) -> Any:
            return self._module

    p = perturb.get("saliency_occlusion").bind(BindContext(target=Wrapped(clip), labels=tuple(DATA.classes),
                                                           prompt_template=DATA.prompt_template))  # fmt: skip
    _, rec = p([DATA[0].load_image()], severity=3, rng=0)
    assert rec.items[0]["method"] == "gradient"
    assert rec.items[0]["fallback"].startswith("attention rollout failed (the image tower returned no attention")
