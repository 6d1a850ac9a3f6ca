"""The typographic attack and the semantic margin on real models (tiny-clip and broken copies of it).

Integration tier: every test here that takes ``model_dir`` loads the real tiny-clip.
"""

from __future__ import annotations

from mmchaos.checks.adversarial.semantic_margin import SemanticMargin
from tests.fakes.targets import HashEmbedTarget


def test_semantic_margin_skips_a_target_without_white_box_access() -> None:
    reason = SemanticMargin().missing_capabilities(HashEmbedTarget())
    assert reason is not None and "torch_module" in reason
