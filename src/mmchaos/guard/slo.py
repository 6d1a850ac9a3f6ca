"""BurnRateSLO: multiwindow, multi-burn-rate SLO alerts, evaluated in-process and for Prometheus.

The burn rate over a window is the window's error ratio divided by the error budget
(``1 - objective``). An alert fires while the burn rate exceeds its factor over both its long and
its short window (the SRE workbook, "Alerting on SLOs", table 5-8): page at 14.4x over 1h and 5m
and at 6x over 6h and 30m; ticket at 3x over 1d and 2h and at 1x over 3d and 6h. The short window
makes the alert stop soon after the burning does.

Counting is bucketed: a ring of ``resolution``-second buckets covers the longest window, and one
running sum per window is updated when a bucket closes, so memory is fixed whatever the traffic
and :meth:`BurnRateSLO.record` is O(1). The same SLO exports Prometheus recording and alerting
rules over the counters it exposes (``mmchaos_slo_requests_total``, ``mmchaos_slo_errors_total``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import yaml
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mmchaos.errors import ConfigError, UsageError
from mmchaos.guard import _telemetry
from mmchaos.guard._config import build_config, load_yaml_config

__all__ = [
    "SRE_WORKBOOK_ALERTS",
    "BurnRateAlert",
    "BurnRateEvent",
    "BurnRateSLO",
    "BurnRateStatus",
    "SLOConfig",
    "prometheus_rules_yaml",
]

_HOUR = 3600.0
_DAY = 24 * _HOUR


class BurnRateAlert(BaseModel):
    """Fire while the burn rate exceeds ``burn_rate`` over both windows (seconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    severity: Literal["page", "ticket"]
    long_window: float = Field(gt=0.0)
    short_window: float = Field(gt=0.0)
    burn_rate: float = Field(gt=0.0)

    @model_validator(mode="after")
    def _short_is_shorter(self) -> BurnRateAlert:
        if self.short_window > self.long_window:
            raise ValueError("short_window must not exceed long_window")
        return self


SRE_WORKBOOK_ALERTS: tuple[BurnRateAlert, ...] = (
    BurnRateAlert(severity="page", long_window=_HOUR, short_window=300.0, burn_rate=14.4),
    BurnRateAlert(severity="page", long_window=6 * _HOUR, short_window=1800.0, burn_rate=6.0),
    BurnRateAlert(severity="ticket", long_window=_DAY, short_window=2 * _HOUR, burn_rate=3.0),
    BurnRateAlert(severity="ticket", long_window=3 * _DAY, short_window=6 * _HOUR, burn_rate=1.0),
)


_FAMILIES = (
    _telemetry.FamilySpec("mmchaos_slo_requests", "Events counted by an SLO.", "counter", ("slo",)),
    _telemetry.FamilySpec(
        "mmchaos_slo_errors", "Bad events (failed, or too slow for a latency SLO).", "counter", ("slo",)
    ),
    _telemetry.FamilySpec("mmchaos_slo_objective", "The SLO's objective.", "gauge", ("slo",)),
    _telemetry.FamilySpec("mmchaos_slo_burn_rate", "Error-budget burn rate over a window.", "gauge", ("slo", "window")),
    _telemetry.FamilySpec(
        "mmchaos_slo_alert_firing",
        "1 while a burn-rate alert fires.",
        "gauge",
        ("slo", "severity", "long_window", "short_window"),
    ),
)


class SLOConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Label value of every series and rule of this SLO.
    name: str = Field(pattern=r"^[A-Za-z0-9_.:-]+$")
    #: Fraction of good events, e.g. 0.999.
    objective: float = Field(gt=0.0, lt=1.0)
    #: Seconds; when set this is a latency SLO: an event is good if it succeeded within this time.
    latency_threshold: float | None = Field(None, gt=0.0)
    alerts: tuple[BurnRateAlert, ...] = SRE_WORKBOOK_ALERTS
    #: Bucket width in seconds; default: the shortest window / 30 (10 s for the workbook's 5 m).
    resolution: float | None = Field(None, gt=0.0)
    #: The SLO period, only for the rules' annotations.
    period: float = Field(30 * _DAY, gt=0.0)

    @field_validator("alerts")
    @classmethod
    def _some(cls, value: tuple[BurnRateAlert, ...]) -> tuple[BurnRateAlert, ...]:
        if not value:
            raise ValueError("at least one burn-rate alert is needed")
        return value

    @classmethod
    def from_yaml(cls, source: str | Path) -> SLOConfig:
        return load_yaml_config(cls, source, "SLO config")


@dataclass(frozen=True, slots=True)
class BurnRateStatus:
    severity: str
    long_window: float
    short_window: float
    burn_rate: float
    long_burn: float
    short_burn: float
    firing: bool


@dataclass(frozen=True, slots=True)
class BurnRateEvent:
    """An alert started (``firing=True``) or stopped firing."""

    slo: str
    status: BurnRateStatus
    at: float

    @property
    def firing(self) -> bool:
        return self.status.firing


def promql_duration(seconds: float) -> str:
    """Seconds as a PromQL duration in its largest exact unit: 300 -> ``5m``, 86400 -> ``1d``."""
    whole = round(seconds)
    if whole <= 0 or abs(seconds - whole) > 1e-9:
        raise UsageError(f"window {seconds}s is not a whole number of seconds", code="bad_window")
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


class BurnRateSLO:
    """An availability or latency SLO with in-process burn-rate alerts.

    ``slo.record(ok, latency)`` once per request (or ``with slo.track():`` around it);
    ``slo.alerts()`` tells which alerts fire; ``on_alert`` hears them start and stop.
    """

    def __init__(
        self,
        config: SLOConfig | None = None,
        *,
        on_alert: Callable[[BurnRateEvent], object] | Sequence[Callable[[BurnRateEvent], object]] = (),
        clock: Callable[[], float] = time.monotonic,
        registry: CollectorRegistry | None = None,
        tracer: object = None,
        **settings: Any,
    ) -> None:
        self.config = cfg = build_config(SLOConfig, config, settings, "SLO config")
        self.name = cfg.name
        self.budget = 1.0 - cfg.objective
        self._clock = clock
        self._listeners: list[Callable[[BurnRateEvent], object]] = [on_alert] if callable(on_alert) else list(on_alert)
        self._lock = threading.Lock()
        windows = sorted({a.long_window for a in cfg.alerts} | {a.short_window for a in cfg.alerts})
        self.resolution = res = cfg.resolution or windows[0] / 30.0
        self._windows = windows
        self._lengths = [max(1, math.ceil(w / res - 1e-9)) for w in windows]
        self._n = max(self._lengths)
        self._b_total = [0] * self._n
        self._b_bad = [0] * self._n
        self._closed_total = [0] * len(windows)
        self._closed_bad = [0] * len(windows)
        self._head: int | None = None
        self._firing = [False] * len(cfg.alerts)
        self._next_eval = -math.inf
        self.registry = _telemetry.resolve_registry(registry)
        self._tracer = _telemetry.resolve_tracer(tracer)
        self._init_metrics()

    @classmethod
    def from_yaml(cls, source: str | Path, **kwargs: Any) -> BurnRateSLO:
        return cls(SLOConfig.from_yaml(source), **kwargs)

    def add_listener(self, callback: Callable[[BurnRateEvent], object]) -> None:
        self._listeners.append(callback)

    def _init_metrics(self) -> None:
        self._n_requests = self._n_errors = 0
        _telemetry.join_collector(self.registry, "slo", _FAMILIES, self)

    def metric_samples(self) -> list[tuple[str, list[str], float]]:
        """(family, label values, value) of every series; read by the registry at scrape time."""
        name = self.name
        samples: list[tuple[str, list[str], float]] = [
            ("mmchaos_slo_requests", [name], self._n_requests),
            ("mmchaos_slo_errors", [name], self._n_errors),
            ("mmchaos_slo_objective", [name], self.config.objective),
        ]
        now = self._clock()
        rates = self._burn_rates(now)
        samples += [
            ("mmchaos_slo_burn_rate", [name, promql_duration(w)], rate)
            for w, rate in zip(self._windows, rates, strict=True)
        ]
        samples += [
            (
                "mmchaos_slo_alert_firing",
                [name, s.severity, promql_duration(s.long_window), promql_duration(s.short_window)],
                float(s.firing),
            )
            for s in self._statuses(rates)
        ]
        return samples

    # -- counting --------------------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        """Move the ring to the bucket of ``now``; call with the lock held."""
        bucket = math.floor(now / self.resolution)
        head = self._head
        if head is None or bucket - head >= self._n:
            for i in range(self._n):
                self._b_total[i] = self._b_bad[i] = 0
            for j in range(len(self._windows)):
                self._closed_total[j] = self._closed_bad[j] = 0
            self._head = bucket
            return
        n, lengths = self._n, self._lengths
        while head < bucket:  # one step per elapsed bucket, each O(number of windows)
            closing = head % n
            for j, length in enumerate(lengths):
                leaving = (head + 1 - length) % n
                self._closed_total[j] += self._b_total[closing] - self._b_total[leaving]
                self._closed_bad[j] += self._b_bad[closing] - self._b_bad[leaving]
            head += 1
            self._b_total[head % n] = self._b_bad[head % n] = 0
        self._head = head

    def record(self, ok: bool, latency: float | None = None, *, count: int = 1) -> None:
        """Count ``count`` events that succeeded (``ok``) or not, each taking ``latency`` seconds.

        An impossible event (a negative or non-integer count, a NaN, infinite or negative latency) is
        refused with ``bad_event``: a negative count would push the burn rate past any real value (or
        below zero), and a NaN latency would count as good, since no comparison with NaN is true.
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError(f"SLO {self.name!r}: count must be a whole number >= 0, got {count!r}", code="bad_event")
        if latency is not None and (
            isinstance(latency, bool)
            or not isinstance(latency, int | float)
            or not math.isfinite(latency)
            or latency < 0
        ):
            raise ConfigError(
                f"SLO {self.name!r}: latency must be a finite number of seconds >= 0, got {latency!r}", code="bad_event"
            )
        threshold = self.config.latency_threshold
        if threshold is not None:
            if latency is None:
                raise ConfigError(f"latency SLO {self.name!r} needs the latency of every event", code="bad_event")
            bad = not ok or latency > threshold
        else:
            bad = not ok
        now = self._clock()
        with self._lock:
            self._advance(now)
            i = (self._head or 0) % self._n
            self._b_total[i] += count
            self._n_requests += count
            if bad:
                self._b_bad[i] += count
                self._n_errors += count
            evaluate = now >= self._next_eval
        if evaluate:
            self.alerts()

    def track(self) -> _Tracker:
        """``with slo.track():`` records the block: an exception is a failure, the time its latency."""
        return _Tracker(self)

    # -- evaluation ------------------------------------------------------------------------------

    def _ratios(self, now: float) -> list[tuple[int, int]]:
        with self._lock:
            self._advance(now)
            if self._head is None:
                return [(0, 0)] * len(self._windows)
            i = self._head % self._n
            cur_total, cur_bad = self._b_total[i], self._b_bad[i]
            return [
                (self._closed_total[j] + cur_total, self._closed_bad[j] + cur_bad) for j in range(len(self._windows))
            ]

    def _burn_rates(self, now: float) -> list[float]:
        return [bad / total / self.budget if total else 0.0 for total, bad in self._ratios(now)]

    def burn_rates(self) -> list[float]:
        """Burn rate over each distinct window (ascending window length)."""
        return self._burn_rates(self._clock())

    def burn_rate(self, window: float) -> float:
        """Burn rate over one of the configured windows (seconds)."""
        try:
            return self.burn_rates()[self._windows.index(window)]
        except ValueError:
            raise UsageError(f"{window}s is not a window of SLO {self.name!r}", code="bad_window") from None

    def _statuses(self, rates: list[float]) -> list[BurnRateStatus]:
        by_window = dict(zip(self._windows, rates, strict=True))
        out = []
        for alert in self.config.alerts:
            long_burn, short_burn = by_window[alert.long_window], by_window[alert.short_window]
            firing = long_burn > alert.burn_rate and short_burn > alert.burn_rate
            out.append(
                BurnRateStatus(
                    alert.severity,
                    alert.long_window,
                    alert.short_window,
                    alert.burn_rate,
                    long_burn,
                    short_burn,
                    firing,
                )
            )
        return out

    def alerts(self) -> list[BurnRateStatus]:
        """Evaluate every alert now; fires ``on_alert`` for those that started or stopped."""
        now = self._clock()
        statuses = self._statuses(self._burn_rates(now))
        changed = []
        with self._lock:
            for i, status in enumerate(statuses):
                if self._firing[i] != status.firing:
                    self._firing[i] = status.firing
                    changed.append(BurnRateEvent(self.name, status, now))
            self._next_eval = now + self.resolution
        for event in changed:
            if self._tracer is not None:
                _telemetry.add_event(
                    "mmchaos.slo.alert",
                    {"mmchaos.slo": self.name, "severity": event.status.severity, "firing": event.firing},
                )
            _telemetry.fire(self._listeners, event)
        return statuses

    def firing(self) -> list[BurnRateStatus]:
        return [s for s in self.alerts() if s.firing]

    # -- Prometheus rules ------------------------------------------------------------------------

    def prometheus_rules(self, **kwargs: Any) -> dict[str, Any]:
        """A rules file as a mapping (``{"groups": [group]}``): dump it as YAML and Prometheus loads it.

        Takes the options of :meth:`prometheus_rule_group`. A bare group is not a rules file
        (promtool refuses it), so this is what to write; combine SLOs with :func:`prometheus_rules_yaml`.
        """
        return {"groups": [self.prometheus_rule_group(**kwargs)]}

    def prometheus_rule_group(
        self,
        *,
        errors_expr: str | None = None,
        total_expr: str | None = None,
        alert_name: str = "MMChaosSLOErrorBudgetBurn",
        record_prefix: str = "mmchaos_slo",
    ) -> dict[str, Any]:
        """One rule group (an entry of a rules file's ``groups:``): a recording rule per window and
        one alert per severity, in the workbook's form.

        By default the rules read this guard's own counters; ``errors_expr`` and ``total_expr``
        (PromQL with ``{window}`` where the range goes) read any other metrics, e.g.
        ``sum(rate(http_requests_total{code=~"5.."}[{window}]))``.
        """
        sel = f'slo="{self.name}"'
        errors = errors_expr or f"sum(rate(mmchaos_slo_errors_total{{{sel}}}[{{window}}]))"
        total = total_expr or f"sum(rate(mmchaos_slo_requests_total{{{sel}}}[{{window}}]))"
        rules: list[dict[str, Any]] = []
        for window in self._windows:
            dur = promql_duration(window)
            rules.append(
                {
                    "record": f"{record_prefix}:error_ratio:rate{dur}",
                    "expr": f"({errors.replace('{window}', dur)}) / ({total.replace('{window}', dur)})",
                    "labels": {"slo": self.name},
                }
            )
        budget = f"{self.budget:.10g}"
        for severity in ("page", "ticket"):
            terms = [
                f"({record_prefix}:error_ratio:rate{promql_duration(a.long_window)}{{{sel}}}"
                f" > ({a.burn_rate:g} * {budget}) and {record_prefix}:error_ratio:rate"
                f"{promql_duration(a.short_window)}{{{sel}}} > ({a.burn_rate:g} * {budget}))"
                for a in self.config.alerts
                if a.severity == severity
            ]
            if not terms:
                continue
            rules.append(
                {
                    "alert": alert_name,
                    "expr": " or ".join(terms),
                    "labels": {"severity": severity, "slo": self.name},
                    "annotations": {
                        "summary": f"SLO {self.name} is burning its error budget too fast",
                        "description": (
                            f"The {self.config.objective:g} objective of {self.name} "
                            f"(period {promql_duration(self.config.period)}) is burning its budget at a "
                            f"{severity}-level rate."
                        ),
                    },
                }
            )
        return {"name": f"mmchaos-slo-{self.name}", "rules": rules}

    def prometheus_rules_yaml(self, **kwargs: Any) -> str:
        """A rules file (``groups:``) Prometheus loads through ``rule_files``."""
        return prometheus_rules_yaml([self], **kwargs)


def prometheus_rules_yaml(slos: Iterable[BurnRateSLO], **kwargs: Any) -> str:
    """One rules file with a group per SLO."""
    groups = [slo.prometheus_rule_group(**kwargs) for slo in slos]
    return yaml.safe_dump({"groups": groups}, sort_keys=False, width=1000)


class _Tracker:
    __slots__ = ("_slo", "_start")

    def __init__(self, slo: BurnRateSLO) -> None:
        self._slo = slo
        self._start = 0.0

    def __enter__(self) -> _Tracker:
        self._start = time.perf_counter()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._slo.record(exc is None, time.perf_counter() - self._start)

    async def __aenter__(self) -> _Tracker:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)
