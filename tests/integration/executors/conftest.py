"""The executors' tests share one loaded tiny-clip per module (the fork server and unit workers fork from it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mmchaos.targets import load_target

TINY_CLIP = "builtin:tiny-clip"


@pytest.fixture(scope="module")
def clip() -> Iterator[Any]:
    target = load_target(TINY_CLIP)
    yield target
    target.close()
