"""The batcher on its own (no server, no model): what waits while the model is busy runs as one
batch, a failing batch is run again one request at a time, a cancelled request leaves the queue."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from mmchaos.server.batcher import Batcher
from mmchaos.server.errors import RequestCancelled, ServerError


class Model:
    """Doubles numbers in batches; the first call can be held; a batch holding 'bad' fails whole."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Semaphore(0)

    def __call__(self, payloads: Sequence[Any], cancel: threading.Event) -> list[Any]:
        self.sizes.append(len(payloads))
        self.entered.release()
        assert self.hold.wait(10.0)
        if "bad" in payloads:
            raise ValueError("a bad input")
        return [p * 2 for p in payloads]


def wait_until(cond: Callable[[], bool]) -> None:
    end = time.monotonic() + 10.0
    while not cond():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.005)


@pytest.fixture()
def batcher() -> Iterator[Batcher]:
    b = Batcher(max_batch=3, window=0.0)
    b.start()
    yield b
    b.stop()


def _behind_a_held_call(
    batcher: Batcher, model: Model, payloads: list[Any], cancels: list[threading.Event] | None = None
) -> tuple[Future[Any], list[Future[Any]]]:
    """The first call held in the model while ``payloads`` queue behind it."""
    pool = ThreadPoolExecutor(len(payloads) + 1)
    model.hold.clear()
    first = pool.submit(batcher.submit, "k", 0, model, threading.Event())
    assert model.entered.acquire(timeout=10.0)
    events = cancels or [threading.Event() for _ in payloads]
    rest = [pool.submit(batcher.submit, "k", p, model, e) for p, e in zip(payloads, events, strict=True)]
    wait_until(lambda: batcher.waiting == len(payloads))
    pool.shutdown(wait=False)
    return first, rest


def test_what_waits_while_the_model_is_busy_runs_in_batches_of_at_most_max_batch(batcher: Batcher) -> None:
    model = Model()
    first, rest = _behind_a_held_call(batcher, model, [1, 2, 3, 4])
    model.hold.set()
    assert first.result(10) == 0 and [f.result(10) for f in rest] == [2, 4, 6, 8]
    assert model.sizes == [1, 3, 1]
    assert batcher.sizes[-3:] == [1, 3, 1]


def test_a_failing_batch_runs_again_one_by_one_so_only_the_bad_request_fails(batcher: Batcher) -> None:
    model = Model()
    first, rest = _behind_a_held_call(batcher, model, [1, "bad", 3])
    model.hold.set()
    first.result(10)
    assert rest[0].result(10) == 2 and rest[2].result(10) == 6
    with pytest.raises(ValueError, match="a bad input"):
        rest[1].result(10)
    assert model.sizes == [1, 3, 1, 1, 1]


def test_a_request_cancelled_while_it_waits_leaves_the_queue(batcher: Batcher) -> None:
    model = Model()
    cancels = [threading.Event() for _ in range(3)]
    first, rest = _behind_a_held_call(batcher, model, [1, 2, 3], cancels)
    cancels[1].set()
    wait_until(lambda: batcher.waiting == 2)
    with pytest.raises(RequestCancelled):
        rest[1].result(10)
    model.hold.set()
    assert [rest[0].result(10), rest[2].result(10)] == [2, 6]
    assert model.sizes == [1, 2]


def test_requests_of_other_keys_never_share_a_batch(batcher: Batcher) -> None:
    model = Model()
    model.hold.clear()
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(batcher.submit, "a", 0, model, threading.Event())
        assert model.entered.acquire(timeout=10.0)
        others = [pool.submit(batcher.submit, key, 1, model, threading.Event()) for key in ("a", "b", "a")]
        wait_until(lambda: batcher.waiting == 3)
        model.hold.set()
        assert [f.result(10) for f in (first, *others)] == [0, 2, 2, 2]
    assert model.sizes == [1, 2, 1]


def test_stopping_refuses_what_still_waits() -> None:
    b = Batcher(max_batch=2, window=0.0)
    b.start()
    model = Model()
    first, rest = _behind_a_held_call(b, model, [1])
    b.stop(wait=False)
    model.hold.set()
    assert first.result(10) == 0
    with pytest.raises(ServerError) as refused:
        rest[0].result(10)
    assert refused.value.code == "not_ready"
