"""Admission control: ``limit`` concurrent slots and a bounded FIFO of waiters, on one event loop."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable

from mmchaos.server.errors import HTTPError

__all__ = ["Admission"]


class Admission:
    """``limit`` concurrent slots and a bounded FIFO of waiters; 429 ``queue_full`` beyond ``queue``."""

    def __init__(self, limit: int, queue: int) -> None:
        self.limit = limit
        self.queue = queue
        self.active = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def enter(self, deadline: float, retry_after: Callable[[], int]) -> None:
        loop = asyncio.get_running_loop()
        if self.active < self.limit and not self.waiters:
            self.active += 1
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
        self.waiters.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), max(0.0, deadline - loop.time()))
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release()  # the slot was handed over just as we gave up: pass it on
            else:
                fut.cancel()
                with contextlib.suppress(ValueError):
                    self.waiters.remove(fut)
            raise

    def release(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot passes straight to the next waiter
                return
        self.active -= 1
