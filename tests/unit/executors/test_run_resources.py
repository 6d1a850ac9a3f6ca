"""What the checks of a run share (one worker pool, one reference server) and the true model time.

Defects reproduced here (issue 13): contract and determinism each spawned their own worker pool
(two torch imports and model loads per run); model time summed overlapping calls (thread_safety
showed more model time than wall time) and left out worker processes and the server's threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from mmchaos.executors.resources import RunResources, shared
from mmchaos.runner import TimedTarget
from mmchaos.timing import ModelClock, union_seconds
from tests.fakes import broken_targets as bt


def test_a_resource_is_started_once_and_closed_at_run_end() -> None:
    started: list[int] = []
    closed: list[int] = []

    def factory() -> int:
        started.append(1)
        return len(started)

    res = RunResources()
    res.prefetch("k", factory, closed.append)
    assert res.get("k", factory, closed.append) == 1
    assert res.get("k", factory, closed.append) == 1
    assert res.get("other", factory, closed.append) == 2, "a different key gets its own"
    assert closed == []
    res.close()
    assert sorted(closed) == [1, 2] and len(started) == 2


def test_a_failed_start_raises_to_the_caller_and_a_later_call_retries() -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("no")
        return "ok"

    res = RunResources()
    res.prefetch("k", flaky, lambda _: None)
    with pytest.raises(RuntimeError):
        res.get("k", flaky, lambda _: None)
    assert res.get("k", flaky, lambda _: None) == "ok"
    res.close()


def test_discard_closes_and_the_next_get_starts_fresh() -> None:
    closed: list[object] = []
    res = RunResources()
    first = res.get("k", object, closed.append)
    res.discard("k")
    assert closed == [first]
    assert res.get("k", object, closed.append) is not first
    res.close()


def test_shared_without_run_resources_starts_and_closes_its_own() -> None:
    closed: list[str] = []
    with shared(None, "k", lambda: "mine", closed.append) as (value, is_shared):
        assert value == "mine" and not is_shared and closed == []
    assert closed == ["mine"]


def test_overlapping_intervals_count_once() -> None:
    assert union_seconds([(0.0, 1.0), (0.5, 1.5), (3.0, 4.0), (3.2, 3.4)]) == pytest.approx(2.5)
    clock = ModelClock()
    clock.add(10.0, 11.0)
    clock.add(10.0, 11.0)
    assert clock.seconds == pytest.approx(1.0) and clock.calls == 2


class _SlowTarget(bt.ContractSafeTarget):
    """Every call waits until two calls are inside the model at once, then works for 50 ms."""

    def __init__(self) -> None:
        super().__init__()
        self.barrier = threading.Barrier(2, timeout=10)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        self.barrier.wait()
        time.sleep(0.05)
        return super().embed_texts(texts)


def test_concurrent_calls_are_not_double_counted() -> None:
    timed = TimedTarget(_SlowTarget())
    start = time.perf_counter()
    threads = [threading.Thread(target=timed.embed_texts, args=(["a photo"],)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    assert timed.calls == 2
    # Two calls overlapped for >= 50 ms: a sum would exceed the wall time; the union cannot.
    assert 0 < timed.seconds <= wall
