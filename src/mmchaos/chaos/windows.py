"""SLO windows and the safeguard's count of consecutive breaches; one load phase and its summary.

Answers are cut into fixed windows by completion time. A request still in flight past the SLO's
p99 counts against its window, so a stalled service breaches windows even when nothing completes:
that is what lets the safeguard abort a hung experiment.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mmchaos.chaos.spec import SLOSpec

if TYPE_CHECKING:
    from mmchaos.chaos.load import LoadResult, RequestRecord

__all__ = ["Phase", "Window", "WindowTracker"]


@dataclass
class Window:
    start: float  # seconds from the phase start
    events: int
    ok: int
    stalled: int
    p99_ms: float | None
    met: bool | None  # None: inconclusive (too few events)
    first_ok: float | None = None  # completion of its first successful request, from the phase start

    def to_list(self) -> list[Any]:
        rate = round(self.ok / self.events, 4) if self.events else None
        return [round(self.start, 3), self.events, rate, self.p99_ms, self.met]


def _p99(latencies_ms: Sequence[float]) -> float | None:
    if not latencies_ms:
        return None
    return round(float(np.percentile(np.asarray(latencies_ms), 99)), 3)


class WindowTracker:
    """Cuts a phase's answers into SLO windows by completion time; counts consecutive breaches.

    A request still in flight at a window's end and older than the SLO's p99 counts as a failed
    event of that window, so a stalled service breaches windows even when nothing completes.
    """

    def __init__(self, slo: SLOSpec, t0: float) -> None:
        self.slo = slo
        self.t0 = t0
        self.windows: list[Window] = []
        self._events: list[tuple[float, bool, float]] = []  # (completion time, ok, latency ms)
        self._next = t0 + slo.window_s
        self.consecutive_breaches = 0
        self.max_consecutive_breaches = 0
        self.n_events = 0  # the whole phase so far (what a sequential stop rule reads)
        self.n_ok = 0
        self.latencies_ms: list[float] = []

    def add(self, record: RequestRecord, now: float) -> None:
        if record.error == "client_shed":
            return
        ok = record.error is None
        self._events.append((now, ok, record.latency * 1000.0))
        self.n_events += 1
        self.n_ok += ok
        self.latencies_ms.append(record.latency * 1000.0)

    def close_until(self, now: float, inflight: Mapping[int, float]) -> list[Window]:
        """Close every window that ended by ``now``."""
        closed = []
        while self._next <= now:
            closed.append(self._close(self._next - self.slo.window_s, self._next, inflight))
            self._next += self.slo.window_s
        return closed

    def close_final(self, now: float) -> None:
        """Close the windows up to ``now`` and the last, partial one (judged if it has enough events)."""
        self.close_until(now, {})
        if self._events:
            self._close(self._next - self.slo.window_s, math.inf, {})

    def _close(self, start: float, end: float, inflight: Mapping[int, float]) -> Window:
        mine = [e for e in self._events if e[0] < end]
        self._events = [e for e in self._events if e[0] >= end]
        limit = self.slo.p99_ms / 1000.0
        stalled = sum(1 for s in inflight.values() if end - s > limit)
        events = len(mine) + stalled
        ok = sum(1 for e in mine if e[1])
        p99 = _p99([e[2] for e in mine])
        if stalled:
            p99 = max(p99 or 0.0, round(self.slo.p99_ms + 1.0, 3))
        met = None if events < self.slo.min_window_requests else self.slo.met(ok / events, p99)
        first_ok = min((e[0] for e in mine if e[1]), default=None)
        window = Window(
            start - self.t0, events, ok, stalled, p99, met, None if first_ok is None else first_ok - self.t0
        )
        self.windows.append(window)
        if met is False:
            self.consecutive_breaches += 1
            self.max_consecutive_breaches = max(self.max_consecutive_breaches, self.consecutive_breaches)
        elif met is True:
            self.consecutive_breaches = 0
        return window


@dataclass
class Phase:
    """One bounded load phase: its LoadResult, its SLO windows and what its error answers were."""

    label: str
    guarded: bool
    result: LoadResult | None
    windows: list[Window]
    errors: dict[str, Any]
    started: float  # seconds from the experiment's start
    seconds: float
    stop_reason: str | None = None
    skipped: str | None = None

    @property
    def success_rate(self) -> float:
        return 0.0 if self.result is None else self.result.success_rate

    @property
    def p99_ms(self) -> float | None:
        return None if self.result is None else self.result.latency.p99_ms

    @property
    def unanswered(self) -> int:
        """Requests still in flight when the phase's drain (the SLO's p99 bound) ran out: slower than
        the bound, though no latency of theirs is among the measured ones. An abort's are not."""
        if self.result is None or self.result.aborted is not None or self.stop_reason is not None:
            return 0
        return self.result.cancelled

    def met(self, slo: SLOSpec) -> bool:
        if self.result is None or self.result.attempted == 0:
            return False
        slow_share = self.unanswered / (self.result.attempted + self.unanswered)
        return slow_share <= 0.01 and slo.met(self.success_rate, self.p99_ms)

    def summary(self, slo: SLOSpec, *, windows: bool = False) -> dict[str, Any]:
        if self.result is None:
            return {"phase": self.label, "skipped": self.skipped}
        r = self.result
        out: dict[str, Any] = {
            "phase": self.label,
            "guarded": self.guarded,
            "started_s": round(self.started, 3),
            "seconds": round(r.duration_s, 3),
            "sent": r.sent,
            "attempted": r.attempted,
            "ok": r.ok,
            "cancelled": r.cancelled,
            "unanswered_past_p99": self.unanswered,
            "success_rate": round(r.success_rate, 4),
            "p50_ms": r.latency.p50_ms,
            "p99_ms": r.latency.p99_ms,
            "max_ms": r.latency.max_ms,
            "throughput_rps": round(r.throughput_rps, 2),
            "errors": dict(r.errors),
            "status_counts": dict(r.status_counts),
            "slo_met": self.met(slo),
            "windows_breached": sum(1 for w in self.windows if w.met is False),
            "windows": len(self.windows),
            "http_errors": self.errors,
        }
        if self.stop_reason:
            out["stopped"] = self.stop_reason
        if windows:
            out["window_table"] = {
                "columns": ["start_s", "events", "success_rate", "p99_ms", "slo_met"],
                "rows": [w.to_list() for w in self.windows],
            }
        return out
