"""What the unit and integration halves of ``test_guard_slo.py`` share.

Those tests: BurnRateSLO: each workbook alert fires when its long window has burned enough (and not before),.
"""

from __future__ import annotations

import shutil

from mmchaos.guard import BurnRateSLO

MINUTE = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Traffic:
    """50 events a minute, recorded in one call per minute, with a chosen error ratio."""

    def __init__(self, slo: BurnRateSLO, clock: Clock) -> None:
        self.slo, self.clock = slo, clock

    def run(self, minutes: float, error_ratio: float = 0.0) -> None:
        for _ in range(round(minutes)):
            self.clock.now += MINUTE
            bad = round(50 * error_ratio)
            self.slo.record(True, count=50 - bad)
            if bad:
                self.slo.record(False, count=bad)


def firing(slo: BurnRateSLO) -> set[tuple[str, float]]:
    return {(s.severity, s.long_window) for s in slo.alerts() if s.firing}


PROMTOOL = shutil.which("promtool")
