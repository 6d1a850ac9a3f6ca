"""Find a text context limit by asking: the largest length whose last word still changes the output.

Behind a gateway the endpoint may state no limit (the ``mmchaos`` block of ``/v1/models`` stripped,
no ``max_model_len`` on the card). The limit is then probed: a length "fits" when two texts that
differ only in their last word get different outputs (past the limit the last word is cut, or the
text is refused). Lengths double from ``start`` until one does not fit, then the bracket is
bisected, trying first the limits real models ship with (the bracket's lower end, 77 for CLIP,
powers of two), so a common limit costs one or two requests past the doubling. The request count
is bounded: a probe that runs out says so, with the bracket it reached.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["COMMON_LIMITS", "LimitProbe", "probe_limit"]

COMMON_LIMITS = (77, 64, 512, 8192, 4096, 2048, 1024, 256, 128, 32768, 16384, 32, 16)
"""Text limits real models ship with (CLIP's 77 with its specials, SigLIP's 64, BERT's 512, ...), tried first."""


@dataclass
class LimitProbe:
    """What probing found: ``limit`` (None: not found), the bracket, and every length tried."""

    limit: int | None = None
    fits: int | None = None
    """The largest length seen to fit."""
    cut: int | None = None
    """The smallest length seen not to fit."""
    requests: int = 0
    max_requests: int = 0
    ceiling: int = 0
    tried: list[dict[str, Any]] = field(default_factory=list)
    outcome: str = ""
    """``found``, ``no_limit`` (everything up to the ceiling fits), ``budget`` (requests ran out) or
    ``never_fits`` (not even the shortest text's last word changes the output)."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def probe_limit(
    fits: Callable[[int], tuple[bool, str]],
    *,
    floor: int,
    start: int = 16,
    ceiling: int = 16384,
    max_requests: int = 12,
) -> LimitProbe:
    """The largest length in ``[floor, ceiling]`` for which ``fits(n)`` holds, in at most ``max_requests``
    calls of ``fits`` (one request each); ``fits`` returns (whether it fits, what happened)."""
    out = LimitProbe(max_requests=max_requests, ceiling=ceiling)
    seen: dict[int, bool] = {}

    def ask(n: int) -> bool:
        if n in seen:
            return seen[n]
        ok, what = fits(n)
        out.requests += 1
        seen[n] = ok
        out.tried.append({"tokens": n, "fits": ok, "outcome": what})
        return ok

    lo: int | None = None  # the largest length known to fit
    hi: int | None = None  # the smallest length known not to
    n = max(start, floor)
    while out.requests < max_requests:
        if not ask(n):
            hi = n
            break
        lo = n
        if n >= ceiling:
            break
        n = min(2 * n, ceiling)
    out.fits = lo
    if hi is None:
        out.outcome = "no_limit" if lo is not None and lo >= ceiling else "budget"
        return out
    base = lo if lo is not None else floor - 1  # floor - 1: nothing is known to fit yet
    if lo is not None and hi - lo > 1 and out.requests < max_requests:  # the doubling hit the limit itself?
        if ask(lo + 1):
            base = lo + 1
        else:
            hi = lo + 1
    while hi - base > 1 and out.requests < max_requests:
        mid = _pivot(base, hi, seen)
        if ask(mid):
            base = mid
        else:
            hi = mid
    out.fits = base if base >= floor else None
    out.cut = hi
    if hi - base > 1:
        out.outcome = "budget"
    elif base < floor:
        out.outcome = "never_fits"
    else:
        out.limit, out.outcome = base, "found"
    return out


def _pivot(lo: int, hi: int, seen: dict[int, bool]) -> int:
    """The next length to try strictly between ``lo`` and ``hi``: a common limit (just past it, then
    it), else the middle."""
    for c in COMMON_LIMITS:
        for n in (c + 1, c):
            if lo < n < hi and n not in seen:
                return n
    return (lo + hi) // 2
