"""What ``serving_overload`` judges collapse on: successful answers per second, not answers within the SLO.

Pure arithmetic on load results (no network); the check itself runs on loopback in
``tests/integration/serving/test_serving_checks.py`` (a thrashing service fails, a slow FIFO one passes).
"""

from __future__ import annotations

from mmchaos.chaos.load import LatencySummary, LoadResult, RequestRecord
from mmchaos.checks.serving.overload import ServingOverloadGate, _completion_rate


def step(completions: list[tuple[float, float]], duration_s: float, slo_s: float = 1.0) -> LoadResult:
    """A step whose requests started and took ``(start, latency)`` seconds, all answered 200."""
    records = [
        RequestRecord(i, "image", start, latency, 200, None, latency <= slo_s)
        for i, (start, latency) in enumerate(completions)
    ]
    lat = LatencySummary.of([r.latency for r in records])
    good = sum(r.good for r in records)
    return LoadResult(
        mode="closed", arrival=None, target="t", max_requests=1000, max_duration=duration_s, slo_latency_ms=slo_s * 1e3,
        offered_rate=None, concurrency=1, duration_s=duration_s, sent=len(records), completed=len(records),
        ok=len(records), good=good, cancelled=0, errors={}, status_counts={"200": len(records)}, latency=lat,
        ok_latency=lat, by_kind={}, records=records,
    )  # fmt: skip


def fifo(concurrency: int, rate: float, seconds: float) -> LoadResult:
    """A FIFO service answering ``rate`` requests a second to ``concurrency`` closed-loop clients: once
    the queue is full each waits concurrency / rate (Little's law)."""
    wait = concurrency / rate
    n = int(seconds * rate)
    return step([(i / rate, wait) for i in range(n)], duration_s=(n - 1) / rate + wait)


def test_a_fifo_service_past_the_knee_keeps_its_answer_rate_whatever_the_slo_says() -> None:
    """The prelaunch flake: 64 clients of a ~60 req/s server wait ~1.07 s, right at the 1 s SLO. On a
    faster moment (70 req/s: 0.91 s) every answer is good, on a slower one (55 req/s: 1.16 s) none is;
    the answer rate is the service's rate either way."""
    knee = _completion_rate(fifo(16, 60.0, 2.0), within_slo=False)
    for rate in (55.0, 70.0):
        past = _completion_rate(fifo(64, rate, 2.0), within_slo=False)
        assert abs(past / knee - rate / 60) < 0.1
    assert _completion_rate(fifo(64, 55.0, 2.0), within_slo=True) == 0.0  # what the old gate judged
    assert _completion_rate(fifo(64, 70.0, 2.0), within_slo=True) > 50.0


def test_a_few_answers_in_a_burst_are_not_read_as_a_high_rate() -> None:
    """Three answers of a collapsed service within 2 ms of each other, in a step of 1.25 s: between the
    first and the last completion that read as 1,000 answers a second, 12 times the knee's rate."""
    burst = step([(0.0, 0.500), (0.0, 0.501), (0.0, 0.502)], duration_s=1.25, slo_s=0.25)
    assert _completion_rate(burst, within_slo=False) < 3.0
    assert _completion_rate(step([], duration_s=1.0), within_slo=False) == 0.0
    assert _completion_rate(step([(0.0, 0.4)], duration_s=1.0), within_slo=False) == 1.0


def test_the_gate_takes_its_old_name_too() -> None:
    """Suites written while the gate was ``min_goodput_ratio`` still validate, with the same meaning of the number."""
    assert ServingOverloadGate.model_validate({"min_goodput_ratio": 0.3}).min_answer_rate_ratio == 0.3
    assert ServingOverloadGate.model_validate({"min_answer_rate_ratio": 0.4}).min_answer_rate_ratio == 0.4
