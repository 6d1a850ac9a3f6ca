"""The modality_coverage check: a target's untested modalities become warnings, never a silent pass."""

from __future__ import annotations

import pytest

from mmchaos.checks import REGISTRY
from mmchaos.checks.base import CheckContext
from mmchaos.data import load_dataset
from mmchaos.findings import Verdict
from mmchaos.targets.base import Target
from mmchaos.targets.wrappers import DelegatingTarget
from tests.fakes.targets import HashEmbedTarget


class HalfTestedTarget(HashEmbedTarget):
    """Embeds texts and images, but says its images could not be tested (as a probed endpoint would)."""

    def untested_modalities(self) -> dict[str, str]:
        return {"image embeddings": "no image form worked"}


def run(target: Target) -> list[tuple[Verdict, str]]:
    check = REGISTRY.get("modality_coverage")()
    ctx = CheckContext(target=target, dataset=load_dataset("builtin:shapes"), seed=0, check_id="modality_coverage")
    return [(f.verdict, f.title) for f in check.run(ctx)]


@pytest.mark.check_contract("modality_coverage", "clean")
def test_a_fully_tested_target_passes() -> None:
    assert run(HashEmbedTarget()) == [(Verdict.PASS, "tested: embed_image, embed_text")]


@pytest.mark.check_contract("modality_coverage", "broken")
def test_each_untested_modality_is_a_warning_even_through_wrappers() -> None:
    (finding,) = run(DelegatingTarget(HalfTestedTarget()))
    assert finding == (Verdict.WARN, "image embeddings not tested: no image form worked")


def test_a_target_with_no_capability_is_a_warning() -> None:
    empty = Target()
    empty.capabilities = frozenset()
    assert [v for v, _ in run(empty)] == [Verdict.WARN]
