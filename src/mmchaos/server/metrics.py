"""The server's own Prometheus metrics (the guards register theirs in the same registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["STAGE_BUCKETS", "ServerMetrics"]

STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServerMetrics:
    """Requests by endpoint and status, latency by endpoint and stage, errors by code, occupancy."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "mmchaos_server_requests", "Requests answered, by endpoint and status.", ("endpoint", "status"),
            registry=registry,
        )  # fmt: skip
        self.seconds = Histogram(
            "mmchaos_server_request_seconds", "Request latency, by endpoint.", ("endpoint",),
            buckets=STAGE_BUCKETS, registry=registry,
        )  # fmt: skip
        self.stages = Histogram(
            "mmchaos_server_stage_seconds",
            "Time per request in each stage (decode, preprocess, model), by input modality.",
            ("modality", "stage"),
            buckets=STAGE_BUCKETS,
            registry=registry,
        )
        self.errors = Counter(
            "mmchaos_server_errors", "Error answers, by stable code.", ("code", "status"), registry=registry
        )
        self.inflight = Gauge("mmchaos_server_inflight", "Requests holding a slot.", registry=registry)
        self.queued = Gauge("mmchaos_server_queued", "Requests waiting for a slot.", registry=registry)
        self.ready = Gauge("mmchaos_server_ready", "1 when /readyz answers 200.", registry=registry)
