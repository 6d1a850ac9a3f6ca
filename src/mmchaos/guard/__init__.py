"""Runtime guards for serving code: input contracts, circuit breaking, drift, SLO burn rates and
model fingerprints.

    from mmchaos.guard import Preflight, CircuitBreaker, DriftMonitor, BurnRateSLO, fingerprint

Imports neither torch nor transformers. Names load on first access, so ``import mmchaos.guard``
costs almost nothing and each guard pays only for what it uses (numpy and Pillow for
Preflight and DriftMonitor, nothing heavy for CircuitBreaker and BurnRateSLO).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mmchaos._lazy import lazy_exports

if TYPE_CHECKING:
    from mmchaos.guard.alerts import guard_alert_group, serving_rules, serving_rules_yaml
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
    "guard_alert_group",
    "prometheus_rules_yaml",
    "serving_rules",
    "serving_rules_yaml",
]

_MODULE_OF = {
    **dict.fromkeys(["guard_alert_group", "serving_rules", "serving_rules_yaml"], "mmchaos.guard.alerts"),
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


__getattr__, __dir__ = lazy_exports("mmchaos.guard", _MODULE_OF, globals())
