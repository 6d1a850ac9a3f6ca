"""The recovery allowance of ``serving_overload``: the ramp's backlog drained at the measured rate.

Pure arithmetic on load results (no network); the check itself is exercised on loopback in
``tests/integration/serving/test_serving_checks.py`` (a service that stays broken fails, a slow correct one passes).
"""

from __future__ import annotations

from dataclasses import replace

from mmchaos.chaos.load import LatencySummary, LoadResult
from mmchaos.checks.serving.overload import drain_allowance


def result(good: int, duration_s: float, cancelled: int) -> LoadResult:
    lat = LatencySummary.of([0.01] * good)
    return LoadResult(
        mode="closed", arrival=None, target="t", max_requests=1000, max_duration=10.0, slo_latency_ms=1000.0,
        offered_rate=None, concurrency=cancelled, duration_s=duration_s, sent=good + cancelled, completed=good,
        ok=good, good=good, cancelled=cancelled, errors={}, status_counts={"200": good}, latency=lat,
        ok_latency=lat, by_kind={},
    )  # fmt: skip


def test_the_backlog_is_drained_at_the_rate_the_last_step_answered() -> None:
    d = drain_allowance([result(70, 1.0, 4), result(68, 2.0, 64)], max_recovery_s=3.0, request_timeout_s=2.0)
    assert d.backlog == 64 and d.rate_rps == 34.0
    assert abs(d.drain_s - 64 / 34) < 1e-9 and d.cap_s == 6.0
    # and the first recovery request's own answer: the first step's slowest good one (10 ms here)
    assert abs(d.answer_s - 0.01) < 1e-9 and abs(d.seconds - (64 / 34 + 0.01)) < 1e-9
    assert "64 requests at 34.0 good req/s + 0.01 s for one answer" in d.describe()


def test_a_slower_machine_gets_a_proportionally_longer_drain() -> None:
    idle = drain_allowance([result(140, 2.0, 64)], 3.0, 2.0)
    loaded = drain_allowance([result(35, 2.0, 64)], 3.0, 2.0)
    assert abs(loaded.drain_s / idle.drain_s - 4.0) < 1e-9


def test_no_backlog_no_drain_and_the_allowance_is_bounded() -> None:
    none_left = drain_allowance([result(50, 1.0, 0)], 3.0, 2.0)
    assert none_left.drain_s == 0.0 and none_left.seconds == none_left.answer_s
    assert none_left.describe() == "0.01 s for one answer"
    assert drain_allowance([], 3.0, 2.0).seconds == 0.0
    # a last step with too few answers to measure: the ramp's lowest rate; none at all: the cap
    assert drain_allowance([result(10, 1.0, 1), result(1, 2.0, 20)], 3.0, 2.0).drain_s == 2.0
    stalled = drain_allowance([result(0, 2.0, 64)], 1.0, 2.0)
    assert stalled.seconds == stalled.cap_s == 4.0


def test_a_model_slower_than_max_recovery_s_is_granted_its_first_answer() -> None:
    """The CI failure: no backlog left (a batching server cleared it within the step's drain), an 80 ms
    model, max_recovery_s 0.05 s: the first answer after the ramp cannot come sooner than 80 ms, so a
    correct service failed. The allowance now holds the unqueued answer the ramp measured."""
    lat = LatencySummary.of([0.08, 0.085, 0.09])
    first = replace(result(3, 0.3, 0), ok_latency=lat)
    d = drain_allowance([first, result(40, 1.0, 0)], 0.05, 2.0)
    assert d.backlog == 0 and 0.05 + d.seconds >= 0.09
