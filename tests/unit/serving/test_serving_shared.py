"""One reference server per run, reused baselines, sequential phases, and chat traffic for VLMs.

Defects reproduced here (issues 13 and 10): every serving check started its own server, warm-up and
baseline; traffic phases always ran their full length; the server's model calls were not model
time; serving_overload and serving_poison skipped generative targets (no chat traffic).
"""

from __future__ import annotations

from mmchaos.chaos.sequential import sprt, stop_when_decided
from mmchaos.chaos.spec import SequentialSpec, SLOSpec
from mmchaos.chaos.windows import WindowTracker


def test_sprt_decides_clean_traffic_met_and_failing_traffic_breached() -> None:
    assert sprt(100, 0, 0.01, 0.05, 0.05, 0.05).decision == "met"
    assert sprt(10, 0, 0.01, 0.05, 0.05, 0.05).decision is None, "too little evidence yet"
    assert sprt(20, 3, 0.01, 0.05, 0.05, 0.05).decision == "breached"


class _Rec:
    def __init__(self, ok: bool, latency: float) -> None:
        self.error = None if ok else "http_5xx"
        self.latency = latency


def _tracker(n: int, bad_every: int = 0, slow_every: int = 0, seconds: float = 1.0) -> WindowTracker:
    slo = SLOSpec(window_s=0.25)
    tr = WindowTracker(slo, 0.0)
    for i in range(n):
        ok = not (bad_every and i % bad_every == 0)
        lat = 2.0 if slow_every and i % slow_every == 0 else 0.01
        tr.add(_Rec(ok, lat), seconds * i / n)  # type: ignore[arg-type]
    tr.close_until(seconds, {})
    return tr


def test_a_phase_stops_once_decided_and_says_why_with_n() -> None:
    slo, rule = SLOSpec(window_s=0.25), SequentialSpec()
    decide = stop_when_decided(slo, rule)
    why = decide(_tracker(150))
    assert why is not None and why.startswith("sprt: SLO met after n=150"), why
    assert decide(_tracker(150, bad_every=10)).startswith("sprt: SLO breached")  # type: ignore[union-attr]
    assert decide(_tracker(150, slow_every=10)).startswith("sprt: SLO breached")  # type: ignore[union-attr]
    assert decide(_tracker(150, seconds=0.25)) is None, "not before min_s"
    only_met = stop_when_decided(slo, rule, only="met")
    assert only_met(_tracker(150, bad_every=10)) is None, "a breaching step runs its full length"
    assert only_met(_tracker(150)) is not None
    assert decide(_tracker(20)) is None, "undecided on 20 clean answers"


def test_a_stream_record_is_done_at_its_finish_reason_without_done_but_not_when_cut() -> None:
    import time

    from mmchaos.checks.serving.streaming import StreamRecord, parse_sse

    events = ['data: {"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}',
              'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}']  # fmt: skip
    finish = 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}'
    complete, cut, marked = StreamRecord(status=200), StreamRecord(status=200), StreamRecord(status=200)
    parse_sse(iter([*events, finish, ""]), complete, time.perf_counter())
    parse_sse(iter(events), cut, time.perf_counter())
    parse_sse(iter([*events, finish, "data: [DONE]"]), marked, time.perf_counter())
    assert complete.ok and complete.text == "hi" and complete.finish_reason == "stop" and not complete.done_marker
    assert not cut.done and not cut.ok
    assert marked.ok and marked.done_marker
