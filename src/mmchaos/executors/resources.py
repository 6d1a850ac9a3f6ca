"""What the checks of one run share: started once (lazily, or early in the background), closed at run end.

Starting a reference server, a pool of worker processes that import torch and load the model, or
a TLS context costs seconds; several checks of a suite need the same one. Each resource is keyed
by what makes it what it is (the target and the server config, the worker spec), so a check that
needs a different configuration still gets its own. A check that leaves a resource in a state the
next check must not inherit (a server that did not recover) discards it; the next one starts fresh.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

__all__ = ["RunResources", "shared"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class _Entry:
    close: Callable[[Any], None]
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None


class RunResources:
    """A run-scoped cache of started resources; thread-safe. ``close()`` stops them all (newest first)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Hashable, _Entry] = {}
        self._closed = False
        self.wanted: set[Hashable] = set()
        """Keys asked for (prefetched or got) since this was last cleared."""
        self.fork_server: Any = None
        """The run's :class:`~mmchaos.executors.forkserver.ForkServer` (pool workers forked with the
        target loaded), or None: they are spawned and load it themselves. The runner closes it."""

    def _start(self, key: Hashable, entry: _Entry, factory: Callable[[], Any]) -> None:
        try:
            entry.value = factory()
        except BaseException as exc:  # handed to whoever asks for it
            entry.error = exc
        finally:
            entry.done.set()

    def prefetch(self, key: Hashable, factory: Callable[[], T], close: Callable[[T], None]) -> None:
        """Start ``factory()`` in a background thread now, unless ``key`` is already there."""
        with self._lock:
            self.wanted.add(key)
            if self._closed or key in self._entries:
                return
            entry = _Entry(close=close)
            self._entries[key] = entry
        threading.Thread(target=self._start, args=(key, entry, factory), daemon=True, name="mmchaos-prefetch").start()

    def get(self, key: Hashable, factory: Callable[[], T], close: Callable[[T], None]) -> T:
        """The resource under ``key``: started now if nobody started it, awaited if it is starting.

        A failed start raises here (to every caller) and is forgotten, so a later call may retry.
        """
        with self._lock:
            self.wanted.add(key)
            entry = self._entries.get(key)
            mine = entry is None
            if entry is None:
                entry = _Entry(close=close)
                self._entries[key] = entry
        if mine:
            self._start(key, entry, factory)
        entry.done.wait()
        if entry.error is not None:
            with self._lock:
                if self._entries.get(key) is entry:
                    del self._entries[key]
            raise entry.error
        return cast(T, entry.value)

    def peek(self, key: Hashable) -> Any:
        """The started resource under ``key``, or None (never starts or waits)."""
        with self._lock:
            entry = self._entries.get(key)
        if entry is None or not entry.done.is_set() or entry.error is not None:
            return None
        return entry.value

    def discard(self, key: Hashable) -> None:
        """Close and forget ``key`` (the next :meth:`get` starts a fresh one)."""
        with self._lock:
            entry = self._entries.pop(key, None)
        if entry is not None:
            self._close(key, entry)

    def _close(self, key: Hashable, entry: _Entry) -> None:
        entry.done.wait()
        if entry.error is None and entry.value is not None:
            try:
                entry.close(entry.value)
            except Exception:
                log.warning("closing the run's %r failed", key, exc_info=True)

    def close(self) -> None:
        """Close everything, all at once: a pool's workers exiting and a server draining overlap."""
        with self._lock:
            self._closed = True
            entries = list(self._entries.items())[::-1]
            self._entries.clear()
        threads = [
            threading.Thread(target=self._close, args=(key, entry), name="mmchaos-close", daemon=True)
            for key, entry in entries
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        server, self.fork_server = self.fork_server, None
        if server is not None:  # after the pools: it kills the workers they did not stop
            server.close()

    def __enter__(self) -> RunResources:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def shared(
    resources: RunResources | None, key: Hashable, factory: Callable[[], T], close: Callable[[T], None]
) -> Iterator[tuple[T, bool]]:
    """``(resource, is_shared)``: the run's resource under ``key`` when there are run ``resources``,
    else one started for this block alone and closed at its end (a check run on its own)."""
    if resources is not None:
        yield resources.get(key, factory, close), True
        return
    value = factory()
    try:
        yield value, False
    finally:
        close(value)
