"""The occlusion attack on numpy colour readers: a shortcut fails it; the black-box fallback says why."""

from __future__ import annotations

import numpy as np
import pytest

from mmchaos import perturb
from mmchaos.checks.adversarial.occlusion import OcclusionAttack
from mmchaos.findings import Verdict
from mmchaos.perturb.base import BindContext
from mmchaos.perturb.saliency import GRID, random_cells
from tests.fakes.occlusion import ColourVoteTarget, WatermarkTarget, watermarked_data
from tests.support import run_check_class

DATA = watermarked_data(48)


@pytest.mark.check_contract("occlusion_attack", "broken")
def test_occlusion_attack_fails_a_model_that_answers_from_a_corner_mark() -> None:
    [finding] = run_check_class(OcclusionAttack, WatermarkTarget(), {}, data=DATA)
    assert finding.verdict == Verdict.FAIL, finding.title
    m = finding.metrics
    assert m["clean_quality"] == 1.0
    assert m["saliency_relative_5pct"] < 0.3 < m["random_relative_5pct"] - 0.5, m  # the baseline is kept
    assert finding.evidence["method"] == "occlusion"
    assert "no torch module" in finding.evidence["fallback"]


def test_a_robust_black_box_passes_though_nothing_hurts_it() -> None:
    [finding] = run_check_class(OcclusionAttack, ColourVoteTarget(), {}, data=DATA)
    assert finding.verdict == Verdict.PASS, finding.title
    assert finding.metrics["saliency_relative_5pct"] > 0.9


def test_black_box_saliency_records_why_it_fell_back() -> None:
    p = perturb.get("saliency_occlusion").bind(BindContext(target=WatermarkTarget()))
    _, rec = p([DATA[0].load_image()], severity=1, rng=0)
    assert rec.items[0]["method"] == "occlusion"
    assert rec.items[0]["fallback"].startswith("no torch module (no white-box access)")
    _, rec = perturb.get("saliency_occlusion")([DATA[0].load_image()], severity=1, rng=0)
    assert "no target bound" in rec.items[0]["fallback"]


def test_random_cells_blank_as_many_cells_with_the_same_fill_and_replay_by_seed() -> None:
    image = DATA[1].load_image()
    a, pa = random_cells(image, 0.2, np.random.default_rng(3))
    b, pb = random_cells(image, 0.2, np.random.default_rng(3))
    assert np.array_equal(a, b) and pa == pb
    assert len(pa["cells"]) == int(np.ceil(0.2 * GRID * GRID))
    assert pa["fill"] == [round(v) for v in image.reshape(-1, 3).mean(axis=0)]
