"""Running a request's work: admission (a slot and pixels of the budget, or a place in the queue),
one worker thread, the request timeout, and the client-disconnect watch.

A request has ``request_timeout`` seconds (504 past it); a timed-out model call keeps its slot
until it really ends, so a hung model fills the queue instead of piling up threads. A request
whose client left (499) or timed out sets its job's ``cancel`` event: the job stops before its
next decode or model call.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from mmchaos.server.admission import Admission
from mmchaos.server.config import ServerConfig
from mmchaos.server.errors import RequestCancelled, ServerError
from mmchaos.server.metrics import ServerMetrics

__all__ = ["ClientGone", "GenerationStream", "WorkPool", "unless_gone"]

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected while its request waited or ran."""


def client_gone() -> ServerError:
    """The refusal recorded for a request whose client left (nobody reads it: the status is for the metrics)."""
    return ServerError("the client closed the connection", code="client_disconnected")


async def unless_gone(
    work: Awaitable[T], gone: asyncio.Future[Any] | None, undo: Callable[[T], object] | None = None
) -> T:
    """``await work``, unless ``gone`` completes first: then ``work`` is cancelled and ClientGone raised.

    ``undo(result)`` runs when ``work`` finishes with a result that nobody reads because this await
    was cancelled (the cancellation came after ``work`` completed, or ``work`` completed in spite of
    it): an admission that took a slot must give it back, or the slot is lost for good (the
    post-overload wedge)."""
    if gone is None:
        return await work
    task = asyncio.ensure_future(work)

    def drop() -> None:
        if undo is not None:
            # Now, or later: a cancelled ``work`` may still finish with a result (3.11's wait_for
            # returns its inner result when that is ready as the cancellation arrives).
            task.add_done_callback(lambda t: t.cancelled() or t.exception() is not None or undo(t.result()))
        task.cancel()

    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        drop()
        raise
    if task in done:
        return task.result()
    drop()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientGone()


class WorkPool:
    """The worker threads, behind admission control (``guards`` on) and the request timeout.

    ``call_seconds()`` is the measured time of one model call; ``refusal()`` a reason not to take
    work at all (the model failed its load check), or None.
    """

    def __init__(
        self,
        config: ServerConfig,
        admission: Admission,
        metrics: ServerMetrics,
        *,
        guards: bool,
        call_seconds: Callable[[], float],
        refusal: Callable[[], ServerError | None],
    ) -> None:
        self.config = config
        self.admission = admission
        self.metrics = metrics
        self.guards = guards
        self.call_seconds = call_seconds
        self.refusal = refusal
        self.pool: ThreadPoolExecutor | None = None
        self.outstanding = 0  # jobs in the worker pool, answered or not
        self._ewma_seconds = 0.05
        self._ewma_measured = False  # the first job's time replaces the 0.05 s guess outright

    def start(self) -> None:
        self.pool = ThreadPoolExecutor(self.config.max_concurrency, thread_name_prefix="mmchaos-serve")

    def stop(self, wait: bool = True) -> None:
        """Stop the workers: with ``wait``, after the calls still running finish."""
        if self.pool is not None:
            self.pool.shutdown(wait=wait, cancel_futures=True)
            self.pool = None

    async def drain(self, timeout: float) -> bool:
        """Wait (up to ``timeout``) for jobs that outlived their requests; True if none is left."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.outstanding and loop.time() < deadline:
            await asyncio.sleep(0.02)
        return self.outstanding == 0

    def retry_after(self) -> int:
        """Whole seconds until a slot is likely free: the queue ahead over the slots, one job each."""
        waiting = len(self.admission.waiters) + 1
        return max(1, math.ceil(self._ewma_seconds * waiting / self.config.max_concurrency))

    def _open(self) -> ThreadPoolExecutor:
        pool = self.pool
        if pool is None:
            raise ServerError("the server is not running", code="not_ready")
        refusal = self.refusal()
        if refusal is not None:
            raise refusal
        return pool

    async def run(
        self, job: Callable[[threading.Event], T], *, pixels: int = 0, gone: Awaitable[object] | None = None
    ) -> T:
        """Run ``job(cancel)`` in a worker thread under admission control and the request timeout.

        ``pixels`` is what the request's images declare (taken from the budget until the job really
        ends); ``gone`` completes when the client disconnects.
        """
        loop = asyncio.get_running_loop()
        watcher = asyncio.ensure_future(gone) if gone is not None else None
        cancel = threading.Event()
        work = partial(contextvars.copy_context().run, job, cancel)  # the request's span goes along
        try:
            pool = self._open()
            if not self.guards:
                self.outstanding += 1
                try:
                    return await loop.run_in_executor(pool, work)  # the bare baseline: nothing watched
                finally:
                    self.outstanding -= 1
            return await self._run_admitted(pool, work, pixels, watcher)
        except ClientGone as exc:
            cancel.set()
            raise client_gone() from exc
        except ServerError as exc:
            if exc.code == "request_timeout":
                cancel.set()
            raise
        except asyncio.CancelledError:
            cancel.set()
            raise
        finally:
            if watcher is not None:
                watcher.cancel()

    async def _run_admitted(
        self, pool: ThreadPoolExecutor, work: Callable[[], T], pixels: int, watcher: asyncio.Future[Any] | None
    ) -> T:
        loop = asyncio.get_running_loop()
        timeout = self.config.request_timeout
        deadline = loop.time() + timeout
        await self._admit(pixels, watcher, deadline)
        fut = self._submit(pool, work, pixels, admitted=True)
        try:
            return await unless_gone(asyncio.wait_for(asyncio.shield(fut), max(0.0, deadline - loop.time())), watcher)
        except TimeoutError as exc:
            raise ServerError(f"the request took longer than {timeout:g}s", code="request_timeout") from exc

    async def _admit(self, pixels: int, watcher: asyncio.Future[Any] | None, deadline: float) -> None:
        """A slot and ``pixels`` of the budget by ``deadline`` (loop time): else 504, 429 or ClientGone."""
        self.metrics.queued.inc()
        try:
            # Until the admission measured the service saturated, the interval between completions
            # is estimated as the longer of a job's time over the slots (what it is when the slots
            # are the limit) and one model call (the model lock serialises the calls).
            # With batching, one model call serves a round of ``admission.batch`` requests.
            fallback = max(self.call_seconds() / self.admission.batch, self._ewma_seconds / self.config.max_concurrency)
            await unless_gone(
                self.admission.enter(deadline, self.retry_after, pixels, fallback),
                watcher,
                undo=lambda _: self.admission.release(pixels),
            )
        except TimeoutError as exc:
            raise ServerError(
                f"no slot freed up within the {self.config.request_timeout:g}s request timeout", code="request_timeout"
            ) from exc
        finally:
            self.metrics.queued.dec()

    def _submit(
        self, pool: ThreadPoolExecutor, work: Callable[[], T], pixels: int, *, admitted: bool
    ) -> asyncio.Future[T]:
        """Start ``work`` in the pool; an admitted request's slot and pixels are held until it really ends."""
        loop = asyncio.get_running_loop()
        if admitted:
            self.metrics.inflight.inc()
        started = time.perf_counter()
        try:
            fut = loop.run_in_executor(pool, work)
        except BaseException:
            if admitted:
                self.admission.release(pixels)
                self.metrics.inflight.dec()
            raise
        self.outstanding += 1

        def done(f: asyncio.Future[T]) -> None:
            # The slot and the pixels are held until the work really ends, even after a 504.
            self.outstanding -= 1
            if admitted:
                self.admission.release(pixels)
                self.metrics.inflight.dec()
                took = time.perf_counter() - started
                self._ewma_seconds = 0.8 * self._ewma_seconds + 0.2 * took if self._ewma_measured else took
                self._ewma_measured = True
            if not f.cancelled():
                f.exception()  # retrieved: a late failure after a 504 is not an unhandled error

        fut.add_done_callback(done)
        return fut

    async def open_stream(
        self,
        job: Callable[[threading.Event, Callable[[str], None]], object],
        *,
        pixels: int = 0,
        gone: Awaitable[object] | None = None,
    ) -> GenerationStream:
        """Admit a streamed request and start ``job(cancel, emit)`` in a worker thread.

        Admission as :meth:`run` (429, 504 while waiting, 499 when the client leaves first). The job
        calls ``emit(delta)`` for each piece of text; the caller reads them from the returned stream
        and calls :meth:`GenerationStream.cancel` when its client goes away: the job stops at its
        next delta and the slot is given back when it really ends.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, object]] = asyncio.Queue()
        cancel = threading.Event()

        def emit(delta: str) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (time.perf_counter(), delta))

        work = partial(contextvars.copy_context().run, job, cancel, emit)
        watcher = asyncio.ensure_future(gone) if gone is not None else None
        try:
            pool = self._open()
            if self.guards:
                await self._admit(pixels, watcher, loop.time() + self.config.request_timeout)
            fut = self._submit(pool, work, pixels, admitted=self.guards)
        except ClientGone as exc:
            raise client_gone() from exc
        finally:
            if watcher is not None:
                watcher.cancel()
        fut.add_done_callback(lambda f: queue.put_nowait((time.perf_counter(), f)))
        return GenerationStream(queue, cancel)


class GenerationStream:
    """The events of one streamed job: ``(time, delta)`` as the model produces them, then the end."""

    def __init__(self, queue: asyncio.Queue[tuple[float, object]], cancel: threading.Event) -> None:
        self._queue = queue
        self._cancel = cancel
        self.finished = False
        self.result: object = None
        """What the job returned (the stream job: its completion tokens, where the tokenizer counted them)."""

    async def next(self, timeout: float) -> tuple[float, str] | None:
        """The next delta with its time (perf_counter), or None at the end; the job's error is raised
        here, and TimeoutError when nothing came within ``timeout`` seconds."""
        stamp, event = await asyncio.wait_for(self._queue.get(), timeout)
        if isinstance(event, str):
            return stamp, event
        self.finished = True
        assert isinstance(event, asyncio.Future)
        if event.cancelled():
            raise RequestCancelled()
        exc = event.exception()
        if exc is not None:
            raise exc
        self.result = event.result()
        return None

    def cancel(self) -> None:
        """Stop the job at its next delta (its client left or timed out)."""
        self._cancel.set()
