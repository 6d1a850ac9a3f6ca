"""The generation checks as the registry and suites see them (unit tier: no model is loaded)."""

from __future__ import annotations

import pytest

from mmchaos.checks import REGISTRY
from mmchaos.findings import Step
from mmchaos.suites import load_suite
from mmchaos.targets.base import Capability
from tests.fakes.targets import hash_embed

GENERATION_CHECKS = {
    "generation_batch_invariance": Step.ENGINE,
    "generation_precision": Step.ENGINE,
    "image_token_consistency": Step.ENGINE,
    "image_context_boundary": Step.ENGINE,
    "image_cache_isolation": Step.INTEGRATION,
    "multi_turn_consistency": Step.INTEGRATION,
    "generation_semantics": Step.INTEGRATION,
}


@pytest.mark.parametrize("name", sorted(GENERATION_CHECKS))
def test_generation_check_is_registered_and_needs_generate(name: str) -> None:
    cls = REGISTRY.get(name)
    assert cls.step == GENERATION_CHECKS[name]
    assert all(Capability.GENERATE in alternative for alternative in cls.requires)
    reason = cls().missing_capabilities(hash_embed())  # an embedding-only target skips it, with the reason
    assert reason is not None and "generate" in reason


def test_prelaunch_runs_every_generation_check() -> None:
    names = {c.check for c in load_suite("prelaunch").checks}
    assert set(GENERATION_CHECKS) <= names
    quick = {c.check for c in load_suite("quick").checks}
    assert {
        "generation_batch_invariance",
        "image_token_consistency",
        "image_cache_isolation",
        "generation_semantics",
    } <= quick
    assert "generation_semantics" in {c.check for c in load_suite("serving").checks}
