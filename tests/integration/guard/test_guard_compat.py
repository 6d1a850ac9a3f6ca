"""fingerprint / check_compatible / check_consistency: a tokenizer or processor that does not belong
with the weights is refused, naming the components; matching ones pass."""

from __future__ import annotations

import pytest

from mmchaos.guard import (
    fingerprint,
)


@pytest.mark.integration
def test_a_model_directory_hashes_alike_through_the_guard_and_its_hf_target() -> None:
    builtin = pytest.importorskip("mmchaos.targets.builtin")
    pytest.importorskip("transformers")
    from mmchaos.targets import load_target

    served = load_target("builtin:tiny-clip").fingerprint()
    guarded = fingerprint(builtin.TINY_CLIP_DIR)
    for component in ("weights", "tokenizer", "processor", "config"):
        assert getattr(served, component) == getattr(guarded, component), component
