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
}.items():
    REGISTRY.register(_name, _spec)
