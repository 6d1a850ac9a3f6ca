"""Executors: where the work units of a check run (this process, or Ray actors holding the target).

See :mod:`mmchaos.executors.base` for the interface and ``docs/scale.md`` for usage.
"""

from __future__ import annotations

from mmchaos.executors.base import (
    EXECUTORS,
    Executor,
    ExecutorSpec,
    TargetSpec,
    UnitFn,
    Worker,
)
from mmchaos.executors.factory import LazyExecutor, open_executor
from mmchaos.executors.journal import StoreJournal, UnitJournal, run_units
from mmchaos.executors.local import LocalExecutor

__all__ = [
    "EXECUTORS",
    "Executor",
    "ExecutorSpec",
    "LazyExecutor",
    "LocalExecutor",
    "StoreJournal",
    "TargetSpec",
    "UnitFn",
    "UnitJournal",
    "Worker",
    "open_executor",
    "run_units",
]
