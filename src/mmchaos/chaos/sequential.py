"""Load phases that end when their SLO verdict is decided, not after a fixed time.

A steady-state probe asks one question: does the service meet its SLO (success rate >= s, p99 <=
L)? Both halves are Bernoulli rates: the error rate against ``1 - s``, and the share of answers
slower than ``L`` against 1 % (p99 <= L exactly when at most 1 % are slower). Wald's sequential
probability ratio test (SPRT) decides each between a rate at the tolerance (H0, "met") and
``indifference`` times it (H1, "breached") with error probabilities ``alpha`` and ``beta``, and
stops as soon as both say "met" or either says "breached". The phase's verdict is still the
observed statistic over everything it saw (the same ``Phase.met`` as a fixed-length phase); the
rule only stops when the test's decision and the observed statistic agree, after ``min_s`` and
never later than the phase's own length. The stop reason records n and the test's numbers, so
the decision can be recomputed from the report.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mmchaos.chaos.spec import SequentialSpec, SLOSpec
    from mmchaos.chaos.windows import WindowTracker

__all__ = ["SprtResult", "sprt", "stop_when_decided"]


@dataclass(frozen=True)
class SprtResult:
    decision: str | None  # "met" (H0 accepted), "breached" (H1 accepted) or None (undecided)
    llr: float


def sprt(n: int, bad: int, p0: float, p1: float, alpha: float, beta: float) -> SprtResult:
    """Wald's SPRT on ``bad`` events in ``n`` Bernoulli trials: H0 rate ``p0`` vs H1 rate ``p1`` > p0."""
    p0 = min(max(p0, 1e-9), 1 - 1e-9)
    p1 = min(max(p1, p0 + 1e-9), 1 - 1e-9)
    llr = bad * math.log(p1 / p0) + (n - bad) * math.log((1 - p1) / (1 - p0))
    if llr >= math.log((1 - beta) / alpha):
        return SprtResult("breached", llr)
    if llr <= math.log(beta / (1 - alpha)):
        return SprtResult("met", llr)
    return SprtResult(None, llr)


def stop_when_decided(
    slo: SLOSpec, rule: SequentialSpec, *, only: str | None = None
) -> Callable[[WindowTracker], str | None]:
    """A ``stop_when`` for :meth:`Experiment.phase`: the stop reason once the SLO verdict is decided.

    ``only="met"``: stop early only on a "met" decision (a breached phase runs its full length, so
    what it measures about the breach, such as goodput past the knee, is not cut short)."""

    def decide(tracker: WindowTracker) -> str | None:
        if len(tracker.windows) * slo.window_s < rule.min_s - 1e-9:
            return None
        n = tracker.n_events
        if n < slo.min_window_requests:
            return None
        errors = n - tracker.n_ok
        latencies = tracker.latencies_ms
        slow = sum(1 for x in latencies if x > slo.p99_ms)
        tol_err = max(1.0 - slo.min_success_rate, 1e-4)
        err = sprt(n, errors, tol_err, min(tol_err * rule.indifference, 0.999), rule.alpha, rule.beta)
        lat = sprt(len(latencies), slow, 0.01, 0.01 * rule.indifference, rule.alpha, rule.beta)
        p99 = float(np.percentile(np.asarray(latencies), 99)) if latencies else None
        observed_met = slo.met(tracker.n_ok / n, p99)
        if err.decision == "met" and lat.decision == "met" and observed_met:
            verdict = "met"
        elif "breached" in (err.decision, lat.decision) and not observed_met:
            verdict = "breached"
        else:
            return None
        if only is not None and verdict != only:
            return None
        return (
            f"sprt: SLO {verdict} after n={n} (errors={errors}, slower than {slo.p99_ms:g} ms={slow}; "
            f"alpha={rule.alpha:g} beta={rule.beta:g} H0 rates {tol_err:g}/0.01 vs {rule.indifference:g}x; "
            f"llr {err.llr:.2f}/{lat.llr:.2f})"
        )

    return decide
