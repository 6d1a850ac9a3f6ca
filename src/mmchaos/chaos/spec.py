"""The experiment's typed parameters: the SLO, the blast-radius budget, the good traffic.

Validated at the boundary (pydantic, ``extra="forbid"``, frozen) so a bad suite file fails before
anything starts. :class:`ExperimentContext` is a Protocol, not a check's context, so the engine never
imports :mod:`mmchaos.checks`: the checks depend on the engine, never the reverse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mmchaos.chaos.promql import PromQLError, parse
from mmchaos.server.config import ServerConfig

if TYPE_CHECKING:
    import numpy as np

    from mmchaos.data.base import Dataset
    from mmchaos.targets.base import Target

__all__ = [
    "BudgetSpec",
    "ExperimentContext",
    "PayloadSpec",
    "PromQLProbeSpec",
    "PromQLSpec",
    "SLOSpec",
    "SequentialSpec",
    "ServingParams",
    "Spec",
]


class Spec(BaseModel):
    """Base of every experiment parameter model: unknown keys are an error, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SLOSpec(Spec):
    """The steady-state hypothesis: a success rate and a p99 latency, judged per window and per phase."""

    min_success_rate: float = Field(0.99, ge=0.0, le=1.0, description="ok / attempted, 2xx with a valid body")
    p99_ms: float = Field(1000.0, gt=0.0, description="p99 latency of completed requests, ms")
    window_s: float = Field(0.5, ge=0.05, le=60.0, description="length of an SLO window, s")
    min_window_requests: int = Field(3, ge=1, description="fewer events than this: the window is inconclusive")

    def met(self, success_rate: float, p99_ms: float | None) -> bool:
        return success_rate >= self.min_success_rate and p99_ms is not None and p99_ms <= self.p99_ms

    def describe(self) -> str:
        return f"success rate >= {self.min_success_rate:.2%} and p99 <= {self.p99_ms:g} ms"


class BudgetSpec(Spec):
    """The blast radius an experiment declares and never exceeds (asserted from what was sent)."""

    max_requests: int = Field(10_000, ge=1, le=10_000_000)
    max_rate: float = Field(200.0, gt=0.0, le=100_000.0, description="requests started in any 1 s window")
    max_duration_s: float = Field(
        180.0, gt=0.0, le=86_400.0, description="no request starts later than this after the first, s"
    )
    loopback_only: bool = Field(True, description="refuse any request to a host that is not loopback")


class PayloadSpec(Spec):
    """The good traffic: OpenAI embeddings requests built from the dataset (embeddings_mix), or chat
    completions about its images for a generative target (chat_mix)."""

    samples: int = Field(8, ge=1, le=1024, description="dataset samples the bodies are built from")
    large_side: int = Field(512, ge=16, le=4096, description="side of the 'image_large' JPEGs, px")
    weights: dict[str, float] = Field(
        default_factory=lambda: {"image_small": 1.0, "image_large": 0.25, "text_short": 1.0, "text_long": 0.25}
    )
    max_tokens: int = Field(8, ge=1, le=4096, description="max_tokens of chat requests (generative targets)")
    stream_share: float | None = Field(
        None, ge=0.0, le=1.0, description="share of chat requests streamed (None: the check's default; 0 in most)"
    )


class SequentialSpec(Spec):
    """When a steady-state probe or an overload step may stop early: its SLO verdict decided by an
    SPRT (see :mod:`mmchaos.chaos.sequential`), after ``min_s``; never later than its fixed length."""

    enabled: bool = Field(True, description="false: every phase runs its full length")
    min_s: float = Field(0.5, ge=0.0, le=3600.0, description="no decision before this, s")
    alpha: float = Field(0.05, gt=0.0, lt=0.5, description="P(stop 'breached' | SLO met)")
    beta: float = Field(0.05, gt=0.0, lt=0.5, description="P(stop 'met' | rate = indifference x tolerance)")
    indifference: float = Field(5.0, gt=1.0, le=100.0, description="H1 rate / tolerated rate")


ProbePhase = Literal["before", "during", "after"]


class PromQLProbeSpec(Spec):
    """A PromQL expression that must hold (return a non-empty vector) at the end of each named phase."""

    expr: str = Field(min_length=1, max_length=2000, description="PromQL over the service's /metrics")
    name: str = Field("", max_length=200, description="shown in the journal (default: the expression)")
    phases: tuple[ProbePhase, ...] = Field(("before", "during", "after"), min_length=1)


class PromQLSpec(Spec):
    """PromQL steady-state probes on the service's ``/metrics``, scraped through the experiment
    (see :mod:`mmchaos.chaos.promql_probe`); none by default, and then nothing is scraped."""

    probes: tuple[PromQLProbeSpec, ...] = ()
    engine: Literal["auto", "promtool", "python"] = Field(
        "auto", description="promtool: Prometheus's engine; python: the documented subset; auto: promtool if on PATH"
    )
    scrape_interval_s: float = Field(0.25, ge=0.05, le=60.0, description="time between scrapes, s")
    metrics_path: str = Field("/metrics", pattern=r"^/")
    max_scrapes: int = Field(2000, ge=2, le=100_000, description="scrapes kept (the oldest dropped)")

    @model_validator(mode="after")
    def _subset_parses(self) -> PromQLSpec:
        # The subset is checked up front only where it is the engine: promtool takes all of PromQL.
        if self.engine == "python":
            for p in self.probes:
                try:
                    parse(p.expr)
                except PromQLError as exc:
                    raise ValueError(f"probe {p.name or p.expr!r}: {exc}") from exc
        return self


class ExperimentContext(Protocol):
    """What an experiment needs from the check that runs it (a CheckContext satisfies this)."""

    target: Target
    dataset: Dataset
    seed: int
    check_id: str

    def rng(self, *stream: int | str) -> np.random.Generator: ...


class ServingParams(BaseModel):
    """What every serving experiment takes: budget, SLO, safeguard, load shape, payloads, server."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    budget: BudgetSpec = Field(default_factory=lambda: BudgetSpec.model_validate({}))
    slo: SLOSpec = Field(default_factory=lambda: SLOSpec.model_validate({}))
    abort_after_windows: int = Field(4, ge=1, le=1000, description="safeguard: consecutive breached windows")
    concurrency: int = Field(4, ge=1, le=1024, description="closed-loop requests in flight")
    request_timeout_s: float = Field(2.0, gt=0.0, le=600.0, description="client timeout per request, s")
    warmup_requests: int = Field(16, ge=0, le=10_000, description="sent first, not judged (lazy init, JIT)")
    baseline_s: float = Field(1.5, gt=0.0, le=3600.0, description="steady-state probe length, s")
    max_recovery_s: float = Field(3.0, gt=0.0, le=3600.0, description="SLO must hold again within this, s")
    payload: PayloadSpec = Field(default_factory=lambda: PayloadSpec.model_validate({}))
    sequential: SequentialSpec = Field(default_factory=lambda: SequentialSpec.model_validate({}))
    promql: PromQLSpec = Field(default_factory=lambda: PromQLSpec.model_validate({}))
    server: ServerConfig = Field(
        default_factory=lambda: ServerConfig.model_validate({}),
        description="the reference server the check starts for an in-process target (ignored for openai:)",
    )
