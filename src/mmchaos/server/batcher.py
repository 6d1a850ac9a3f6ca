"""Dynamic batching across requests: model calls of requests admitted together run as one batch.

Worker threads decode their request, then hand its model input to :meth:`Batcher.submit` and wait.
One batcher thread runs the batches, one at a time (it is the only caller of batched work, and
batched runners take the model lock, so a streamed request that bypasses the batcher still
serialises with it). When the model is free and a request waits, the thread gathers the requests
of the same *key* (inputs that can share one model call: embeddings, or generations with the same
sampling parameters) up to ``max_batch`` and waits at most ``window`` seconds for more: requests
that are admitted and still decoding (:meth:`Batcher.joining`) are certainly coming; others may,
when the key's last batch had company, so without any on the way the wait is also at most a tenth
of the key's measured call; after a batch of one (a lone client) it does not wait at all. While a
batch runs, the next one forms by itself: under load the batches fill without any waiting.

Only admitted requests submit, so a batch's decoded pixels are within the admission's pixel
budget. A failing batch of several is run again one request at a time, so one bad request (a
processor refusal, a NaN row) fails alone and the others get their answers. A request cancelled
while it waits (its client left, it timed out) leaves the queue at once; one cancelled while its
batch runs waits for the batch to end (the model call cannot be interrupted, and its inputs are in
memory until then: its slot and pixels are held, as an unbatched call's are).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from mmchaos.server.errors import RequestCancelled, ServerError
from mmchaos.server.model_thread import ModelThread

__all__ = ["BatchRunner", "Batcher"]

#: ``runner(payloads, cancel)`` -> one result per payload, in order; a result that is an exception
#: is that request's failure. ``cancel`` is set when no request of the batch waits for it any more.
BatchRunner = Callable[[Sequence[Any], threading.Event], Sequence[Any]]

_LONE_WAIT_SHARE = 0.1  # without a request on its way, wait at most this share of a call for company


@dataclass(eq=False)
class _Entry:
    key: Hashable
    payload: Any
    runner: BatchRunner
    cancel: threading.Event
    context: contextvars.Context
    done: threading.Event = field(default_factory=threading.Event)
    running: bool = False
    result: Any = None
    error: BaseException | None = None

    def resolve(self, result: Any) -> None:
        if isinstance(result, BaseException):
            self.error = result
        else:
            self.result = result
        self.done.set()


class Batcher(ModelThread[_Entry]):
    """One thread that runs submitted model inputs in batches of up to ``max_batch`` per key."""

    def __init__(
        self,
        max_batch: int,
        window: float,
        *,
        name: str = "mmchaos-batcher",
        observe: Callable[[Hashable, int], None] | None = None,
    ) -> None:
        super().__init__(name)
        self.max_batch = max_batch
        self.window = window
        self.observe = observe  # (key, size) of every batch run
        self._coming = 0  # requests admitted and decoding, that will submit
        #: EWMA seconds of one batch call per key (what a lone request's wait is measured against).
        self._call_seconds: dict[Hashable, float] = {}
        self._last_size: dict[Hashable, int] = {}
        #: Sizes of the batches run, the most recent last (bounded): for /metrics and the tests.
        self.sizes: list[int] = []

    # -- the worker's side ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def joining(self) -> Iterator[Callable[[Hashable, Any, BatchRunner, threading.Event], Any]]:
        """``with batcher.joining() as submit:`` decode, then ``submit(key, payload, runner, cancel)``.

        Inside the block the request counts as on its way: a batch forming meanwhile waits for it
        (up to the window). Leaving the block without submitting (a refused input) withdraws it."""
        with self._cond:
            self._coming += 1
        submitted = False

        def submit(key: Hashable, payload: Any, runner: BatchRunner, cancel: threading.Event) -> Any:
            nonlocal submitted
            if submitted:
                raise RuntimeError("one submit per joining block")
            submitted = True
            return self.submit(key, payload, runner, cancel, coming=True)

        try:
            yield submit
        finally:
            if not submitted:
                with self._cond:
                    self._coming -= 1
                    self._cond.notify_all()

    def submit(
        self, key: Hashable, payload: Any, runner: BatchRunner, cancel: threading.Event, *, coming: bool = False
    ) -> Any:
        """Run ``payload`` in a batch with others of ``key`` and return its result (or raise its error)."""
        entry = _Entry(key, payload, runner, cancel, contextvars.copy_context())
        with self._cond:
            if coming:
                self._coming -= 1
            if self._stopping:
                raise ServerError("the server is not running", code="not_ready")
            if cancel.is_set():
                self._cond.notify_all()
                raise RequestCancelled()
            self._pending.append(entry)
            self._cond.notify_all()
        # Running, it waits for its batch to end (the batch holds its inputs), as an unbatched call would.
        return self._answer_of(entry)

    # -- the batcher thread ----------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._run(batch)

    def _next_batch(self) -> list[_Entry] | None:
        with self._cond:
            while not self._pending and not self._stopping:
                self._cond.wait()
            if not self._pending:
                return None  # stopping, nothing left
            if self._stopping:
                for e in self._pending:
                    e.resolve(ServerError("the server is not running", code="not_ready"))
                self._pending.clear()
                return None
            key = self._pending[0].key
            start = time.perf_counter()
            while not self._stopping:
                same = sum(1 for e in self._pending if e.key == key)
                if same >= self.max_batch:
                    break
                window = self.window
                if not self._coming:  # company is likely only if the last batch had some
                    lonely = self._last_size.get(key, 1) <= 1
                    window = 0.0 if lonely else min(window, _LONE_WAIT_SHARE * self._call_seconds.get(key, 0.0))
                left = start + window - time.perf_counter()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch: list[_Entry] = []
            rest: list[_Entry] = []
            for e in self._pending:
                if e.key != key or len(batch) >= self.max_batch:
                    rest.append(e)
                elif e.cancel.is_set():
                    e.resolve(RequestCancelled())
                else:
                    e.running = True
                    batch.append(e)
            self._pending = rest
            return batch

    def _run(self, batch: list[_Entry]) -> None:
        if not batch:
            return
        self.sizes = [*self.sizes[-255:], len(batch)]
        self._last_size[batch[0].key] = len(batch)
        if self.observe is not None:
            self.observe(batch[0].key, len(batch))
        start = time.perf_counter()
        outcomes = self._call(batch)
        took = time.perf_counter() - start
        old = self._call_seconds.get(batch[0].key)
        self._call_seconds[batch[0].key] = took if old is None else 0.8 * old + 0.2 * took
        for entry, outcome in zip(batch, outcomes, strict=True):
            entry.resolve(outcome)

    def _call(self, batch: list[_Entry]) -> list[Any]:
        """Every entry's outcome; a batch of several that fails as a whole runs again one by one."""
        head = batch[0]
        idle = threading.Event()  # every member of the batch waits for it: nothing to cancel
        try:
            results = list(head.context.run(head.runner, [e.payload for e in batch], idle))
        except Exception as exc:
            if len(batch) == 1:
                return [exc]
        except BaseException as exc:  # the process is going down: nobody waits forever
            for e in batch:
                e.resolve(ServerError("the server is not running", code="not_ready"))
            raise exc from None
        else:
            if len(results) == len(batch):
                return results
            if len(batch) == 1:
                return [RuntimeError(f"a batch runner gave {len(results)} results for 1 request")]
        outcomes: list[Any] = []
        for e in batch:
            try:
                outcomes.append(e.context.run(e.runner, [e.payload], e.cancel)[0])
            except Exception as exc:
                outcomes.append(exc)
        return outcomes
