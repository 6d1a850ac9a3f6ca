"""Admission control on one event loop: ``limit`` concurrent slots, a pixel budget, a bounded FIFO.

A request enters when a slot is free *and* the pixels its images declare fit in what the running
requests leave of the budget; otherwise it waits, in arrival order (the head of the queue blocks
the ones behind it, so a large request is not starved by small ones), and undecoded: the budget is
taken before any image is decoded, and given back when the request's work really ends.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable

from mmchaos.server.errors import HTTPError

__all__ = ["Admission"]


class Admission:
    """``limit`` slots and ``pixel_budget`` decoded pixels; 429 ``queue_full`` beyond ``queue`` waiters."""

    def __init__(self, limit: int, queue: int, pixel_budget: int | None = None) -> None:
        self.limit = limit
        self.queue = queue
        self.pixel_budget = pixel_budget
        self.active = 0
        self.pixels = 0
        self.waiters: collections.deque[tuple[asyncio.Future[None], int]] = collections.deque()

    def _fits(self, pixels: int) -> bool:
        if self.active >= self.limit:
            return False
        return self.pixel_budget is None or self.active == 0 or self.pixels + pixels <= self.pixel_budget

    def _take(self, pixels: int) -> None:
        self.active += 1
        self.pixels += pixels

    async def enter(self, deadline: float, retry_after: Callable[[], int], pixels: int = 0) -> None:
        """Take a slot and ``pixels`` of the budget, waiting until ``deadline`` (loop time) at most."""
        loop = asyncio.get_running_loop()
        if not self.waiters and self._fits(pixels):
            self._take(pixels)
            return
        if len(self.waiters) >= self.queue:
            wait = retry_after()
            raise HTTPError(
                429,
                "queue_full",
                f"the server is at capacity ({self.active} running, {len(self.waiters)} waiting); retry in {wait}s",
                headers={"Retry-After": str(wait)},
            )
        fut: asyncio.Future[None] = loop.create_future()
        entry = (fut, pixels)
        self.waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(fut), max(0.0, deadline - loop.time()))
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release(pixels)  # admitted just as we gave up: pass it on
            else:
                fut.cancel()
                with contextlib.suppress(ValueError):
                    self.waiters.remove(entry)
                self._wake()  # the head left: the next one may fit now
            raise

    def release(self, pixels: int = 0) -> None:
        self.active -= 1
        self.pixels -= pixels
        self._wake()

    def _wake(self) -> None:
        while self.waiters:
            fut, pixels = self.waiters[0]
            if fut.done():
                self.waiters.popleft()
                continue
            if not self._fits(pixels):
                return
            self.waiters.popleft()
            self._take(pixels)
            fut.set_result(None)
