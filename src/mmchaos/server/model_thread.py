"""What the batching threads share: one thread that owns the model's batches, a queue of requests
submitted by worker threads, and the workers' wait for their answer.

:class:`~mmchaos.server.batcher.Batcher` (whole batched calls) and
:class:`~mmchaos.server.continuous.ContinuousEngine` (rows joining and leaving a decoding batch)
differ in how they form and run batches (their ``_loop``), not in how a worker waits: a request
cancelled while it waits leaves the queue at once; one already running waits for the thread to
answer it (the thread decides when a running request can leave).
"""

from __future__ import annotations

import threading
from typing import Any, Generic, Protocol, TypeVar

from mmchaos.server.errors import RequestCancelled

__all__ = ["ModelThread", "Waiting"]

POLL_S = 0.05
"""How often a waiting worker looks at its cancel event."""


class Waiting(Protocol):
    """A submitted request as the worker waits on it."""

    cancel: threading.Event
    done: threading.Event
    running: bool
    result: Any
    error: BaseException | None


E = TypeVar("E", bound=Waiting)


class ModelThread(Generic[E]):
    """The thread, its queue of ``E`` entries and its lifecycle; subclasses give ``_loop``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._pending: list[E] = []
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def waiting(self) -> int:
        """Requests submitted and not yet running."""
        with self._cond:
            return len(self._pending)

    def start(self) -> None:
        with self._cond:
            self._stopping = False
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """Stop the thread after the model call it runs; requests still waiting are refused (not_ready)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        thread, self._thread = self._thread, None
        if thread is not None and wait:
            thread.join()

    def _loop(self) -> None:
        raise NotImplementedError

    def _answer_of(self, entry: E) -> Any:
        """Wait for ``entry``'s answer (raise its error); cancelled while it waits, it leaves the queue."""
        while not entry.done.wait(POLL_S):
            if entry.cancel.is_set():
                with self._cond:
                    if not entry.running and not entry.done.is_set():
                        self._pending.remove(entry)
                        raise RequestCancelled()
                # running: the thread answers it (at the batch's end, or its row's next step)
        if entry.error is not None:
            raise entry.error
        return entry.result
