"""The check registry. A new check is one module and one line here (or an entry point in the
``mmchaos.checks`` group)."""

from __future__ import annotations

from mmchaos.checks.base import Check, CheckContext, Finding, Severity, Step, Verdict
from mmchaos.registry import Registry

__all__ = ["REGISTRY", "Check", "CheckContext", "Finding", "Severity", "Step", "Verdict"]

REGISTRY: Registry[type[Check]] = Registry("check", "mmchaos.checks")
for _name, _spec in {
    "robustness": "mmchaos.checks.robustness:Robustness",
    "missing_modality": "mmchaos.checks.missing_modality:MissingModality",
    "batch_invariance": "mmchaos.checks.batch_invariance:BatchInvariance",
    "contract": "mmchaos.checks.contract:Contract",
    "precision": "mmchaos.checks.precision:Precision",
    "context_boundary": "mmchaos.checks.context_boundary:ContextBoundary",
    "backend_differential": "mmchaos.checks.backend_differential:BackendDifferential",
    "thread_safety": "mmchaos.checks.thread_safety:ThreadSafety",
    "determinism": "mmchaos.checks.determinism:Determinism",
    "fingerprint_match": "mmchaos.checks.fingerprint_match:FingerprintMatch",
    "serving_faults": "mmchaos.checks.serving:ServingFaults",
    "serving_poison": "mmchaos.checks.serving:ServingPoison",
    "serving_overload": "mmchaos.checks.serving:ServingOverload",
    "serving_resilience": "mmchaos.checks.serving:ServingResilience",
    "drift_detection": "mmchaos.checks.observability:DriftDetection",
    "metrics_exposure": "mmchaos.checks.observability:MetricsExposure",
}.items():
    REGISTRY.register(_name, _spec)
