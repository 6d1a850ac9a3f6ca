"""What a run yields: findings with their verdict, severity, step and evidence.

The domain types every layer shares. The run store, the reports and the checks all speak them,
so they live at the bottom of the package and import nothing else of mmchaos.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any

__all__ = ["AVAILABLE_STEPS", "Artifact", "Finding", "Severity", "Step", "Verdict"]


class Step(IntEnum):
    CONTRACT = 1
    ROBUSTNESS = 2
    ADVERSARIAL = 3
    ENGINE = 4
    INTEGRATION = 5
    SERVING = 6
    OBSERVABILITY = 7

    @property
    def label(self) -> str:
        return self.name.lower()


class Verdict(StrEnum):
    PASS = "pass"
    WARN = "warn"
    """Worth a look but no gate broken (e.g. truncation exactly at the model's own limit);
    fails the run only under ``--strict``."""
    FAIL = "fail"
    ERROR = "error"
    SKIPPED = "skipped"


class Severity(StrEnum):
    INFO = "info"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


@dataclass
class Artifact:
    """A file of evidence (repro input, clean/perturbed pair), stored with the run."""

    name: str
    data: bytes
    media_type: str = "image/png"


@dataclass
class Finding:
    """One result of one check: a verdict held against a gate, with metrics and evidence."""

    check: str
    step: Step
    verdict: Verdict
    title: str
    severity: Severity = Severity.INFO
    metrics: dict[str, float] = field(default_factory=dict)
    gate: str = ""
    message: str = ""
    suggestion: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    artifacts: list[Artifact] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "step": int(self.step),
            "step_name": self.step.label,
            "verdict": self.verdict.value,
            "title": self.title,
            "severity": self.severity.value,
            "metrics": {k: float(v) for k, v in self.metrics.items()},
            "gate": self.gate,
            "message": self.message,
            "suggestion": self.suggestion,
            "evidence": self.evidence,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        return cls(
            check=data["check"],
            step=Step(data["step"]),
            verdict=Verdict(data["verdict"]),
            title=data["title"],
            severity=Severity(data["severity"]),
            metrics=dict(data.get("metrics", {})),
            gate=data.get("gate", ""),
            message=data.get("message", ""),
            suggestion=data.get("suggestion", ""),
            evidence=dict(data.get("evidence", {})),
        )


AVAILABLE_STEPS = frozenset(Step)
"""The steps that have checks in this version; the others are reported as not available."""
