"""What the server's batching tests share: built-in models behind a gate, one per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mmchaos.targets import load_target
from tests.fakes.server_targets import GatedTarget


def _gated(name: str) -> Iterator[GatedTarget]:
    pytest.importorskip("transformers")
    target = load_target(name)
    yield GatedTarget(target)
    target.close()


@pytest.fixture(scope="module")
def vlm() -> Iterator[GatedTarget]:
    """builtin:tiny-vlm whose model calls a test can hold and let through one by one."""
    yield from _gated("builtin:tiny-vlm")


@pytest.fixture(scope="module")
def clip() -> Iterator[GatedTarget]:
    """builtin:tiny-clip, gated the same way."""
    yield from _gated("builtin:tiny-clip")
