"""The blast radius, enforced inside the HTTP transport: every request is booked or refused.

Every request of an experiment goes through one :class:`RequestLedger`, inside the transport, so
the declared budget (requests, rate, duration, loopback only) holds by construction and is measured
afterwards, not assumed. The same transport reads every error answer (:class:`ErrorInspector`):
typed OpenAI-style JSON or garbage, which code, a Retry-After or not.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mmchaos.chaos.spec import BudgetSpec
from mmchaos.net import is_loopback_host

__all__ = [
    "PROBE_HEADER",
    "BudgetExhausted",
    "ErrorInspector",
    "RequestLedger",
    "budgeted_transports",
    "is_typed_error",
]

PROBE_HEADER = "x-mmchaos-probe"
"""Request header naming the payload kind, so error answers can be attributed (servers ignore it)."""


class BudgetExhausted(RuntimeError):
    """A request the declared budget does not allow: never sent."""


class RequestLedger:
    """Books every request against the budget: loopback check, count, strict rate spacing, timing.

    Requests are spaced at least ``1 / max_rate`` apart (measured on the monotonic clock at the
    moment a request is released), so no 1 s window can ever hold more than ``max_rate`` starts.
    """

    def __init__(self, budget: BudgetSpec, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self.clock = clock
        self._gap = (1.0 / budget.max_rate) * (1.0 + 1e-6)
        self._lock = threading.Lock()
        self._last = -math.inf
        self.sent = 0
        self.refused_remote = 0
        self.refused_budget = 0
        self.starts: list[float] = []
        self.first: float | None = None
        self.last_done: float | None = None
        self.inflight: dict[int, float] = {}

    # bookkeeping

    def check_host(self, host: str) -> None:
        if self.budget.loopback_only and not is_loopback_host(host):
            with self._lock:
                self.refused_remote += 1
            raise BudgetExhausted(f"refused: {host} is not a loopback address and the budget is loopback only")

    def elapsed(self) -> float:
        return 0.0 if self.first is None else self.clock() - self.first

    def remaining_requests(self) -> int:
        return max(0, self.budget.max_requests - self.sent)

    def remaining_seconds(self) -> float:
        return self.budget.max_duration_s - self.elapsed()

    def _book(self) -> float:
        """0.0 when a request was booked now, else the seconds to wait before trying again."""
        with self._lock:
            now = self.clock()
            wait = self._last + self._gap - now
            if wait > 0:
                return wait
            if self.sent >= self.budget.max_requests or (
                self.first is not None and now - self.first >= self.budget.max_duration_s
            ):
                self.refused_budget += 1
                raise BudgetExhausted(
                    f"the budget is spent ({self.sent}/{self.budget.max_requests} requests, "
                    f"{self.elapsed():.1f}/{self.budget.max_duration_s:g} s)"
                )
            self._last = now
            self.sent += 1
            self.starts.append(now)
            if self.first is None:
                self.first = now
            return 0.0

    def reserve(self) -> None:
        while (wait := self._book()) > 0:
            time.sleep(wait)

    async def areserve(self) -> None:
        while (wait := self._book()) > 0:
            await asyncio.sleep(wait)

    def started(self, key: int) -> None:
        self.inflight[key] = self.clock()

    def finished(self, key: int) -> None:
        self.inflight.pop(key, None)
        self.last_done = self.clock()

    # what actually happened

    def max_rate_observed(self) -> int:
        """The most request starts in any half-open 1 s window."""
        best, lo = 0, 0
        for hi, t in enumerate(self.starts):
            while t - self.starts[lo] >= 1.0:
                lo += 1
            best = max(best, hi - lo + 1)
        return best

    def summary(self) -> dict[str, Any]:
        duration = 0.0 if self.first is None else max(self.last_done or self.first, self.starts[-1]) - self.first
        rate = self.max_rate_observed()
        respected = (
            self.sent <= self.budget.max_requests
            and rate <= self.budget.max_rate + 1e-9
            and duration <= self.budget.max_duration_s + 0.5  # the deadline cancels what is in flight
            and self.refused_remote == 0
        )
        return {
            "declared": self.budget.model_dump(),
            "sent": self.sent,
            "max_rate_observed": rate,
            "duration_s": round(duration, 3),
            "refused_remote": self.refused_remote,
            "refused_over_budget": self.refused_budget,
            "respected": respected,
        }


# --- what error answers look like ----------------------------------------------------------------


def is_typed_error(body: bytes) -> tuple[bool, str | None]:
    """Whether an error body is an OpenAI-style error (``{"error": {"message", ...}}``, or vLLM's
    flat ``{"object": "error", "message", "type"}``), and its code."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return False, None
    if not isinstance(data, dict):
        return False, None
    err = data.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        code = err.get("code") if err.get("code") is not None else err.get("type")
        return True, None if code is None else str(code)
    if isinstance(data.get("message"), str) and ("type" in data or "code" in data):
        code = data.get("code") if data.get("code") is not None else data.get("type")
        return True, None if code is None else str(code)
    return False, None


@dataclass
class ErrorInspector:
    """Reads the body of every HTTP error answer: typed or garbage, which code, Retry-After or not."""

    phase: str = ""
    counts: dict[tuple[str, str, int, bool, str], int] = field(default_factory=dict)
    missing_retry_after: dict[str, int] = field(default_factory=dict)
    untyped_samples: list[dict[str, Any]] = field(default_factory=list)

    def inspect(self, kind: str, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        typed, code = is_typed_error(body)
        key = (self.phase, kind, status, typed, code or "")
        self.counts[key] = self.counts.get(key, 0) + 1
        if status in (429, 503) and not headers.get("retry-after"):
            self.missing_retry_after[self.phase] = self.missing_retry_after.get(self.phase, 0) + 1
        if not typed and len(self.untyped_samples) < 8:
            self.untyped_samples.append(
                {
                    "phase": self.phase,
                    "kind": kind,
                    "status": status,
                    "content_type": headers.get("content-type", ""),
                    "body": body[:200].decode("utf-8", "replace"),
                }
            )

    def for_phase(self, phase: str) -> dict[str, Any]:
        rows = [(k, n) for k, n in self.counts.items() if k[0] == phase]
        typed = sum(n for k, n in rows if k[3])
        untyped = sum(n for k, n in rows if not k[3])
        by: dict[str, int] = {}
        for (_, kind, status, is_typed, code), n in rows:
            label = f"{kind}:{status}:{code or ('typed' if is_typed else 'untyped')}"
            by[label] = by.get(label, 0) + n
        return {
            "http_errors": typed + untyped,
            "typed": typed,
            "untyped": untyped,
            "missing_retry_after": self.missing_retry_after.get(phase, 0),
            "by_kind_status_code": dict(sorted(by.items())),
            "untyped_samples": [s for s in self.untyped_samples if s["phase"] == phase][:3],
        }

    def outcomes(self, phase: str, kind: str) -> dict[str, int]:
        """``status:code`` counts of the error answers to one payload kind in one phase."""
        out: dict[str, int] = {}
        for (ph, k, status, typed, code), n in self.counts.items():
            if ph == phase and k == kind:
                label = f"{status}:{code if typed else 'untyped'}"
                out[label] = out.get(label, 0) + n
        return out


def budgeted_transports() -> tuple[type[Any], type[Any]]:
    import httpx

    class BudgetedAsyncTransport(httpx.AsyncBaseTransport):
        """Every async request: loopback check, budget, in-flight tracking, error bodies inspected."""

        def __init__(self, inner: httpx.AsyncBaseTransport, ledger: RequestLedger, inspector: ErrorInspector) -> None:
            self.inner = inner
            self.ledger = ledger
            self.inspector = inspector

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            self.ledger.check_host(request.url.host)
            await self.ledger.areserve()
            key = id(request)
            self.ledger.started(key)
            try:
                response = await self.inner.handle_async_request(request)
                if response.status_code >= 400:
                    body = await response.aread()
                    kind = request.headers.get(PROBE_HEADER, "good")
                    self.inspector.inspect(kind, response.status_code, body, response.headers)
                return response
            finally:
                self.ledger.finished(key)

        async def aclose(self) -> None:
            await self.inner.aclose()

    class BudgetedTransport(httpx.BaseTransport):
        """The same for a sync client (the reference client of the retry experiment)."""

        def __init__(self, inner: httpx.BaseTransport, ledger: RequestLedger, inspector: ErrorInspector) -> None:
            self.inner = inner
            self.ledger = ledger
            self.inspector = inspector
            self.attempts: list[tuple[float, int | None]] = []

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            self.ledger.check_host(request.url.host)
            self.ledger.reserve()
            key = id(request)
            self.ledger.started(key)
            status: int | None = None
            try:
                response = self.inner.handle_request(request)
                status = response.status_code
                if response.status_code >= 400:
                    body = response.read()
                    self.inspector.inspect("client", response.status_code, body, response.headers)
                return response
            finally:
                self.attempts.append((self.ledger.clock(), status))
                self.ledger.finished(key)

        def close(self) -> None:
            self.inner.close()

    return BudgetedAsyncTransport, BudgetedTransport
