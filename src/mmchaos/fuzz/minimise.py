"""Delta debugging: the smallest input that still fails with the same signature.

Zeller's ddmin over *units*, coarse to fine: first the container's own pieces (PNG chunks, JPEG
segments, RIFF chunks), rebuilt correctly (CRCs, lengths) so a removal tests the decoder, not the
checksum; then each remaining PNG or RIFF chunk's data (CRC and sizes recomputed); then plain bytes. Candidates of
one round are tested together (one batch to the worker pool) and the first that still fails, in
order, is kept: the result does not depend on which worker answered first. A budget in tests and
seconds bounds it; the best input so far is returned when the budget runs out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from mmchaos.fuzz.formats import (
    JpegSegment,
    PngChunk,
    build_jpeg,
    build_png,
    build_riff,
    parse_jpeg,
    parse_png,
    parse_riff,
    sniff,
)

__all__ = ["MinimiseBudget", "Minimiser", "ddmin"]

T = TypeVar("T")
BatchTest = Callable[[list[bytes]], list[bool]]
"""Runs candidates (in order) and says which still fail with the same signature."""


@dataclass
class MinimiseBudget:
    max_tests: int = 400
    max_seconds: float = 30.0
    tests: int = 0
    started: float = field(default_factory=time.monotonic)

    def left(self) -> int:
        if time.monotonic() - self.started > self.max_seconds:
            return 0
        return max(0, self.max_tests - self.tests)


class _Cached:
    """The batch test with a memo (ddmin revisits candidates) and the budget applied."""

    def __init__(self, test: BatchTest, budget: MinimiseBudget) -> None:
        self.test = test
        self.budget = budget
        self.memo: dict[bytes, bool] = {}

    def __call__(self, candidates: list[bytes]) -> list[bool] | None:
        fresh = [c for c in dict.fromkeys(candidates) if c not in self.memo]
        if fresh:
            if self.budget.left() < len(fresh):
                fresh = fresh[: self.budget.left()]
                if not fresh:
                    return None
            self.budget.tests += len(fresh)
            for c, ok in zip(fresh, self.test(fresh), strict=True):
                self.memo[c] = ok
        if any(c not in self.memo for c in candidates):
            return None  # out of budget mid-round: the caller keeps what it has
        return [self.memo[c] for c in candidates]


def ddmin(units: Sequence[T], build: Callable[[Sequence[T]], bytes], test: _Cached) -> list[T]:
    """The 1-minimal subsequence of ``units`` (within budget) whose ``build`` still fails."""
    current = list(units)
    n = 2
    while len(current) >= 2:
        size = -(-len(current) // n)
        parts = [current[i : i + size] for i in range(0, len(current), size)]
        complements = [current[:i * size] + current[(i + 1) * size :] for i in range(len(parts))]  # fmt: skip
        candidates = parts + complements if n == 2 else complements
        answers = test([build(c) for c in candidates])
        if answers is None:
            return current
        hit = next((c for c, ok in zip(candidates, answers, strict=True) if ok), None)
        if hit is not None:
            current = list(hit)
            n = 2 if hit in parts else max(n - 1, 2)
            continue
        if n >= len(current):
            break
        n = min(len(current), 2 * n)
    if len(current) == 1:
        answers = test([build([])])
        if answers and answers[0]:
            return []
    return current


class Minimiser:
    """Shrinks one failing input by structure, then by bytes, within one budget."""

    def __init__(self, test: BatchTest, budget: MinimiseBudget | None = None) -> None:
        self.budget = budget or MinimiseBudget()
        self._test = _Cached(test, self.budget)

    @property
    def tests(self) -> int:
        return self.budget.tests

    def minimise(self, data: bytes) -> bytes:
        best = data
        for step in (self._containers, self._chunk_data, self._bytes):
            if self.budget.left() <= 0:
                break
            best = step(best)
        return best

    def _containers(self, data: bytes) -> bytes:
        fmt = sniff(data)
        if fmt == "png":
            parsed = parse_png(data)
            if parsed and len(parsed[0]) > 1:

                def png(units: Sequence[PngChunk]) -> bytes:
                    return build_png(list(units))

                kept = ddmin(parsed[0], png, self._test)
                return self._smaller(data, png(kept))
        if fmt == "jpeg":
            segments = parse_jpeg(data)
            if segments and len(segments) > 1:

                def jpeg(units: Sequence[JpegSegment]) -> bytes:
                    return build_jpeg(list(units))

                return self._smaller(data, jpeg(ddmin(segments, jpeg, self._test)))
        if fmt == "webp":
            chunks = parse_riff(data)
            if chunks and len(chunks) > 1:

                def riff(units: Sequence[tuple[bytes, bytes]]) -> bytes:
                    return build_riff(list(units))

                return self._smaller(data, riff(ddmin(chunks, riff, self._test)))
        return data

    def _chunk_data(self, data: bytes) -> bytes:
        return self._riff_chunk_data(data) if sniff(data) == "webp" else self._png_chunk_data(data)

    def _riff_chunk_data(self, data: bytes) -> bytes:
        chunks = parse_riff(data)
        if not chunks:
            return data
        for i, (tag, body) in enumerate(chunks):
            if len(body) < 2 or self.budget.left() <= 0:
                continue

            def with_body(units: Sequence[int], i: int = i, tag: bytes = tag) -> bytes:
                edited = list(chunks)
                edited[i] = (tag, bytes(units))
                return build_riff(edited)

            kept = ddmin(list(body), with_body, self._test)
            if len(kept) < len(body):
                chunks[i] = (tag, bytes(kept))
        return self._smaller(data, build_riff(chunks))

    def _png_chunk_data(self, data: bytes) -> bytes:
        parsed = parse_png(data)
        if parsed is None:
            return data
        chunks, tail = parsed
        for i, chunk in enumerate(chunks):
            if len(chunk.data) < 2 or self.budget.left() <= 0:
                continue

            def with_data(units: Sequence[int], i: int = i) -> bytes:
                edited = list(chunks)
                edited[i] = PngChunk(edited[i].tag, bytes(units))
                return build_png(edited, tail)

            kept = ddmin(list(chunk.data), with_data, self._test)
            if len(kept) < len(chunk.data):
                chunks[i] = PngChunk(chunk.tag, bytes(kept))
        return self._smaller(data, build_png(chunks, tail))

    def _bytes(self, data: bytes) -> bytes:
        if len(data) > 8192:
            return data  # byte-level ddmin would spend the budget in its first rounds
        return self._smaller(data, bytes(ddmin(list(data), bytes, self._test)))

    def _smaller(self, old: bytes, new: bytes) -> bytes:
        """``new`` if it is shorter and (already known to) still fail, else ``old``."""
        if len(new) >= len(old):
            return old
        answers = self._test([new])
        return new if answers and answers[0] else old
