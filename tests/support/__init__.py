"""Helpers that test modules call directly (fixtures live in ``conftest.py``).

One copy of what used to be pasted into several files: the bounded asyncio runner for the proxy
tests and the one-liners that run a check on a target.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from mmchaos.checks.base import Check, CheckContext
from mmchaos.data.base import Dataset
from mmchaos.findings import Finding
from mmchaos.runner import TimedTarget
from mmchaos.targets.base import Target

AIO_LIMIT_S = 20


def assert_no_tasks() -> None:
    """Nothing the test started may still be running on the loop."""
    left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    assert not left, f"tasks left running: {left}"


def aio(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test on a fresh loop, bounded in time, and fail it if it leaves tasks behind."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        async def bounded() -> None:
            async with asyncio.timeout(AIO_LIMIT_S):
                await fn(*args, **kwargs)
            assert_no_tasks()

        asyncio.run(bounded())

    return wrapper


def run_check(check: Any, target: Any, data: Dataset) -> list[Finding]:
    """All findings of ``check`` on ``target`` (timed, as the runner does) over ``data``, seed 0."""
    ctx = CheckContext(target=TimedTarget(target), dataset=data, seed=0, check_id=check.name)
    return list(check.run(ctx))


def run_check_class(
    check_cls: type[Check[Any, Any]],
    target: Target,
    params: dict[str, Any],
    gate: dict[str, Any] | None = None,
    *,
    data: Dataset,
) -> list[Finding]:
    """Build ``check_cls`` from plain dicts (validated as a suite file is) and run it untimed, seed 0."""
    check = check_cls(check_cls.Params.model_validate(params), check_cls.Gate.model_validate(gate or {}))
    return list(check.run(CheckContext(target=target, dataset=data, seed=0, check_id=check_cls.name)))
