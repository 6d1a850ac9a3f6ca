"""What the unit and integration halves of ``test_observability_checks.py`` share.

Those tests: Step 7: the drift monitor's power on a target's embeddings, and the metrics a server exports.
"""

from __future__ import annotations

from typing import Any

from mmchaos.checks.base import Check
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Finding
from mmchaos.targets.base import Target
from tests.support import run_check_class

DATA = make_shapes(32, seed=5)

SMALL: dict[str, Any] = {"samples": 32, "clean_requests": 1000, "severities": [5], "max_delay_requests": 1000}


def run(check_cls: type[Check], target: Target, params: dict[str, Any]) -> list[Finding]:
    return run_check_class(check_cls, target, params, data=DATA)
