"""CircuitBreaker with resilience4j's semantics: rates over a sliding window, not a failure count.

CLOSED records every outcome in a count-based (last N calls) or time-based (last N seconds, one
bucket per second) window. Once the window holds ``minimum_number_of_calls``, a failure rate or a
slow-call rate at or above its threshold opens the breaker. OPEN rejects with
:class:`CallNotPermitted` until ``wait_duration_in_open_state`` has passed; the next call then moves
it to HALF_OPEN, which admits exactly ``permitted_number_of_calls_in_half_open_state`` trial calls
and, once all of them have finished, closes or opens again on their rates. DISABLED admits all
and records nothing; FORCED_OPEN rejects all.

The lock is held only to take a permission and to record an outcome, never while the protected
call runs. An outcome that arrives after the breaker changed state (a call admitted while CLOSED
finishing after it opened) is counted in the metrics but not in the new state's window.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict, Field, field_validator

from mmchaos.errors import MMChaosError
from mmchaos.guard import _telemetry
from mmchaos.guard._config import build_config, load_yaml_config

__all__ = [
    "BreakerConfig",
    "BreakerState",
    "CallNotPermitted",
    "CircuitBreaker",
    "Permit",
    "SlidingWindowType",
    "StateTransition",
]

log = logging.getLogger("mmchaos.guard.breaker")

P = ParamSpec("P")
R = TypeVar("R")


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"
    DISABLED = "disabled"
    FORCED_OPEN = "forced_open"


class SlidingWindowType(StrEnum):
    COUNT_BASED = "count_based"
    TIME_BASED = "time_based"


class BreakerConfig(BaseModel):
    """resilience4j's CircuitBreakerConfig; rates are percentages, durations seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    failure_rate_threshold: float = Field(50.0, gt=0.0, le=100.0)
    slow_call_rate_threshold: float = Field(100.0, gt=0.0, le=100.0)
    slow_call_duration_threshold: float = Field(60.0, gt=0.0)
    sliding_window_type: SlidingWindowType = SlidingWindowType.COUNT_BASED
    #: Calls (COUNT_BASED) or seconds (TIME_BASED).
    sliding_window_size: int = Field(100, ge=1)
    minimum_number_of_calls: int = Field(100, ge=1)
    wait_duration_in_open_state: float = Field(60.0, ge=0.0)
    permitted_number_of_calls_in_half_open_state: int = Field(10, ge=1)
    #: Longest stay in HALF_OPEN before going back to OPEN; 0 waits for the trial calls forever.
    max_wait_duration_in_half_open_state: float = Field(0.0, ge=0.0)

    @field_validator("sliding_window_type", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @classmethod
    def from_yaml(cls, source: str | Path) -> BreakerConfig:
        return load_yaml_config(cls, source, "circuit breaker config")


class CallNotPermitted(MMChaosError):
    """The breaker is OPEN, FORCED_OPEN, or HALF_OPEN with all trial calls taken: HTTP 503."""

    code = "call_not_permitted"

    def __init__(self, name: str, state: BreakerState, retry_after: float | None) -> None:
        wait = f"; retry in {retry_after:.1f}s" if retry_after is not None else ""
        super().__init__(f"circuit breaker {name!r} is {state.value} and does not permit calls{wait}")
        self.name = name
        self.state = state
        #: Seconds until the breaker will try again (a Retry-After header), when known.
        self.retry_after = retry_after

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready body, shaped like :meth:`PreflightError.to_dict`."""
        detail = {"breaker": self.name, "state": self.state.value, "retry_after": self.retry_after}
        return {"code": self.code, "message": self.message, "status": self.http_status, "detail": detail}


@dataclass(frozen=True, slots=True)
class StateTransition:
    name: str
    from_state: BreakerState
    to_state: BreakerState
    #: The breaker's clock reading at the transition.
    at: float
    failure_rate: float = -1.0
    slow_call_rate: float = -1.0


class _CountWindow:
    """The outcomes of the last ``size`` calls in a ring of flag bytes, with running totals."""

    __slots__ = ("calls", "failed", "head", "ring", "size", "slow")

    def __init__(self, size: int) -> None:
        self.size = size
        self.ring = bytearray(size)  # bit 0 failed, bit 1 slow, bit 2 present
        self.head = 0
        self.calls = self.failed = self.slow = 0

    def record(self, now: float, failed: bool, slow: bool) -> None:
        old = self.ring[self.head]
        if old:
            self.calls -= 1
            self.failed -= old & 1
            self.slow -= (old >> 1) & 1
        self.ring[self.head] = 4 | failed | (slow << 1)
        self.head = (self.head + 1) % self.size
        self.calls += 1
        self.failed += failed
        self.slow += slow

    def totals(self, now: float) -> tuple[int, int, int]:
        return self.calls, self.failed, self.slow


class _TimeWindow:
    """Outcomes of the last ``size`` seconds in one bucket per second; amortised O(1) a call."""

    __slots__ = ("b_calls", "b_failed", "b_slow", "calls", "failed", "head", "size", "slow")

    def __init__(self, size: int) -> None:
        self.size = size
        self.b_calls = [0] * size
        self.b_failed = [0] * size
        self.b_slow = [0] * size
        self.head: int | None = None  # the epoch second of the newest bucket
        self.calls = self.failed = self.slow = 0

    def _advance(self, now: float) -> int:
        second = int(now // 1)
        head = self.head
        if head is None or second - head >= self.size:
            if head is not None:
                for i in range(self.size):
                    self.b_calls[i] = self.b_failed[i] = self.b_slow[i] = 0
                self.calls = self.failed = self.slow = 0
            self.head = second
            return second
        if second <= head:  # same second, or a clock that stepped back: keep the newest bucket
            return head
        for s in range(head + 1, second + 1):  # each bucket is cleared once per pass: amortised O(1)
            i = s % self.size
            self.calls -= self.b_calls[i]
            self.failed -= self.b_failed[i]
            self.slow -= self.b_slow[i]
            self.b_calls[i] = self.b_failed[i] = self.b_slow[i] = 0
        self.head = second
        return second

    def record(self, now: float, failed: bool, slow: bool) -> None:
        i = self._advance(now) % self.size
        self.b_calls[i] += 1
        self.b_failed[i] += failed
        self.b_slow[i] += slow
        self.calls += 1
        self.failed += failed
        self.slow += slow

    def totals(self, now: float) -> tuple[int, int, int]:
        self._advance(now)
        return self.calls, self.failed, self.slow


_FAMILIES = (
    _telemetry.FamilySpec(
        "mmchaos_breaker_calls", "Calls through a circuit breaker, by kind.", "counter", ("name", "kind")
    ),
    _telemetry.FamilySpec(
        "mmchaos_breaker_slow_calls", "Calls slower than the slow-call threshold.", "counter", ("name", "kind")
    ),
    _telemetry.FamilySpec(
        "mmchaos_breaker_transitions",
        "Circuit breaker state transitions.",
        "counter",
        ("name", "from_state", "to_state"),
    ),
    _telemetry.FamilySpec(
        "mmchaos_breaker_state", "1 for the breaker's current state, else 0.", "gauge", ("name", "state")
    ),
    _telemetry.FamilySpec(
        "mmchaos_breaker_failure_rate",
        "Failure rate (%) over the window; -1 below the minimum calls.",
        "gauge",
        ("name",),
    ),
    _telemetry.FamilySpec(
        "mmchaos_breaker_slow_call_rate",
        "Slow-call rate (%) over the window; -1 below the minimum calls.",
        "gauge",
        ("name",),
    ),
    _telemetry.FamilySpec("mmchaos_breaker_buffered_calls", "Calls held in the sliding window.", "gauge", ("name",)),
)


_ACTIVE: ContextVar[tuple[tuple[CircuitBreaker, Permit], ...]] = ContextVar("mmchaos_breaker_permits", default=())


class Permit:
    """One admitted call: report how it ended exactly once (``success``, ``failure``, ``release``).

    For calls that do not fit a decorator or a ``with`` block, e.g. a streamed response::

        permit = breaker.acquire()      # raises CallNotPermitted
        try:
            ...
        except Exception as exc:
            permit.failure(exc)
            raise
        else:
            permit.success()
    """

    __slots__ = ("_breaker", "_done", "_generation", "_start")

    def __init__(self, breaker: CircuitBreaker, generation: int, start: float) -> None:
        self._breaker = breaker
        self._generation = generation
        self._start = start
        self._done = False

    def _finish(self) -> bool:
        if self._done:
            return False
        self._done = True
        return True

    def success(self, result: object = None) -> None:
        """The call returned (``result`` goes through the breaker's ``record_result``)."""
        if self._finish():
            self._breaker._on_return(self._generation, self._start, result)

    def failure(self, exc: BaseException) -> None:
        """The call raised ``exc``; the breaker's predicates decide whether it counts."""
        if self._finish():
            self._breaker._on_exception(self._generation, self._start, exc)

    def release(self) -> None:
        """The call was abandoned (cancelled): free its half-open slot without recording it."""
        if self._finish():
            self._breaker._release(self._generation)


class CircuitBreaker:
    """A resilience4j-style circuit breaker for sync and async calls.

    Use it as a decorator (``@breaker`` on a function or ``async def``), a context manager
    (``with breaker:`` / ``async with breaker:``), ``breaker.call(fn, ...)``, or through
    :meth:`acquire` and a :class:`Permit`. ``clock`` (monotonic seconds) is injectable for tests.

    Which exceptions count: ``ignore_exceptions`` and ``ignore_exception`` win and are neither
    success nor failure; else ``record_exceptions`` / ``record_exception`` are failures; any
    other exception counts as a success, as in resilience4j. ``record_result`` marks returned
    values as failures (e.g. an HTTP 503 response object). Cancellation (BaseException that is not
    an Exception) releases the call without recording it.
    """

    def __init__(
        self,
        name: str = "breaker",
        config: BreakerConfig | None = None,
        *,
        record_exceptions: Sequence[type[BaseException]] = (Exception,),
        ignore_exceptions: Sequence[type[BaseException]] = (),
        record_exception: Callable[[BaseException], bool] | None = None,
        ignore_exception: Callable[[BaseException], bool] | None = None,
        record_result: Callable[[Any], bool] | None = None,
        on_state_change: Callable[[StateTransition], object] | Sequence[Callable[[StateTransition], object]] = (),
        clock: Callable[[], float] = time.monotonic,
        registry: CollectorRegistry | None = None,
        tracer: object = None,
        **settings: Any,
    ) -> None:
        self.name = name
        self.config = cfg = build_config(BreakerConfig, config, settings, "circuit breaker config")
        self._record_types = tuple(record_exceptions)
        self._ignore_types = tuple(ignore_exceptions)
        self._record_pred = record_exception
        self._ignore_pred = ignore_exception
        self._record_result = record_result
        self._listeners: list[Callable[[StateTransition], object]] = (
            [on_state_change] if callable(on_state_change) else list(on_state_change)
        )
        self._clock = clock
        self._lock = threading.Lock()
        self._slow_threshold = cfg.slow_call_duration_threshold
        self._failure_threshold = cfg.failure_rate_threshold
        self._slow_rate_threshold = cfg.slow_call_rate_threshold
        self._min_calls = (
            min(cfg.minimum_number_of_calls, cfg.sliding_window_size)
            if cfg.sliding_window_type is SlidingWindowType.COUNT_BASED
            else cfg.minimum_number_of_calls
        )
        self._half_open_calls = cfg.permitted_number_of_calls_in_half_open_state
        self._state = BreakerState.CLOSED
        self._generation = 0
        self._window = self._new_window()
        self._state_since = clock()
        self._open_until = 0.0
        self._ho_permits = 0
        self._ho_calls = self._ho_failed = self._ho_slow = 0
        self.registry = _telemetry.resolve_registry(registry)
        self._tracer = _telemetry.resolve_tracer(tracer)
        self._init_metrics()

    # -- configuration ---------------------------------------------------------------------------

    @classmethod
    def from_yaml(cls, source: str | Path, name: str = "breaker", **kwargs: Any) -> CircuitBreaker:
        return cls(name, BreakerConfig.from_yaml(source), **kwargs)

    def add_listener(self, callback: Callable[[StateTransition], object]) -> None:
        """Call ``callback(StateTransition)`` after every state change (outside the lock)."""
        self._listeners.append(callback)

    def _new_window(self) -> _CountWindow | _TimeWindow:
        cfg = self.config
        if cfg.sliding_window_type is SlidingWindowType.COUNT_BASED:
            return _CountWindow(cfg.sliding_window_size)
        return _TimeWindow(cfg.sliding_window_size)

    def _init_metrics(self) -> None:
        self._n_ok = self._n_failed = self._n_ignored = self._n_rejected = 0
        self._n_slow_ok = self._n_slow_failed = 0
        self._n_transitions: dict[tuple[str, str], int] = {}
        _telemetry.join_collector(self.registry, "breaker", _FAMILIES, self)

    def metric_samples(self) -> list[tuple[str, list[str], float]]:
        """(family, label values, value) of every series; read by the registry at scrape time."""
        name = self.name
        failure_rate, slow_rate = self.rates()
        samples: list[tuple[str, list[str], float]] = [
            ("mmchaos_breaker_calls", [name, "successful"], self._n_ok),
            ("mmchaos_breaker_calls", [name, "failed"], self._n_failed),
            ("mmchaos_breaker_calls", [name, "ignored"], self._n_ignored),
            ("mmchaos_breaker_calls", [name, "not_permitted"], self._n_rejected),
            ("mmchaos_breaker_slow_calls", [name, "successful"], self._n_slow_ok),
            ("mmchaos_breaker_slow_calls", [name, "failed"], self._n_slow_failed),
            ("mmchaos_breaker_failure_rate", [name], failure_rate),
            ("mmchaos_breaker_slow_call_rate", [name], slow_rate),
            ("mmchaos_breaker_buffered_calls", [name], self.buffered_calls()),
        ]
        state = self._state
        samples += [("mmchaos_breaker_state", [name, st.value], float(st is state)) for st in BreakerState]
        samples += [
            ("mmchaos_breaker_transitions", [name, old, new], count)
            for (old, new), count in list(self._n_transitions.items())
        ]
        return samples

    # -- state -----------------------------------------------------------------------------------

    @property
    def minimum_calls(self) -> int:
        """Calls the window must hold before a rate can open the breaker (``minimum_number_of_calls``,
        at most the window's size when it counts calls)."""
        return self._min_calls

    @property
    def state(self) -> BreakerState:
        """The current state (OPEN turns HALF_OPEN only when the next call asks, as resilience4j)."""
        return self._state

    def rates(self) -> tuple[float, float]:
        """(failure rate %, slow-call rate %) over the current window; -1 below the minimum calls."""
        with self._lock:
            if self._state is BreakerState.HALF_OPEN:
                calls, failed, slow, minimum = self._ho_calls, self._ho_failed, self._ho_slow, self._half_open_calls
            else:
                calls, failed, slow = self._window.totals(self._clock())
                minimum = self._min_calls
        if calls < minimum or calls == 0:
            return -1.0, -1.0
        return 100.0 * failed / calls, 100.0 * slow / calls

    def buffered_calls(self) -> int:
        """Calls held in the current window (the half-open trial calls while HALF_OPEN)."""
        with self._lock:
            if self._state is BreakerState.HALF_OPEN:
                return self._ho_calls
            return self._window.totals(self._clock())[0]

    def _to(self, state: BreakerState, now: float, rates: tuple[float, float] = (-1.0, -1.0)) -> StateTransition:
        """Switch state; call with the lock held, fire the returned transition after releasing it."""
        old = self._state
        self._state = state
        self._generation += 1
        self._state_since = now
        if state is BreakerState.OPEN:
            self._open_until = now + self.config.wait_duration_in_open_state
        elif state is BreakerState.HALF_OPEN:
            self._ho_permits = self._half_open_calls
            self._ho_calls = self._ho_failed = self._ho_slow = 0
        elif state is BreakerState.CLOSED:
            self._window = self._new_window()
        key = (old.value, state.value)
        self._n_transitions[key] = self._n_transitions.get(key, 0) + 1
        return StateTransition(self.name, old, state, now, rates[0], rates[1])

    def _announce(self, transitions: list[StateTransition]) -> None:
        for tr in transitions:
            log.info("circuit breaker %r: %s -> %s", self.name, tr.from_state.value, tr.to_state.value)
            if self._tracer is not None:
                _telemetry.add_event(
                    "mmchaos.breaker.transition",
                    {"mmchaos.guard": self.name, "from": tr.from_state.value, "to": tr.to_state.value},
                )
            _telemetry.fire(self._listeners, tr)

    def _manual(self, state: BreakerState) -> None:
        with self._lock:
            tr = self._to(state, self._clock())
        self._announce([tr])

    def transition_to_closed(self) -> None:
        self._manual(BreakerState.CLOSED)

    def transition_to_open(self) -> None:
        self._manual(BreakerState.OPEN)

    def transition_to_half_open(self) -> None:
        self._manual(BreakerState.HALF_OPEN)

    def transition_to_disabled(self) -> None:
        self._manual(BreakerState.DISABLED)

    def transition_to_forced_open(self) -> None:
        self._manual(BreakerState.FORCED_OPEN)

    def reset(self) -> None:
        """Back to CLOSED with an empty window."""
        self._manual(BreakerState.CLOSED)

    # -- permission and outcomes -----------------------------------------------------------------

    def _acquire(self) -> tuple[int, float]:
        """Take a permission: (the state generation it was taken in, the clock reading)."""
        now = self._clock()
        transitions: list[StateTransition] = []
        admitted = False
        generation = -1
        with self._lock:
            state = self._state
            if state is BreakerState.CLOSED or state is BreakerState.DISABLED:
                return self._generation, now
            if state is BreakerState.OPEN and now >= self._open_until:
                transitions.append(self._to(BreakerState.HALF_OPEN, now))
                state = BreakerState.HALF_OPEN
            if state is BreakerState.HALF_OPEN:
                max_wait = self.config.max_wait_duration_in_half_open_state
                if max_wait > 0 and now - self._state_since >= max_wait:
                    transitions.append(self._to(BreakerState.OPEN, now))
                    state = BreakerState.OPEN
                elif self._ho_permits > 0:
                    self._ho_permits -= 1
                    generation = self._generation
                    admitted = True
            if not admitted:
                self._n_rejected += 1
            retry_after = max(0.0, self._open_until - now) if state is BreakerState.OPEN else None
        if transitions:
            self._announce(transitions)
        if admitted:
            return generation, now
        if self._tracer is not None:
            _telemetry.add_event("mmchaos.breaker.rejected", {"mmchaos.guard": self.name, "state": state.value})
        raise CallNotPermitted(self.name, state, retry_after)

    def acquire(self) -> Permit:
        """Take a permission for one call, or raise :class:`CallNotPermitted`."""
        generation, now = self._acquire()
        return Permit(self, generation, now)

    def _release(self, generation: int, ignored: bool = False) -> None:
        with self._lock:
            if ignored:
                self._n_ignored += 1
            if generation == self._generation and self._state is BreakerState.HALF_OPEN:
                self._ho_permits += 1

    def _on_exception(self, generation: int, start: float, exc: BaseException) -> None:
        if not isinstance(exc, Exception):  # cancellation, KeyboardInterrupt, GeneratorExit
            self._release(generation)
            return
        if isinstance(exc, self._ignore_types) or (self._ignore_pred is not None and self._ignore_pred(exc)):
            self._release(generation, ignored=True)
            return
        failed = isinstance(exc, self._record_types) or (self._record_pred is not None and self._record_pred(exc))
        self._record(generation, start, failed)

    def _on_return(self, generation: int, start: float, result: object) -> None:
        failed = self._record_result is not None and bool(self._record_result(result))
        self._record(generation, start, failed)

    def _record(self, generation: int, start: float, failed: bool) -> None:
        now = self._clock()
        slow = now - start >= self._slow_threshold
        transition: StateTransition | None = None
        with self._lock:
            if failed:
                self._n_failed += 1
                self._n_slow_failed += slow
            else:
                self._n_ok += 1
                self._n_slow_ok += slow
            if generation == self._generation:
                state = self._state
                if state is BreakerState.CLOSED:
                    window = self._window
                    window.record(now, failed, slow)
                    calls = window.calls
                    if calls >= self._min_calls and (
                        window.failed * 100.0 >= self._failure_threshold * calls
                        or window.slow * 100.0 >= self._slow_rate_threshold * calls
                    ):
                        rates = (100.0 * window.failed / calls, 100.0 * window.slow / calls)
                        transition = self._to(BreakerState.OPEN, now, rates)
                elif state is BreakerState.HALF_OPEN:
                    self._ho_calls += 1
                    self._ho_failed += failed
                    self._ho_slow += slow
                    calls = self._ho_calls
                    if calls >= self._half_open_calls:
                        rates = (100.0 * self._ho_failed / calls, 100.0 * self._ho_slow / calls)
                        trip = rates[0] >= self._failure_threshold or rates[1] >= self._slow_rate_threshold
                        transition = self._to(BreakerState.OPEN if trip else BreakerState.CLOSED, now, rates)
        if transition is not None:
            self._announce([transition])

    # -- ways to protect a call ------------------------------------------------------------------

    def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``fn(*args, **kwargs)`` through the breaker."""
        generation, start = self._acquire()
        if self._tracer is not None and _telemetry.recording():
            with _telemetry.span(self._tracer, "mmchaos.breaker.call", {"mmchaos.guard": self.name}):
                return self._run(generation, start, fn, args, kwargs)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self._on_exception(generation, start, exc)
            raise
        self._on_return(generation, start, result)
        return result

    def _run(self, generation: int, start: float, fn: Callable[..., R], args: Any, kwargs: Any) -> R:
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self._on_exception(generation, start, exc)
            raise
        self._on_return(generation, start, result)
        return result

    async def call_async(self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Await ``fn(*args, **kwargs)`` through the breaker."""
        generation, start = self._acquire()
        if self._tracer is not None and _telemetry.recording():
            with _telemetry.span(self._tracer, "mmchaos.breaker.call", {"mmchaos.guard": self.name}):
                return await self._run_async(generation, start, fn, args, kwargs)
        return await self._run_async(generation, start, fn, args, kwargs)

    async def _run_async(
        self, generation: int, start: float, fn: Callable[..., Awaitable[R]], args: Any, kwargs: Any
    ) -> R:
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            self._on_exception(generation, start, exc)
            raise
        self._on_return(generation, start, result)
        return result

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]: ...
    @overload
    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]: ...
    def __call__(self, fn: Callable[P, Any]) -> Callable[P, Any]:
        """Decorate a function or an ``async def`` so every call goes through the breaker."""
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                return await self.call_async(fn, *args, **kwargs)

            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            return self.call(fn, *args, **kwargs)

        return wrapper

    def __enter__(self) -> CircuitBreaker:
        permit = self.acquire()
        _ACTIVE.set((*_ACTIVE.get(), (self, permit)))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack = _ACTIVE.get()
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] is self:
                permit = stack[i][1]
                _ACTIVE.set(stack[:i] + stack[i + 1 :])
                break
        else:  # pragma: no cover - __exit__ without __enter__ in this context
            raise RuntimeError(f"circuit breaker {self.name!r} exited a block it did not enter")
        if exc is None:
            permit.success()
        else:
            permit.failure(exc)

    async def __aenter__(self) -> CircuitBreaker:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"CircuitBreaker({self.name!r}, state={self._state.value})"
