"""What a check is, what it yields, and what it gets to work with.

A check is one experiment against a target. It declares the capabilities it needs (it is skipped
with the reason when the target lacks them), validates its parameters and gate with pydantic
models, and yields :class:`Finding` objects. Anything it raises becomes an ``error`` finding: the
harness outlives its target.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict

from mmchaos.targets.base import Capability, Target

if TYPE_CHECKING:
    from mmchaos.data.base import Dataset

__all__ = [
    "ANY_MODALITY",
    "Artifact",
    "Check",
    "CheckContext",
    "CheckGate",
    "CheckParams",
    "Finding",
    "Gate",
    "NullProgress",
    "Params",
    "ProgressSink",
    "Severity",
    "Step",
    "Verdict",
]


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


class CheckParams(BaseModel):
    """Base of every check's parameters: validated at the boundary, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class CheckGate(BaseModel):
    """Base of every check's gate: the thresholds a finding is held against."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# Short names for check modules: ``class MyParams(Params)``.
Params = CheckParams
Gate = CheckGate


class ProgressTask(Protocol):
    def advance(self, n: int = 1) -> None: ...

    def close(self) -> None: ...


class ProgressSink(Protocol):
    """Where long loops report progress; the CLI passes Rich bars, the library passes nothing."""

    def task(self, description: str, total: int) -> ProgressTask: ...


class _NullTask:
    def advance(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class NullProgress:
    def task(self, description: str, total: int) -> ProgressTask:
        return _NullTask()


@dataclass
class CheckContext:
    """Everything a check may use: the target, the data, a seeded generator and a progress sink."""

    target: Target
    dataset: Dataset
    seed: int
    check_id: str
    progress: ProgressSink = field(default_factory=NullProgress)
    max_samples: int | None = None

    def rng(self, *stream: int | str) -> np.random.Generator:
        """A generator seeded by (run seed, check id, stream): independent of run order."""
        words = [self.seed, _stable_int(self.check_id)]
        words += [s if isinstance(s, int) else _stable_int(s) for s in stream]
        return np.random.default_rng(words)


def _stable_int(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


ANY_MODALITY: tuple[frozenset[Capability], ...] = (
    frozenset({Capability.EMBED_IMAGE}),
    frozenset({Capability.EMBED_TEXT}),
    frozenset({Capability.READ_TEXT}),
)
"""``requires`` of checks that work on whatever single modality the target handles."""


class Check:
    """Base class: subclasses set the class attributes and implement :meth:`run`."""

    name: ClassVar[str] = ""
    step: ClassVar[Step]
    requires: ClassVar[tuple[frozenset[Capability], ...]] = ()
    """Alternatives: the check runs when the target has every capability of at least one set."""
    Params: ClassVar[type[CheckParams]] = CheckParams
    Gate: ClassVar[type[CheckGate]] = CheckGate

    def __init__(self, params: CheckParams | None = None, gate: CheckGate | None = None) -> None:
        self.params = params if params is not None else self.Params()
        self.gate = gate if gate is not None else self.Gate()

    def missing_capabilities(self, target: Target) -> str | None:
        """Why this check cannot run on ``target``, or None when it can."""
        if not self.requires or any(target.has(*alt) for alt in self.requires):
            return None
        wanted = " or ".join("+".join(sorted(c.value for c in alt)) for alt in self.requires)
        have = ", ".join(sorted(c.value for c in target.capabilities)) or "none"
        return f"needs {wanted}; target has {have}"

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        raise NotImplementedError

    def finding(self, ctx: CheckContext, verdict: Verdict, title: str, **kw: Any) -> Finding:
        return Finding(check=ctx.check_id, step=self.step, verdict=verdict, title=title, **kw)


CheckFactory = Callable[[dict[str, Any], dict[str, Any]], Check]
