"""Committing finished units to the run store, so a resumed run computes only the missing ones.

:func:`run_units` walks the units in order: a unit the journal holds is read back, the others
go to the executor, and each new result is committed the moment it arrives. Every result goes
through the same JSON encoding whether it was computed now or read back, so a resumed run and
an uninterrupted one aggregate identical values.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from mmchaos.executors.base import Executor, UnitFn
from mmchaos.executors.codec import json_default

if TYPE_CHECKING:
    from mmchaos.store import RunStore
    from mmchaos.timing import ModelClock

__all__ = ["StoreJournal", "UnitJournal", "run_units"]

log = logging.getLogger(__name__)

S = TypeVar("S")
U = TypeVar("U")
R = TypeVar("R")


class UnitJournal(Protocol):
    """Where a check's finished units are kept until the check commits its findings."""

    def keys(self) -> set[str]:
        """The units already committed."""

    def get(self, key: str) -> str:
        """The JSON body of a committed unit."""

    def commit(self, key: str, body: str) -> None:
        """Keep one finished unit (durably: it must survive the driver dying next)."""


class StoreJournal:
    """The units table of a run store, for one check of one run."""

    def __init__(self, store: RunStore, run_id: str, check_id: str) -> None:
        self.store, self.run_id, self.check_id = store, run_id, check_id

    def keys(self) -> set[str]:
        return self.store.unit_keys(self.run_id, self.check_id)

    def get(self, key: str) -> str:
        return self.store.unit(self.run_id, self.check_id, key)

    def commit(self, key: str, body: str) -> None:
        self.store.commit_unit(self.run_id, self.check_id, key, body)


def run_units(
    executor: Executor,
    fn: UnitFn[S, U, R],
    shared: S,
    units: Sequence[U],
    *,
    keys: Sequence[str],
    encode: Callable[[R], Any],
    decode: Callable[[Any], R],
    journal: UnitJournal | None = None,
    what: str = "units",
    clock: ModelClock | None = None,
) -> Generator[R, None, None]:
    """The results of ``units`` in order: read back where the journal has them, computed otherwise.

    ``clock`` receives the model time of units computed on remote workers (see :meth:`Executor.map`).
    """
    if len(keys) != len(units) or len(set(keys)) != len(keys):
        raise ValueError("every unit needs its own key")
    have = journal.keys() & set(keys) if journal is not None else set()
    if have:
        log.info("resume: %d of %d %s read back from the store, %d to compute", len(have), len(keys), what,
                 len(keys) - len(have))  # fmt: skip
    fresh = executor.map(fn, shared, [u for u, k in zip(units, keys, strict=True) if k not in have], clock=clock)
    for key in keys:
        if journal is not None and key in have:
            yield decode(json.loads(journal.get(key)))
            continue
        body = json.dumps(encode(next(fresh)), default=json_default)
        if journal is not None:
            journal.commit(key, body)
        yield decode(json.loads(body))
