"""Mutation fuzzing of encoded inputs (step 1): mutators, seeds, the loop, minimisation, replay.

The check that runs it is ``contract_fuzz`` (:mod:`mmchaos.checks.contract.fuzz`); a saved
reproducer replays with ``mmchaos fuzz-replay``. This package imports no checks.
"""

from __future__ import annotations

from mmchaos.fuzz.engine import Failure, FuzzConfig, Fuzzer, FuzzReport
from mmchaos.fuzz.seeds import Seed

__all__ = ["Failure", "FuzzConfig", "FuzzReport", "Fuzzer", "Seed"]
