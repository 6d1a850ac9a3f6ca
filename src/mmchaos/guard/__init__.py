"""Runtime guards for serving code: input contracts, circuit breaking, drift, SLO burn rates and
model fingerprints.

    from mmchaos.guard import Preflight, CircuitBreaker, DriftMonitor, BurnRateSLO, fingerprint

Imports neither torch nor transformers. Names load on first access, so ``import mmchaos.guard``
costs almost nothing and each guard pays only for what it uses (numpy and Pillow for
Preflight and DriftMonitor, nothing heavy for CircuitBreaker and BurnRateSLO).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mmchaos.guard.breaker import (
        BreakerConfig,
        BreakerState,
        CallNotPermitted,
        CircuitBreaker,
        Permit,
        SlidingWindowType,
        StateTransition,
    )
    from mmchaos.guard.compat import (
        CompatibilityError,
        Difference,
        check_compatible,
        check_consistency,
        compare_processors,
        consistency_issues,
        fingerprint,
    )
    from mmchaos.guard.drift import DriftAlarm, DriftConfig, DriftMonitor, DriftWindow
    from mmchaos.guard.preflight import (
        PREFLIGHT_CODES,
        CheckedImage,
        InputContract,
        InputTooLargeError,
        MalformedInputError,
        Preflight,
        PreflightError,
        PreflightResult,
        UnprocessableInputError,
        UnsupportedInputError,
    )
    from mmchaos.guard.slo import (
        SRE_WORKBOOK_ALERTS,
        BurnRateAlert,
        BurnRateEvent,
        BurnRateSLO,
        BurnRateStatus,
        SLOConfig,
        prometheus_rules_yaml,
    )

__all__ = [
    "PREFLIGHT_CODES",
    "SRE_WORKBOOK_ALERTS",
    "BreakerConfig",
    "BreakerState",
    "BurnRateAlert",
    "BurnRateEvent",
    "BurnRateSLO",
    "BurnRateStatus",
    "CallNotPermitted",
    "CheckedImage",
    "CircuitBreaker",
    "CompatibilityError",
    "Difference",
    "DriftAlarm",
    "DriftConfig",
    "DriftMonitor",
    "DriftWindow",
    "InputContract",
    "InputTooLargeError",
    "MalformedInputError",
    "Permit",
    "Preflight",
    "PreflightError",
    "PreflightResult",
    "SLOConfig",
    "SlidingWindowType",
    "StateTransition",
    "UnprocessableInputError",
    "UnsupportedInputError",
    "check_compatible",
    "check_consistency",
    "compare_processors",
    "consistency_issues",
    "fingerprint",
    "prometheus_rules_yaml",
]

_MODULE_OF = {
    **dict.fromkeys(
        [
            "BreakerConfig",
            "BreakerState",
            "CallNotPermitted",
            "CircuitBreaker",
            "Permit",
            "SlidingWindowType",
            "StateTransition",
        ],
        "mmchaos.guard.breaker",
    ),
    **dict.fromkeys(
        [
            "CompatibilityError",
            "Difference",
            "check_compatible",
            "check_consistency",
            "compare_processors",
            "consistency_issues",
            "fingerprint",
        ],
        "mmchaos.guard.compat",
    ),
    **dict.fromkeys(["DriftAlarm", "DriftConfig", "DriftMonitor", "DriftWindow"], "mmchaos.guard.drift"),
    **dict.fromkeys(
        [
            "PREFLIGHT_CODES",
            "CheckedImage",
            "InputContract",
            "InputTooLargeError",
            "MalformedInputError",
            "Preflight",
            "PreflightError",
            "PreflightResult",
            "UnprocessableInputError",
            "UnsupportedInputError",
        ],
        "mmchaos.guard.preflight",
    ),
    **dict.fromkeys(
        [
            "SRE_WORKBOOK_ALERTS",
            "BurnRateAlert",
            "BurnRateEvent",
            "BurnRateSLO",
            "BurnRateStatus",
            "SLOConfig",
            "prometheus_rules_yaml",
        ],
        "mmchaos.guard.slo",
    ),
}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'mmchaos.guard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
