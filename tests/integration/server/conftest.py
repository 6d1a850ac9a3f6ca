"""What the server's batching tests share: builtin:tiny-vlm behind a gate, one per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mmchaos.targets import load_target
from tests.fakes.server_targets import GatedTarget


@pytest.fixture(scope="module")
def vlm() -> Iterator[GatedTarget]:
    """builtin:tiny-vlm whose model calls a test can hold and let through one by one."""
    pytest.importorskip("transformers")
    target = load_target("builtin:tiny-vlm")
    yield GatedTarget(target)
    target.close()
