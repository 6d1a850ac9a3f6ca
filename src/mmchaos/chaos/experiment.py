"""What the serving checks (step 6) share: the deployment, the budget, the SLO windows, the journal.

An experiment reads like Chaos Toolkit's: a steady-state hypothesis (success rate and p99, with
tolerances) checked before, during and after; a method of bounded load phases with faults put in
and taken out; rollbacks that always run (every fault removed, the proxy and the server the check
started stopped, their ports checked closed); and a journal of it all.

Blast radius: every request of an experiment goes through one :class:`RequestLedger`, inside the
HTTP transport, so the declared budget (requests, rate, duration, loopback only) holds by
construction and is measured afterwards, not assumed. A safeguard aborts the experiment (load
stopped, every fault removed) when the SLO is breached for N consecutive windows in a phase where
it should hold.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import logging
import math
import os
import platform
import socket
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlsplit

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from mmchaos import __version__
from mmchaos.errors import ConfigError
from mmchaos.net import is_loopback_host
from mmchaos.server.config import ServerConfig
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.wrappers import unwrap

if TYPE_CHECKING:
    import httpx

    from mmchaos.chaos.load import LoadResult, PayloadMix, RequestRecord
    from mmchaos.data.base import Dataset
    from mmchaos.proxy.thread import ProxyThread

__all__ = [
    "PROBE_HEADER",
    "BudgetExhausted",
    "BudgetSpec",
    "Deployment",
    "ErrorInspector",
    "Experiment",
    "PayloadSpec",
    "Phase",
    "RequestLedger",
    "SLOSpec",
    "ServingParams",
    "WindowTracker",
    "budgeted_transports",
    "is_typed_error",
    "port_open",
]

log = logging.getLogger(__name__)

PROBE_HEADER = "x-mmchaos-probe"
"""Request header naming the payload kind, so error answers can be attributed (servers ignore it)."""


# --- typed configuration ---------------------------------------------------------------------------


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SLOSpec(_Spec):
    """The steady-state hypothesis: a success rate and a p99 latency, judged per window and per phase."""

    min_success_rate: float = Field(0.99, ge=0.0, le=1.0, description="ok / attempted, 2xx with a valid body")
    p99_ms: float = Field(1000.0, gt=0.0, description="p99 latency of completed requests, ms")
    window_s: float = Field(0.5, ge=0.05, le=60.0, description="length of an SLO window, s")
    min_window_requests: int = Field(3, ge=1, description="fewer events than this: the window is inconclusive")

    def met(self, success_rate: float, p99_ms: float | None) -> bool:
        return success_rate >= self.min_success_rate and p99_ms is not None and p99_ms <= self.p99_ms

    def describe(self) -> str:
        return f"success rate >= {self.min_success_rate:.2%} and p99 <= {self.p99_ms:g} ms"


class BudgetSpec(_Spec):
    """The blast radius an experiment declares and never exceeds (asserted from what was sent)."""

    max_requests: int = Field(10_000, ge=1, le=10_000_000)
    max_rate: float = Field(200.0, gt=0.0, le=100_000.0, description="requests started in any 1 s window")
    max_duration_s: float = Field(
        180.0, gt=0.0, le=86_400.0, description="no request starts later than this after the first, s"
    )
    loopback_only: bool = Field(True, description="refuse any request to a host that is not loopback")


class PayloadSpec(_Spec):
    """The good traffic: OpenAI embeddings requests built from the dataset (embeddings_mix)."""

    samples: int = Field(8, ge=1, le=1024, description="dataset samples the bodies are built from")
    large_side: int = Field(512, ge=16, le=4096, description="side of the 'image_large' JPEGs, px")
    weights: dict[str, float] = Field(
        default_factory=lambda: {"image_small": 1.0, "image_large": 0.25, "text_short": 1.0, "text_long": 0.25}
    )


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
    server: ServerConfig = Field(
        default_factory=lambda: ServerConfig.model_validate({}),
        description="the reference server the check starts for an in-process target (ignored for openai:)",
    )


# --- targets and addresses -------------------------------------------------------------------------


def port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.settimeout(0.5)
        return s.connect_ex((host.strip("[]"), port)) == 0


# --- the budget --------------------------------------------------------------------------------------


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


# --- SLO windows and the safeguard --------------------------------------------------------------


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

    def add(self, record: RequestRecord, now: float) -> None:
        if record.error == "client_shed":
            return
        self._events.append((now, record.error is None, record.latency * 1000.0))

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


# --- one phase of load ---------------------------------------------------------------------------


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

    def met(self, slo: SLOSpec) -> bool:
        return self.result is not None and self.result.attempted > 0 and slo.met(self.success_rate, self.p99_ms)

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


# --- the deployment under test -------------------------------------------------------------------


class Deployment:
    """What the experiment talks to: the ``openai:`` endpoint as is, or the reference server started
    here over the in-process target; with a fault proxy in front. ``close()`` always tears down."""

    def __init__(
        self,
        target: Target,
        server_config: ServerConfig,
        *,
        proxy: bool = True,
        seed: int = 0,
        loopback_only: bool = True,
        served: Target | None = None,
    ) -> None:
        self.target = unwrap(target)
        self.served = served
        self.server_config = server_config
        self.want_proxy = proxy
        self.seed = seed
        self.loopback_only = loopback_only
        self.server: Any = None
        self.proxy: ProxyThread | None = None
        self.root = ""  # scheme://host:port of the service itself
        self.prefix = "/v1"
        self.model = "default"
        self.auth: dict[str, str] = {}
        self.in_process = False
        self.events: list[dict[str, Any]] = []
        self._threads_before: set[int] = set()
        self._ports: list[tuple[str, int, str]] = []

    @property
    def capabilities(self) -> frozenset[Capability]:
        return self.target.capabilities

    @property
    def url(self) -> str:
        """Where the load goes: the proxy when there is one, else the service."""
        return self.proxy.url if self.proxy is not None else self.root

    def start(self) -> Deployment:
        from mmchaos.targets.openai_http import OpenAITarget, check_endpoint

        self._threads_before = {t.ident for t in threading.enumerate() if t.ident is not None}
        if isinstance(self.target, OpenAITarget):
            url, host_header = check_endpoint(self.target.base_url, allow_remote=not self.loopback_only)
            if host_header is not None:
                self.auth["Host"] = host_header
            parts = urlsplit(url)
            self.root = f"{parts.scheme}://{parts.netloc}"
            self.prefix = parts.path.rstrip("/")
            self.model = self.target.model
            key = os.environ.get(self.target.api_key_env)
            if key:
                self.auth["Authorization"] = f"Bearer {key}"
            self.events.append({"action": "use_endpoint", "endpoint": self.target.base_url, "model": self.model})
        else:
            from mmchaos.server import ServerThread

            served = self.served if self.served is not None else self.target
            self.server = ServerThread(served, self.server_config, graceful_timeout=5.0).start()
            self.in_process = True
            self.root = self.server.url
            self.model = self.server.state.model_name
            self._ports.append(("127.0.0.1", int(self.server.port), "server"))
            self.events.append(
                {"action": "start_server", "url": self.root, "target": self.target.uri, "model": self.model}
            )
        if self.want_proxy:
            from mmchaos.proxy.thread import ProxyThread

            parts = urlsplit(self.root)
            if parts.scheme != "http":
                raise ConfigError("the fault proxy speaks plain HTTP only; point the target at an http:// URL")
            upstream = parts.netloc
            proxy = ProxyThread(upstream, seed=self.seed, name="serving")
            proxy.start()
            self.proxy = proxy
            host, port = proxy.address
            self._ports.append((host, int(port), "proxy"))
            self.events.append({"action": "start_proxy", "listen": proxy.listen, "upstream": upstream})
        return self

    def close(self) -> dict[str, Any]:
        """Remove every fault, stop the proxy and the server; report what (if anything) is left."""
        out: dict[str, Any] = {}
        if self.proxy is not None:
            with contextlib.suppress(Exception):
                left = [t.name for t in self.proxy.toxics]
                self.proxy.clear_toxics()
                out["toxics_removed"] = left
            self.proxy.stop()
            self.proxy = None
            out["proxy_stopped"] = True
        if self.server is not None:
            self.server.stop(timeout=10.0)
            self.server = None
            out["server_stopped"] = True
        deadline = time.monotonic() + 3.0
        listening = [f"{what} {h}:{p}" for h, p, what in self._ports if port_open(h, p)]
        while listening and time.monotonic() < deadline:
            time.sleep(0.05)
            listening = [f"{what} {h}:{p}" for h, p, what in self._ports if port_open(h, p)]
        threads = self.leftover_threads()
        while threads and time.monotonic() < deadline:
            time.sleep(0.05)
            threads = self.leftover_threads()
        out["still_listening"] = listening
        out["threads_left"] = threads
        out["clean"] = not listening and not threads
        return out

    def leftover_threads(self) -> list[str]:
        """Threads this deployment started (the proxy's; the server's and its workers' when in-process)."""
        owned = (
            ("mmchaos-proxy-serving", "mmchaos-server-", "mmchaos-serve_")
            if self.in_process
            else ("mmchaos-proxy-serving",)
        )
        return sorted(
            t.name
            for t in threading.enumerate()
            if t.ident not in self._threads_before and t.is_alive() and t.name.startswith(owned)
        )

    def add_toxic(self, toxic: Mapping[str, Any]) -> str:
        if self.proxy is None:
            raise RuntimeError("this deployment has no fault proxy")
        return self.proxy.add_toxic(dict(toxic)).name

    def clear_toxics(self) -> list[str]:
        if self.proxy is None:
            return []
        names = [t.name for t in self.proxy.toxics]
        self.proxy.clear_toxics()
        return names


# --- payloads ------------------------------------------------------------------------------------


def good_mix(ctx: ExperimentContext, dep: Deployment, spec: PayloadSpec) -> PayloadMix:
    from mmchaos.chaos.load import embeddings_mix

    weights = dict(spec.weights)
    if not dep.capabilities & {Capability.EMBED_IMAGE} or not ctx.dataset.has_images:
        weights.update(image_small=0.0, image_large=0.0)
    if Capability.EMBED_TEXT not in dep.capabilities:
        weights.update(text_short=0.0, text_long=0.0)
    if not any(v > 0 for v in weights.values()):
        raise ConfigError("no payload kind is left to send (weights, capabilities and data exclude them all)")
    return embeddings_mix(
        ctx.dataset,
        model=dep.model,
        path=f"{dep.prefix}/embeddings",
        samples=spec.samples,
        large_side=spec.large_side,
        weights=weights,
    )


def image_request_body(model: str, url: str) -> bytes:
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
            "encoding_format": "float",
        }
    ).encode()


def png_data_url(blob: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(blob).decode('ascii')}"


def _png_chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def _png(width: int, height: int, bit_depth: int, colour: int, idat: bytes) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


@lru_cache(maxsize=4)
def bomb_png(side: int) -> bytes:
    """A complete 1-bit ``side`` x ``side`` PNG of zeros: kilobytes encoded, gigabytes as RGB."""
    comp = zlib.compressobj(9)
    row = b"\x00" * (1 + (side + 7) // 8)
    parts = [comp.compress(row * min(512, side - i)) for i in range(0, side, 512)]
    parts.append(comp.flush())
    return _png(side, side, 1, 0, b"".join(parts))


@lru_cache(maxsize=4)
def declared_png(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` RGB but whose data holds one short row."""
    return _png(width, height, 8, 2, zlib.compress(b"\x00" * 4097))


@lru_cache(maxsize=4)
def gradient_jpeg(side: int) -> bytes:
    """A legitimate large image (a smooth gradient, so it stays small encoded)."""
    from PIL import Image

    ramp = np.linspace(0, 255, side, dtype=np.float32)
    img = np.stack([np.add.outer(ramp, ramp) / 2, np.tile(ramp, (side, 1)), np.tile(ramp[:, None], (1, side))], -1)
    buf = io.BytesIO()
    Image.fromarray(img.astype(np.uint8)).save(buf, format="JPEG", quality=75)
    return buf.getvalue()


# --- the journal and the experiment ---------------------------------------------------------------


def _now_iso() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


class Experiment:
    """One Chaos Toolkit-style experiment against a deployment; a context manager whose exit is the
    rollback (it always runs).

    ``phase()`` runs bounded load; ``steady_state()`` is a guarded phase judged against the SLO;
    ``recover()`` measures how long the SLO takes to hold again; ``abort()`` stops everything.
    """

    def __init__(
        self,
        ctx: ExperimentContext,
        params: ServingParams,
        *,
        title: str,
        description: str,
        proxy: bool = True,
        served: Target | None = None,
    ) -> None:
        self.ctx = ctx
        self.params = params
        self.slo = params.slo
        self.title = title
        seed_rng = ctx.rng("experiment")
        self.seed = int(seed_rng.integers(0, 2**31 - 1))
        self.dep = Deployment(
            ctx.target,
            params.server,
            proxy=proxy,
            seed=self.seed,
            loopback_only=params.budget.loopback_only,
            served=served,
        )
        self.ledger = RequestLedger(params.budget)
        self.inspector = ErrorInspector()
        self.aborted: str | None = None
        self.interrupted: str | None = None
        self.phases: list[Phase] = []
        self._phase_no = 0
        self._t0 = time.monotonic()
        self._mix: PayloadMix | None = None
        self.teardown: dict[str, Any] = {}
        self.journal: dict[str, Any] = {
            "mmchaos-version": __version__,
            "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
            "python": sys.version.split()[0],
            "node": platform.node(),
            "experiment": {
                "title": title,
                "description": description,
                "seed": self.seed,
                "run_seed": ctx.seed,
                "steady-state-hypothesis": {
                    "title": "the service answers within its SLO",
                    "probes": [
                        {"name": "success-rate", "tolerance": {"min": params.slo.min_success_rate}},
                        {"name": "p99-latency-ms", "tolerance": {"max": params.slo.p99_ms}},
                    ],
                    "window_s": params.slo.window_s,
                },
                "safeguard": {
                    "abort_after_consecutive_breached_windows": params.abort_after_windows,
                    "window_s": params.slo.window_s,
                },
                "budget": params.budget.model_dump(),
                "load": {
                    "mode": "closed",
                    "concurrency": params.concurrency,
                    "request_timeout_s": params.request_timeout_s,
                },
            },
            "start": _now_iso(),
            "status": "running",
            "deviated": False,
            "steady_states": {"before": None, "during": [], "after": None},
            "run": [],
            "rollbacks": [],
        }

    # -- context manager: setup and the rollback that always runs ------------------------------------

    def __enter__(self) -> Experiment:
        started = time.monotonic()
        try:
            self.dep.start()
        except BaseException:
            self.teardown = self.dep.close()
            raise
        for event in self.dep.events:
            self.activity("action", event.pop("action"), started, event)
        self.journal["experiment"]["deployment"] = {
            "in_process": self.dep.in_process,
            "url": self.dep.url,
            "service": self.dep.root,
            "model": self.dep.model,
            "proxy": self.dep.proxy is not None,
            "server_config": self.params.server.model_dump(mode="json") if self.dep.in_process else None,
        }
        self._mix = good_mix(self.ctx, self.dep, self.params.payload)
        return self

    def __exit__(self, *exc: object) -> None:
        started = time.monotonic()
        self.teardown = self.dep.close()
        self.journal["rollbacks"].append(
            {
                "activity": {"type": "action", "name": "teardown"},
                "status": "succeeded" if self.teardown.get("clean") else "failed",
                "start_s": round(started - self._t0, 3),
                "duration": round(time.monotonic() - started, 3),
                "output": self.teardown,
            }
        )
        if exc[0] is not None and self.journal["status"] == "running":
            self.journal["status"] = "interrupted"
            self.journal["interrupted"] = f"{getattr(exc[0], '__name__', exc[0])}: {exc[1]}"[:500]

    # -- journal ------------------------------------------------------------------------------------

    def activity(
        self, kind: str, name: str, started: float, output: Any, *, status: str = "succeeded", **extra: Any
    ) -> None:
        self.journal["run"].append(
            {
                "activity": {"type": kind, "name": name, **extra},
                "status": status,
                "start_s": round(started - self._t0, 3),
                "duration": round(time.monotonic() - started, 3),
                "output": output,
            }
        )

    def finish(self) -> dict[str, Any]:
        """Close the journal (call after the ``with`` block): status, timings, budget."""
        j = self.journal
        if j["status"] == "running":
            if self.aborted:
                j["status"] = "aborted"
            elif self.interrupted:
                j["status"] = "interrupted"
            else:
                j["status"] = "completed"
        if self.aborted:
            j["aborted"] = self.aborted
        if self.interrupted:
            j["interrupted"] = self.interrupted
        j["end"] = _now_iso()
        j["duration"] = round(time.monotonic() - self._t0, 3)
        j["budget"] = self.ledger.summary()
        j["teardown"] = self.teardown
        return j

    # -- the method ---------------------------------------------------------------------------------

    @property
    def mix(self) -> PayloadMix:
        assert self._mix is not None, "use the experiment as a context manager"
        return self._mix

    def add_toxic(self, toxic: Mapping[str, Any]) -> str:
        started = time.monotonic()
        name = self.dep.add_toxic(toxic)
        self.activity("action", "add_toxic", started, {"toxic": dict(toxic), "name": name}, provider="proxy")
        return name

    def remove_faults(self, why: str = "") -> None:
        started = time.monotonic()
        names = self.dep.clear_toxics()
        self.activity("action", "remove_toxics", started, {"removed": names, "why": why}, provider="proxy")

    def abort(self, reason: str) -> None:
        if self.aborted is None:
            self.aborted = reason
            log.warning("%s: experiment aborted: %s", self.ctx.check_id, reason)
        self.remove_faults(f"abort: {reason}")

    @property
    def stopped(self) -> bool:
        return self.aborted is not None or self.interrupted is not None

    def warmup(self) -> None:
        n = self.params.warmup_requests
        if n and not self.stopped:
            self.phase(
                "warmup",
                seconds=max(5.0, self.params.request_timeout_s * 2),
                guarded=False,
                concurrency=1,
                max_requests=n,
            )

    def phase(
        self,
        label: str,
        *,
        seconds: float,
        guarded: bool,
        mix: PayloadMix | None = None,
        concurrency: int | None = None,
        max_requests: int | None = None,
        stop_when: Callable[[WindowTracker], str | None] | None = None,
        track: Callable[[RequestRecord], bool] | None = None,
        activity: str = "probe",
    ) -> Phase:
        """Run closed-loop load for ``seconds`` (within the budget). A guarded phase has the safeguard:
        ``abort_after_windows`` breached windows in a row abort the experiment."""
        started = time.monotonic()
        seconds = min(seconds, self.ledger.remaining_seconds() - 0.1)
        budget_left = self.ledger.remaining_requests()
        if max_requests is not None:
            budget_left = min(budget_left, max_requests)
        if seconds < min(0.2, self.slo.window_s) or budget_left <= 0:
            why = f"budget spent before {label!r} ({self.ledger.sent} requests, {self.ledger.elapsed():.1f} s)"
            self.interrupted = self.interrupted or why
            ph = Phase(label, guarded, None, [], {}, started - self._t0, 0.0, skipped=why)
            self.phases.append(ph)
            return ph
        self._phase_no += 1
        self.inspector.phase = label
        tracker_box: list[WindowTracker] = []
        result, stop_reason = asyncio.run(
            self._run_load(
                label,
                seconds=seconds,
                guarded=guarded,
                mix=mix or self.mix,
                concurrency=concurrency or self.params.concurrency,
                max_requests=budget_left,
                stop_when=stop_when,
                track=track,
                tracker_box=tracker_box,
            )
        )
        tracker = tracker_box[0]
        ph = Phase(
            label,
            guarded,
            result,
            tracker.windows,
            self.inspector.for_phase(label),
            started - self._t0,
            seconds,
            stop_reason=stop_reason,
        )
        self.phases.append(ph)
        summary = ph.summary(self.slo)
        if guarded:
            summary["max_consecutive_breached_windows"] = tracker.max_consecutive_breaches
        self.activity(activity, f"load:{label}", started, summary, provider="load_driver")
        return ph

    async def _run_load(
        self,
        label: str,
        *,
        seconds: float,
        guarded: bool,
        mix: PayloadMix,
        concurrency: int,
        max_requests: int,
        stop_when: Callable[[WindowTracker], str | None] | None,
        track: Callable[[RequestRecord], bool] | None,
        tracker_box: list[WindowTracker],
    ) -> tuple[LoadResult, str | None]:
        import httpx

        from mmchaos.chaos.load import LoadConfig, LoadDriver

        async_cls, _ = budgeted_transports()
        p = self.params
        inner = httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        )
        transport = async_cls(inner, self.ledger, self.inspector)
        cfg = LoadConfig(
            base_url=self.dep.url,
            mode="closed",
            concurrency=concurrency,
            max_requests=max_requests,
            max_duration=seconds,
            request_timeout=p.request_timeout_s,
            slo_latency_ms=self.slo.p99_ms,
            allow_remote=not p.budget.loopback_only,
            seed=self.seed + self._phase_no,
        )
        loop = asyncio.get_running_loop()
        tracker = WindowTracker(self.slo, loop.time())
        tracker_box.append(tracker)
        stop: list[str] = []
        removed: list[str] = []
        aborted_at: list[float] = []

        def on_record(record: RequestRecord) -> None:
            if track is None or track(record):
                tracker.add(record, loop.time())

        async with httpx.AsyncClient(
            base_url=self.dep.url,
            transport=transport,
            timeout=p.request_timeout_s,
            headers=self.dep.auth,
            trust_env=False,
        ) as client:
            driver = LoadDriver(cfg, mix, client=client, on_record=on_record)
            done = asyncio.Event()

            async def watch() -> None:
                tick = min(0.05, self.slo.window_s / 4)
                while not done.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(done.wait(), tick)
                    tracker.close_until(loop.time(), self.ledger.inflight)
                    if stop:
                        continue
                    if guarded and tracker.consecutive_breaches >= p.abort_after_windows:
                        last = tracker.windows[-1]
                        reason = (
                            f"safeguard: the SLO ({self.slo.describe()}) was breached for "
                            f"{tracker.consecutive_breaches} consecutive {self.slo.window_s:g} s windows during "
                            f"{label!r} (last window: success {last.ok}/{last.events}, p99 {last.p99_ms} ms)"
                        )
                        stop.append(reason)
                        driver.abort(reason)
                        self.aborted = self.aborted or reason
                        aborted_at.append(loop.time())
                        removed.extend(await loop.run_in_executor(None, self.dep.clear_toxics))
                    elif stop_when is not None and (why := stop_when(tracker)) is not None:
                        stop.append(why)
                        driver.abort(why)

            watcher = loop.create_task(watch())
            try:
                result = await driver.run()
            finally:
                done.set()
                await watcher
            tracker.close_final(loop.time())
        if self.aborted and stop and stop[0] == self.aborted:
            self.activity(
                "action",
                "safeguard_abort",
                time.monotonic(),
                {
                    "reason": self.aborted,
                    "phase": label,
                    "at_s": round(aborted_at[0] - tracker.t0, 3) if aborted_at else None,
                    "faults_removed": removed,
                },
            )
        return result, stop[0] if stop else None

    def steady_state(self, which: Literal["before", "after"]) -> Phase:
        ph = self.phase(f"steady_state_{which}", seconds=self.params.baseline_s, guarded=True)
        met = ph.met(self.slo)
        self.journal["steady_states"][which] = {
            "steady_state_met": met,
            "probes": [
                {
                    "name": "success-rate",
                    "tolerance": {"min": self.slo.min_success_rate},
                    "output": round(ph.success_rate, 4),
                    "tolerance_met": ph.success_rate >= self.slo.min_success_rate,
                },
                {
                    "name": "p99-latency-ms",
                    "tolerance": {"max": self.slo.p99_ms},
                    "output": ph.p99_ms,
                    "tolerance_met": ph.p99_ms is not None and ph.p99_ms <= self.slo.p99_ms,
                },
            ],
        }
        if which == "after" and not met:
            self.journal["deviated"] = True
        return ph

    def during(self, label: str, ph: Phase) -> None:
        self.journal["steady_states"]["during"].append(
            {
                "phase": label,
                "steady_state_met": ph.met(self.slo),
                "success_rate": round(ph.success_rate, 4),
                "p99_ms": ph.p99_ms,
            }
        )

    def recover(self, label: str) -> tuple[Phase, float | None]:
        """Load from fresh connections until a window meets the SLO; the seconds from the fault's removal
        to the first good answer of that window (None: not within ``max_recovery_s``, and the
        experiment is aborted)."""
        good: list[float] = []

        def recovered(tracker: WindowTracker) -> str | None:
            for w in tracker.windows:
                if w.met:
                    good.append(w.first_ok if w.first_ok is not None else w.start + self.slo.window_s)
                    return "recovered"
            return None

        ph = self.phase(
            label, seconds=self.params.max_recovery_s + self.slo.window_s, guarded=False, stop_when=recovered
        )
        if ph.result is None:
            return ph, None
        if not good:
            for w in ph.windows:  # the final, partial window may still show it
                if w.met:
                    good.append(w.first_ok if w.first_ok is not None else w.start + self.slo.window_s)
                    break
        seconds = good[0] if good else None
        if seconds is not None and seconds > self.params.max_recovery_s + 1e-9:
            seconds = None
        if seconds is None and not self.stopped:
            self.abort(f"the service did not meet its SLO again within {self.params.max_recovery_s:g} s ({label})")
        return ph, seconds

    def seconds(self) -> float:
        return time.monotonic() - self._t0


def jsonable(value: Any) -> Any:
    """A value made safe for results.json (no NaN, no numpy scalars)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
