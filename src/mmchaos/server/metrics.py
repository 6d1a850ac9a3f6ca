"""The server's own Prometheus metrics (the guards register theirs in the same registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["BATCH_BUCKETS", "REQUEST_BUCKETS", "STAGE_BUCKETS", "TOKEN_BUCKETS", "GenerationMetrics", "ServerMetrics"]

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
        self.batch_size = Histogram(
            "mmchaos_server_batch_size", "Requests per model batch (batching on), by kind (embed, chat).",
            ("kind",), buckets=BATCH_BUCKETS, registry=registry,
        )  # fmt: skip
        self.queued = Gauge("mmchaos_server_queued", "Requests waiting for a slot.", registry=registry)
        self.ready = Gauge("mmchaos_server_ready", "1 when /readyz answers 200.", registry=registry)


#: Requests per model batch.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
#: vLLM's buckets for time to first token and per-token latency (seconds).
TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)


class GenerationMetrics:
    """Generation metrics under vLLM's names (``vllm:...``, label ``model_name``), so the dashboards
    and alerts written for a vLLM deployment read the reference server unchanged.

    Time to first token and the per-token latencies are observed on streamed requests (where the
    server sees tokens leave one by one); end-to-end latency and the token counters on every chat
    request. ``num_requests_running`` / ``num_requests_waiting`` read the admission state directly:
    a slot counts as running until its work really ends, also after its client left.
    """

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        labels = ("model_name",)
        self.model_name = model_name
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time from the request's arrival to its first streamed token.",
            labels, buckets=TOKEN_BUCKETS, registry=registry,
        ).labels(model_name)  # fmt: skip
        self.tpot = Histogram(
            "vllm:time_per_output_token_seconds",
            "Per streamed request: (last token time - first token time) / (output tokens - 1).",
            labels, buckets=TOKEN_BUCKETS, registry=registry,
        ).labels(model_name)  # fmt: skip
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "Time between two consecutive streamed deltas.",
            labels, buckets=TOKEN_BUCKETS, registry=registry,
        ).labels(model_name)  # fmt: skip
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Chat request latency, arrival to last token.",
            labels, buckets=REQUEST_BUCKETS, registry=registry,
        ).labels(model_name)  # fmt: skip
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens of finished chat requests.", labels, registry=registry
        ).labels(model_name)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generated tokens of finished chat requests.", labels, registry=registry
        ).labels(model_name)
        self.success = Counter(
            "vllm:request_success", "Finished chat requests, by finish reason.", ("model_name", "finished_reason"),
            registry=registry,
        )  # fmt: skip
        self.running = Gauge("vllm:num_requests_running", "Requests holding a slot.", labels, registry=registry)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting for a slot.", labels, registry=registry)

    def finished_tokens(self, prompt_tokens: int, generation_tokens: int, seconds: float) -> None:
        """One chat request answered in full: its tokens and its end-to-end latency."""
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generation_tokens)
        self.e2e.observe(seconds)
