"""What the serving-experiment tests share: small, fast experiment parameters."""

from __future__ import annotations

from typing import Any

FAST: dict[str, Any] = {
    "baseline_s": 0.6,
    "warmup_requests": 4,
    "concurrency": 2,
    "max_recovery_s": 2.0,
    "slo": {"window_s": 0.2, "p99_ms": 1000, "min_window_requests": 2},
    "budget": {"max_requests": 3000, "max_rate": 150, "max_duration_s": 40},
    "payload": {"large_side": 128},
}
"""Short windows, short phases, few warm-up requests: each experiment runs in seconds."""

ROOMY: dict[str, Any] = {"slo": {**FAST["slo"], "p99_ms": 5000}}
"""A p99 objective a correct service meets on any busy machine, for tests whose verdicts are about
failures, not speed. A fault phase of FAST's length holds ~12 requests, so its p99 is their slowest:
one request stalled past 1 s by the shared machine (the serving suite's test ran after 2,000 others
in one process on CI) failed `latency/moderate` for a correct service."""
