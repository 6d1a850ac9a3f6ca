"""Admission control on one event loop: ``limit`` concurrent slots, a pixel budget, a bounded FIFO.

A request enters when a slot is free *and* the pixels its images declare fit in what the running
requests leave of the budget; otherwise it waits, in arrival order (the head of the queue blocks
the ones behind it, so a large request is not starved by small ones), and undecoded: the budget is
taken before any image is decoded, and given back when the request's work really ends.

Load shedding: with ``max_wait`` set, a request that would have to queue is refused (429
``overloaded`` with Retry-After) when its expected wait -- the requests ahead of it times the
measured interval between completions while the server is saturated -- exceeds ``max_wait`` or
what is left of its deadline; or when the pixels already waiting plus its own are more than one
budget: the pixel budget, not the slots, is then what limits the service, and an interval measured
on light traffic (or none, on a cold server) says nothing of how long a round of large images takes.
What waits then starts within one round of what runs.

Batching (``batch`` > 1: the admitted requests run together as model batches of up to ``batch``)
changes the shape of the service, not only its rate: completions come in bunches, one batch's
worth at a time, and a waiter is admitted when a whole batch ends. The interval is then measured
as completions over busy time (a bunch of near-zero intervals and one long one average to the
batch's time over its size, where a plain EWMA of the last few would read almost zero), and the
expected wait counts whole rounds: a waiter at place ``p`` waits ``ceil(p / batch)`` batches, so a
burst the batches can absorb is admitted instead of being priced one batch per place.

A request that still reaches its deadline in the queue, never admitted, is shed too (429
``overloaded``): it never ran, so it did not time out; a 504 is left to work that ran past the
deadline.

Queueing everything up to ``queue`` instead lets a burst push every
admitted request past its latency objective (all of them late, goodput collapses); shedding keeps
the admitted ones on time and tells the rest, cheaply, when to come back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import Callable

from mmchaos.server.errors import ServerError

__all__ = ["Admission"]


class Admission:
    """``limit`` slots and ``pixel_budget`` decoded pixels; 429 ``queue_full`` beyond ``queue`` waiters,
    429 ``overloaded`` when the expected queue wait is past ``max_wait`` seconds (None: never);
    ``batch`` requests complete together in one round (1: one at a time)."""

    def __init__(
        self,
        limit: int,
        queue: int,
        pixel_budget: int | None = None,
        max_wait: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        batch: int = 1,
    ) -> None:
        self.limit = limit
        self.batch = max(1, batch)
        self.queue = queue
        self.pixel_budget = pixel_budget
        self.max_wait = max_wait
        self.clock = clock
        self.active = 0
        self.pixels = 0
        #: Pixels the waiting requests declare (the queue's share of the budget, still undecoded).
        self.queued_pixels = 0
        self.waiters: collections.deque[tuple[asyncio.Future[None], int]] = collections.deque()
        #: Seconds per completion while the server was saturated (a slot freed with every slot
        #: taken or someone waiting): busy time over completions, both decayed per completion (a
        #: memory of about five rounds): the service's real throughput, whatever the slots, the
        #: batches, the model lock or a busy machine make of it. None until measured.
        self.interval: float | None = None
        self._busy_seconds = 0.0
        self._busy_completions = 0.0
        self._last_busy_release: float | None = None
        #: EWMA of what an admitted waiter really waited per place it had in the queue: the quantity
        #: the estimate predicts, measured. It also holds what the interval cannot see: a busy event
        #: loop that observes several completions at once, or resumes an admitted waiter late.
        self.wait_per_place: float | None = None

    def _places(self, place: int) -> int:
        """The completions a waiter at ``place`` waits for: whole rounds of ``batch``."""
        return math.ceil(place / self.batch) * self.batch

    def expected_wait(self, fallback_interval: float = 0.0) -> float:
        """Seconds a request arriving now would wait for a slot: one completion per request ahead
        of it, plus the one that frees its own slot, in whole rounds of ``batch``
        (``fallback_interval`` per completion until one is measured)."""
        per = max(self.interval if self.interval is not None else fallback_interval, self.wait_per_place or 0.0)
        return self._places(len(self.waiters) + 1) * per

    def _fits(self, pixels: int) -> bool:
        if self.active >= self.limit:
            return False
        return self.pixel_budget is None or self.active == 0 or self.pixels + pixels <= self.pixel_budget

    def _take(self, pixels: int) -> None:
        self.active += 1
        self.pixels += pixels

    async def enter(
        self, deadline: float, retry_after: Callable[[], int], pixels: int = 0, fallback_interval: float = 0.0
    ) -> None:
        """Take a slot and ``pixels`` of the budget, waiting until ``deadline`` (loop time) at most.

        ``fallback_interval`` stands for the completion interval until one was measured."""
        loop = asyncio.get_running_loop()
        if not self.waiters and self._fits(pixels):
            self._take(pixels)
            return
        budget = self.pixel_budget
        if self.max_wait is not None and budget is not None and pixels > 0 and self.queued_pixels + pixels > budget:
            wait = retry_after()
            raise ServerError(
                f"the server is overloaded: {self.pixels} decoded pixels are in use and {self.queued_pixels} "
                f"wait for the {budget}-pixel budget; this request's {pixels} would wait more than one round; "
                f"retry in {wait}s",
                code="overloaded",
                retry_after=wait,
            )
        if self.max_wait is not None:
            expected = self.expected_wait(fallback_interval)
            if expected > min(self.max_wait, deadline - loop.time()):
                wait = max(1, math.ceil(expected - self.max_wait))
                raise ServerError(
                    f"the server is overloaded: a request now would wait about {expected:.2f}s for a slot "
                    f"(at most {self.max_wait:g}s allowed); retry in {wait}s",
                    code="overloaded",
                    retry_after=wait,
                )
        if len(self.waiters) >= self.queue:
            wait = retry_after()
            raise ServerError(
                f"the server is at capacity ({self.active} running, {len(self.waiters)} waiting); retry in {wait}s",
                code="queue_full",
                retry_after=wait,
            )
        places = len(self.waiters) + 1
        queued_at = self.clock()
        fut: asyncio.Future[None] = loop.create_future()
        entry = (fut, pixels)
        self.waiters.append(entry)
        self.queued_pixels += pixels
        try:
            await asyncio.wait_for(asyncio.shield(fut), max(0.0, deadline - loop.time()))
            sample = (self.clock() - queued_at) / self._places(places)
            self.wait_per_place = sample if self.wait_per_place is None else 0.8 * self.wait_per_place + 0.2 * sample
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                self.release(pixels)  # admitted just as we gave up: pass it on
            else:
                fut.cancel()
                with contextlib.suppress(ValueError):
                    self.waiters.remove(entry)
                    self.queued_pixels -= pixels
                self._wake()  # the head left: the next one may fit now
                if isinstance(exc, TimeoutError) and self.max_wait is not None:
                    waited = self.clock() - queued_at
                    wait = retry_after()
                    raise ServerError(
                        f"the server is overloaded: no slot freed up in the {waited:.1f}s this request waited, "
                        f"all it had before its deadline; retry in {wait}s",
                        code="overloaded",
                        retry_after=wait,
                    ) from None
            raise

    def release(self, pixels: int = 0) -> None:
        saturated = self.active >= self.limit or bool(self.waiters)
        now = self.clock()
        if saturated and self._last_busy_release is not None:
            decay = 1.0 - 0.2 / self.batch  # 0.8 unbatched: an EWMA of the last ~5 intervals
            self._busy_seconds = decay * self._busy_seconds + (now - self._last_busy_release)
            self._busy_completions = decay * self._busy_completions + 1.0
            self.interval = self._busy_seconds / self._busy_completions
            if self.wait_per_place is not None:
                # decays toward the interval: while everything that would queue is shed, no waiter
                # is admitted to correct a high value, and it must not lock the queue shut
                self.wait_per_place = decay * self.wait_per_place + (1.0 - decay) * self.interval
        self._last_busy_release = now if saturated else None
        self.active -= 1
        self.pixels -= pixels
        self._wake()

    def _wake(self) -> None:
        while self.waiters:
            fut, pixels = self.waiters[0]
            if fut.done():
                self.waiters.popleft()
                self.queued_pixels -= pixels
                continue
            if not self._fits(pixels):
                return
            self.waiters.popleft()
            self.queued_pixels -= pixels
            self._take(pixels)
            fut.set_result(None)
