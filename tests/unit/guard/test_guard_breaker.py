"""CircuitBreaker: resilience4j semantics, checked with a fake clock; concurrency with threads and
Hypothesis; the sliding windows against brute-force models."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from mmchaos.errors import ConfigError, MMChaosError
from mmchaos.guard import (
    BreakerConfig,
    BreakerState,
    CallNotPermitted,
    CircuitBreaker,
    Permit,
    StateTransition,
)
from mmchaos.guard.breaker import _CountWindow, _TimeWindow


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Boom(Exception):
    pass


def make(clock: Clock | None = None, **settings: Any) -> CircuitBreaker:
    defaults: dict[str, Any] = {
        "sliding_window_size": 10,
        "minimum_number_of_calls": 10,
        "failure_rate_threshold": 50.0,
        "wait_duration_in_open_state": 30.0,
        "permitted_number_of_calls_in_half_open_state": 3,
    }
    defaults.update(settings)
    return CircuitBreaker("model", clock=clock or Clock(), registry=CollectorRegistry(), tracer=False, **defaults)


def ok() -> str:
    return "ok"


def fail() -> str:
    raise Boom("down")


def run(breaker: CircuitBreaker, fn: Callable[[], str]) -> str:
    try:
        return breaker.call(fn)
    except Boom:
        return "failed"


def test_opens_at_the_failure_rate_threshold_once_the_minimum_calls_are_in() -> None:
    b = make()
    for _ in range(5):
        run(b, ok)
    for _ in range(4):
        run(b, fail)
    assert b.state is BreakerState.CLOSED and b.rates() == (-1.0, -1.0), "9 calls: below the minimum"
    run(b, fail)
    assert b.state is BreakerState.OPEN, "10 calls at 50% failures"
    with pytest.raises(CallNotPermitted) as info:
        b.call(ok)
    err = info.value
    assert err.code == "call_not_permitted" and err.http_status == 503 and isinstance(err, MMChaosError)
    assert err.retry_after == pytest.approx(30.0)
    assert err.to_dict()["detail"] == {"breaker": "model", "state": "open", "retry_after": err.retry_after}


def test_stays_closed_below_the_threshold_and_below_the_minimum_calls() -> None:
    b = make()
    for _ in range(9):
        run(b, fail)
    assert b.state is BreakerState.CLOSED, "100% failures but fewer calls than the minimum"
    b2 = make()
    for i in range(100):
        run(b2, fail if i % 5 == 0 else ok)  # 20% failures, over a sliding window
    assert b2.state is BreakerState.CLOSED and b2.rates()[0] == pytest.approx(20.0)


def test_opens_on_slow_call_rate_even_when_every_call_succeeds() -> None:
    clock = Clock()

    def slow() -> str:
        clock.now += 2.0
        return "ok"

    b = make(clock, slow_call_duration_threshold=1.0, slow_call_rate_threshold=60.0)
    for _ in range(4):
        b.call(ok)
    for _ in range(5):
        b.call(slow)
    assert b.state is BreakerState.CLOSED
    b.call(slow)  # 6 of 10 calls slow: exactly the 60% threshold
    assert b.state is BreakerState.OPEN
    reg = b.registry
    assert reg.get_sample_value("mmchaos_breaker_slow_calls_total", {"name": "model", "kind": "successful"}) == 6


def test_half_open_admits_exactly_n_trial_calls_then_closes_after_recovery() -> None:
    clock = Clock()
    transitions: list[StateTransition] = []
    b = make(clock, on_state_change=transitions.append)
    for _ in range(10):
        run(b, fail)
    assert b.state is BreakerState.OPEN
    clock.now += 29.9
    with pytest.raises(CallNotPermitted):
        b.acquire()
    clock.now += 0.2
    assert b.state is BreakerState.OPEN, "OPEN moves on only when the next call asks"
    permits = [b.acquire() for _ in range(3)]
    assert b.state is BreakerState.HALF_OPEN
    with pytest.raises(CallNotPermitted) as info:
        b.acquire()
    assert info.value.state is BreakerState.HALF_OPEN
    for p in permits[:2]:
        p.success()
    assert b.state is BreakerState.HALF_OPEN, "evaluated only when all 3 trial calls are in"
    permits[2].success()
    assert b.state is BreakerState.CLOSED
    assert [(t.from_state, t.to_state) for t in transitions] == [
        (BreakerState.CLOSED, BreakerState.OPEN),
        (BreakerState.OPEN, BreakerState.HALF_OPEN),
        (BreakerState.HALF_OPEN, BreakerState.CLOSED),
    ]
    assert transitions[0].failure_rate == 100.0
    assert b.buffered_calls() == 0, "a fresh window after closing"


def test_half_open_reopens_when_the_trial_calls_fail() -> None:
    clock = Clock()
    b = make(clock)
    for _ in range(10):
        run(b, fail)
    clock.now += 31
    assert run(b, fail) == "failed"
    assert run(b, ok) == "ok"
    assert b.state is BreakerState.HALF_OPEN
    run(b, ok)  # 1 of 3 failed = 33% < 50%: closes
    assert b.state is BreakerState.CLOSED
    for _ in range(10):
        run(b, fail)
    clock.now += 31
    for fn in (fail, fail, ok):  # 67% >= 50%: back to OPEN, with a new wait
        run(b, fn)
    assert b.state is BreakerState.OPEN
    with pytest.raises(CallNotPermitted) as info:
        b.call(ok)
    assert info.value.retry_after == pytest.approx(30.0)


def test_released_and_ignored_calls_free_their_half_open_slot() -> None:
    clock = Clock()
    b = make(clock, permitted_number_of_calls_in_half_open_state=1)
    b.transition_to_open()
    clock.now += 31
    b.acquire().release()
    permit = b.acquire()  # the slot came back
    with pytest.raises(CallNotPermitted):
        b.acquire()
    permit.release()
    b2 = make(clock, permitted_number_of_calls_in_half_open_state=1, ignore_exceptions=(KeyError,))
    b2.transition_to_half_open()
    with pytest.raises(KeyError):
        b2.call(lambda: {}["missing"])
    assert b2.state is BreakerState.HALF_OPEN
    assert b2.call(ok) == "ok" and b2.state is BreakerState.CLOSED


def test_max_wait_in_half_open_goes_back_to_open() -> None:
    clock = Clock()
    b = make(clock, max_wait_duration_in_half_open_state=5.0)
    b.transition_to_half_open()
    b.acquire()  # a trial call that never reports back
    clock.now += 6
    with pytest.raises(CallNotPermitted):
        b.acquire()
    assert b.state is BreakerState.OPEN


def test_exception_predicates_and_result_predicate() -> None:
    b = make(record_exceptions=(Boom,), ignore_exception=lambda e: "ignore" in str(e))
    with pytest.raises(ValueError):
        b.call(lambda: int("x"))  # not a recorded type: counts as success (resilience4j)
    with pytest.raises(Boom):
        b.call(lambda: (_ for _ in ()).throw(Boom("please ignore")))
    reg = b.registry
    assert reg.get_sample_value("mmchaos_breaker_calls_total", {"name": "model", "kind": "successful"}) == 1
    assert reg.get_sample_value("mmchaos_breaker_calls_total", {"name": "model", "kind": "ignored"}) == 1
    assert b.buffered_calls() == 1
    c = make(record_result=lambda r: r == 503)
    for _ in range(10):
        c.call(lambda: 503)
    assert c.state is BreakerState.OPEN


def test_decorator_and_context_managers_sync_and_async() -> None:
    b = make()

    @b
    def double(x: int) -> int:
        return 2 * x

    @b
    async def triple(x: int) -> int:
        await asyncio.sleep(0)
        return 3 * x

    assert double(2) == 4 and double.__name__ == "double"
    assert asyncio.run(triple(2)) == 6

    with b:
        pass
    with pytest.raises(Boom), b:
        raise Boom

    async def use() -> None:
        async with b:
            await asyncio.sleep(0)
        with pytest.raises(Boom):
            async with b:
                raise Boom

    asyncio.run(use())
    assert b.buffered_calls() == 6
    assert b.rates() == (-1.0, -1.0)
    for _ in range(4):
        with pytest.raises(Boom), b:
            raise Boom
    assert b.rates() == (60.0, 0.0)


def test_async_cancellation_releases_without_recording() -> None:
    b = make(permitted_number_of_calls_in_half_open_state=1)
    b.transition_to_half_open()

    async def hang() -> None:
        await asyncio.sleep(10)

    async def scenario() -> None:
        task = asyncio.create_task(b.call_async(hang))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await b.call_async(asyncio.sleep, 0)

    asyncio.run(scenario())
    assert b.state is BreakerState.CLOSED


def test_no_lock_is_held_while_the_protected_call_runs() -> None:
    b = make()

    def inner() -> bool:
        assert not b._lock.locked()
        return b.call(lambda: b.state is BreakerState.CLOSED)  # re-entrant use must not deadlock

    assert b.call(inner)
    with b:
        assert not b._lock.locked()


def test_disabled_and_forced_open() -> None:
    b = make()
    b.transition_to_disabled()
    for _ in range(20):
        run(b, fail)
    assert b.state is BreakerState.DISABLED and b.buffered_calls() == 0
    b.transition_to_forced_open()
    with pytest.raises(CallNotPermitted):
        b.call(ok)
    b.reset()
    assert b.call(ok) == "ok"


def test_stale_outcomes_do_not_leak_into_the_next_state() -> None:
    clock = Clock()
    b = make(clock, permitted_number_of_calls_in_half_open_state=1)
    admitted_while_closed = b.acquire()
    b.transition_to_half_open()
    admitted_while_closed.failure(Boom())  # finishes after the state changed: not a trial call
    assert b.state is BreakerState.HALF_OPEN
    b.call(ok)
    assert b.state is BreakerState.CLOSED


def test_time_based_window_forgets_old_calls() -> None:
    clock = Clock()
    b = make(clock, sliding_window_type="TIME_BASED", sliding_window_size=10, minimum_number_of_calls=4)
    for _ in range(3):
        run(b, fail)
    clock.now += 11  # those failures leave the 10 s window
    for _ in range(3):
        run(b, ok)
    assert b.buffered_calls() == 3 and b.state is BreakerState.CLOSED
    run(b, fail)
    assert b.rates() == (25.0, 0.0) and b.state is BreakerState.CLOSED
    run(b, fail)
    assert b.state is BreakerState.CLOSED  # 2 of 5
    run(b, fail)
    assert b.state is BreakerState.OPEN  # 3 of 6: 50%


def test_state_change_callback_errors_do_not_break_calls() -> None:
    def bad_listener(_: StateTransition) -> None:
        raise RuntimeError("listener bug")

    b = make(on_state_change=bad_listener)
    for _ in range(10):
        run(b, fail)
    assert b.state is BreakerState.OPEN


def test_config_validation_and_yaml(tmp_path: Any) -> None:
    path = tmp_path / "breaker.yaml"
    path.write_text("sliding_window_type: TIME_BASED\nsliding_window_size: 60\nfailure_rate_threshold: 25\n")
    b = CircuitBreaker.from_yaml(path, name="m", registry=CollectorRegistry())
    assert b.config.sliding_window_size == 60 and b.config.failure_rate_threshold == 25
    for bad in ({"failure_rate_threshold": 0}, {"failure_rate_threshold": 101}, {"sliding_window_size": 0}):
        with pytest.raises(ConfigError):
            make(**bad)
    with pytest.raises(ConfigError):
        BreakerConfig.from_yaml("wait_duration: 5\n")


def test_threads_never_get_more_than_n_half_open_permits() -> None:
    b = make(permitted_number_of_calls_in_half_open_state=3)
    b.transition_to_half_open()
    barrier = threading.Barrier(12)
    release = threading.Event()
    admitted: list[Permit] = []
    rejected = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        try:
            permit = b.acquire()
        except CallNotPermitted:
            with lock:
                rejected.append(1)
            return
        with lock:
            admitted.append(permit)
        release.wait(5)
        permit.success()

    threads = [threading.Thread(target=worker) for _ in range(12)]
    for t in threads:
        t.start()
    for _ in range(500):
        with lock:
            if len(admitted) + len(rejected) == 12:
                break
        threading.Event().wait(0.01)
    assert len(admitted) == 3 and len(rejected) == 9
    release.set()
    for t in threads:
        t.join(5)
    assert b.state is BreakerState.CLOSED


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 5),
    ops=st.lists(
        st.tuples(st.sampled_from(["acquire", "success", "failure", "release"]), st.integers(0, 7)), max_size=60
    ),
)
def test_half_open_never_admits_more_than_n_calls(n: int, ops: list[tuple[str, int]]) -> None:
    clock = Clock()
    b = make(clock, permitted_number_of_calls_in_half_open_state=n, wait_duration_in_open_state=1.0)
    b.transition_to_open()
    clock.now += 2
    inflight: list[Permit] = []
    for op, pick in ops:
        if op == "acquire":
            try:
                inflight.append(b.acquire())
            except CallNotPermitted:
                assert b.state is BreakerState.HALF_OPEN, "rejected only when every trial slot is taken"
        elif inflight:
            permit = inflight.pop(pick % len(inflight))
            if op == "success":
                permit.success()
            elif op == "failure":
                permit.failure(Boom())
            else:
                permit.release()
        if b.state is BreakerState.HALF_OPEN:
            trial = [p for p in inflight if p._generation == b._generation]
            assert len(trial) + b._ho_calls <= n, "in flight plus finished trial calls never exceed N"
        elif b.state is BreakerState.CLOSED:
            b.transition_to_open()  # keep exercising half-open periods
            clock.now += 2
        else:
            clock.now += 2


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(1, 12),
    events=st.lists(st.tuples(st.floats(0, 5), st.booleans(), st.booleans()), max_size=80),
)
def test_time_window_matches_brute_force(size: int, events: list[tuple[float, bool, bool]]) -> None:
    window = _TimeWindow(size)
    now = 100.0
    seen: list[tuple[int, bool, bool]] = []
    for dt, failed, slow in events:
        now += dt
        window.record(now, failed, slow)
        seen.append((int(now // 1), failed, slow))
        recent = [e for e in seen if e[0] > int(now // 1) - size]
        assert window.totals(now) == (len(recent), sum(e[1] for e in recent), sum(e[2] for e in recent))


@settings(max_examples=150, deadline=None)
@given(size=st.integers(1, 12), events=st.lists(st.tuples(st.booleans(), st.booleans()), max_size=60))
def test_count_window_matches_brute_force(size: int, events: list[tuple[bool, bool]]) -> None:
    window = _CountWindow(size)
    last: deque[tuple[bool, bool]] = deque(maxlen=size)
    for failed, slow in events:
        window.record(0.0, failed, slow)
        last.append((failed, slow))
        assert window.totals(0.0) == (len(last), sum(f for f, _ in last), sum(s for _, s in last))
