"""The series ``metrics_exposure`` expects on ``/metrics``, by server family, and how a scrape is read.

Servers name their metrics differently, so the expectations come from naming conventions: the
reference server's ``mmchaos_*``, vLLM's ``vllm:*``, SGLang's ``sglang:*``,
prometheus-fastapi-instrumentator's ``http_*`` and OpenTelemetry's HTTP semantic conventions. A
convention applies when its request-latency series (the first of its list) is on ``/metrics``.

Embeddings traffic and chat traffic move different series: a chat server's incident signals are
time to first token, per-token latency, the running/waiting queue and the token counters, so chat
traffic is judged against :data:`CHAT_CONVENTIONS`. A series may have to grow by at least what the
traffic sent (``at_least``: requests answered or streamed, the prompt and completion tokens the
answers' ``usage`` counted), not merely move: a counter that moves by one per request while it
claims to count tokens is as blind as a missing one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from mmchaos.chaos.spec import Spec

__all__ = [
    "CHAT_CONVENTIONS",
    "CONVENTIONS",
    "DEFAULT_SERIES",
    "ConventionName",
    "Samples",
    "SeriesSpec",
    "Tally",
    "exposed_conventions",
    "present_name",
    "scrape",
    "total",
]

_SAMPLE_NAME = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"

Tally = Literal["sent", "answered", "streamed", "streamed_multi_token", "prompt_tokens", "completion_tokens"]
"""What the traffic amounted to, as the check counts it (the answers' ``usage`` for the tokens)."""


class SeriesSpec(Spec):
    """A series that must be on /metrics: a sample name and a subset of its labels."""

    group: Literal["latency", "guards", "errors", "traffic", "queue", "tokens"]
    name: str = Field(pattern=_SAMPLE_NAME, description="sample name, e.g. ..._count, ..._total")
    aliases: list[Annotated[str, Field(pattern=_SAMPLE_NAME)]] = Field(
        default_factory=list, description="other spellings of the same series (the first one present counts)"
    )
    labels: dict[str, str] = Field(default_factory=dict)
    label_match: Literal["exact", "regex"] = Field(
        "exact", description="how label values match: equal, or a regular expression matching the whole value"
    )
    moves: bool = Field(True, description="its value (summed over matching series) grows with the traffic")
    at_least: Tally | None = Field(
        None,
        description="it grows by at least this much of the traffic (requests sent, answered or streamed; the "
        "prompt or completion tokens the answers' usage counted); when the traffic had none, it need not move",
    )
    value: float | None = Field(None, description="its value (summed) after the traffic")
    modality: Literal["image", "text"] | None = Field(None, description="only when the target has this modality")
    what: str = ""

    @model_validator(mode="after")
    def _valid_patterns(self) -> SeriesSpec:
        if self.label_match == "regex":
            for key, pattern in self.labels.items():
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ValueError(f"label {key!r}: {pattern!r} is not a regular expression ({exc})") from None
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a sample's labels hold every label this spec asks for."""
        if self.label_match == "exact":
            return all(labels.get(k) == want for k, want in self.labels.items())
        return all(k in labels and re.fullmatch(want, labels[k]) for k, want in self.labels.items())

    def render(self, name: str | None = None) -> str:
        """``name{k="v",...}``, as the evidence shows it."""
        shown = ",".join(f'{k}{"=~" if self.label_match == "regex" else "="}"{v}"' for k, v in self.labels.items())
        return (name or self.name) + ("{" + shown + "}" if self.labels else "")


def _s(group: str, name: str, what: str, **kw: Any) -> SeriesSpec:
    return SeriesSpec.model_validate({"group": group, "name": name, "what": what, **kw})


def _mmchaos(endpoint: str, stages: tuple[SeriesSpec, ...], drift: bool) -> tuple[SeriesSpec, ...]:
    """The reference server's series for traffic to ``endpoint``."""
    guards = (
        _s("guards", "mmchaos_server_ready", "readiness", moves=False, value=1.0),
        _s(
            "guards",
            "mmchaos_breaker_state",
            "breaker state",
            labels={"name": "model", "state": "closed"},
            moves=False,
            value=1.0,
        ),
        _s(
            "guards",
            "mmchaos_breaker_calls_total",
            "breaker sees model calls",
            labels={"name": "model", "kind": "successful"},
        ),
        _s("guards", "mmchaos_preflight_inputs_total", "preflight checks inputs", labels={"name": "server"}),
        *([_s("guards", "mmchaos_drift_embeddings_total", "drift monitor is fed", labels={"name": "server"})] * drift),
        _s("guards", "mmchaos_slo_requests_total", "SLO counts requests", labels={"slo": "server"}),
    )
    return (
        _s(
            "latency",
            "mmchaos_server_request_seconds_count",
            "request latency histogram",
            labels={"endpoint": endpoint},
        ),
        *stages,
        _s(
            "traffic",
            "mmchaos_server_requests_total",
            "answered requests",
            labels={"endpoint": endpoint, "status": "200"},
        ),
        _s("errors", "mmchaos_server_errors_total", "error answers by code", labels={"status": "400"}),
        _s("errors", "mmchaos_server_requests_total", "4xx answers", labels={"endpoint": endpoint, "status": "400"}),
        *guards,
    )


def _stage(what: str, of: str, stage: str, **kw: Any) -> SeriesSpec:
    """The reference server's time per request in one ``stage`` for inputs ``of`` one modality."""
    return _s("latency", "mmchaos_server_stage_seconds_count", what, labels={"modality": of, "stage": stage}, **kw)


DEFAULT_SERIES: tuple[SeriesSpec, ...] = _mmchaos(
    "/v1/embeddings",
    (
        _stage("image model latency", "image", "model", modality="image"),
        _stage("image decode latency", "image", "decode", modality="image"),
        _stage("text model latency", "text", "model", modality="text"),
    ),
    drift=True,
)
"""The reference server's series for embeddings traffic."""

_MMCHAOS_CHAT = _mmchaos(
    "/v1/chat/completions",
    (
        _stage("chat model latency", "chat", "model", at_least="answered"),
        _stage("image decode latency", "image", "decode", modality="image"),
    ),
    drift=False,  # the drift monitor watches embeddings; generate_drift watches answers
)

ConventionName = Literal["mmchaos", "vllm", "sglang", "fastapi_instrumentator", "opentelemetry"]

_FASTAPI = (
    _s("latency", "http_request_duration_seconds_count", "request latency (prometheus-fastapi-instrumentator)"),
    _s("traffic", "http_requests_total", "2xx answers", labels={"status": "2xx"}),
    _s("errors", "http_requests_total", "4xx answers", labels={"status": "4xx"}),
)


def _otel(group: str, what: str, **kw: Any) -> SeriesSpec:
    """OpenTelemetry's HTTP server duration (``_seconds`` is in the name only with a unit suffix)."""
    return _s(group, "http_server_request_duration_seconds_count", what,
              aliases=["http_server_request_duration_count"], **kw)  # fmt: skip


_OTEL = (
    _otel("latency", "HTTP server request duration (OpenTelemetry)"),
    _otel("traffic", "2xx answers", labels={"http_response_status_code": "2[0-9][0-9]"}, label_match="regex"),
    _otel("errors", "4xx answers", labels={"http_response_status_code": "4[0-9][0-9]"}, label_match="regex"),
)

CONVENTIONS: dict[ConventionName, tuple[SeriesSpec, ...]] = {
    # The first series of each is its request-latency series: the convention applies when it is exported.
    "mmchaos": DEFAULT_SERIES,
    "vllm": (
        _s("latency", "vllm:e2e_request_latency_seconds_count", "end-to-end request latency (vLLM)"),
        _s("traffic", "vllm:num_requests_running", "requests running (vLLM)", moves=False),
    ),
    "sglang": (
        _s("latency", "sglang:e2e_request_latency_seconds_count", "end-to-end request latency (SGLang)"),
        _s("queue", "sglang:num_running_reqs", "requests running (SGLang)", moves=False),
    ),
    "fastapi_instrumentator": _FASTAPI,
    "opentelemetry": _OTEL,
}
"""What each server family exports for embeddings traffic, by its own names (vLLM's /metrics also
carries the instrumentator's)."""


def _engine(prefix: str, who: str, running: str, waiting: str, tpot: list[str]) -> tuple[SeriesSpec, ...]:
    """A generation engine's chat series (vLLM's and SGLang's share their shape)."""
    return (
        _s("latency", f"{prefix}e2e_request_latency_seconds_count", f"end-to-end latency ({who})", at_least="answered"),
        _s("latency", f"{prefix}time_to_first_token_seconds_count", f"first token ({who})", at_least="streamed"),
        _s(
            "latency",
            tpot[0],
            f"time per output token ({who})",
            aliases=tpot[1:],
            at_least="streamed_multi_token",
        ),
        _s("queue", running, f"requests running ({who})", moves=False),
        _s("queue", waiting, f"requests waiting ({who})", moves=False),
        _s("tokens", f"{prefix}prompt_tokens_total", f"prompt tokens ({who})", at_least="prompt_tokens"),
        _s("tokens", f"{prefix}generation_tokens_total", f"generated tokens ({who})", at_least="completion_tokens"),
    )


CHAT_CONVENTIONS: dict[ConventionName, tuple[SeriesSpec, ...]] = {
    "mmchaos": _MMCHAOS_CHAT,
    "vllm": (
        *_engine(
            "vllm:",
            "vLLM",
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            # renamed across vLLM releases: the first spelling present counts
            [
                "vllm:time_per_output_token_seconds_count",
                "vllm:request_time_per_output_token_seconds_count",
                "vllm:inter_token_latency_seconds_count",
            ],
        ),
        _s("traffic", "vllm:request_success_total", "finished requests (vLLM)", at_least="answered"),
    ),
    "sglang": _engine(
        "sglang:",
        "SGLang",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        ["sglang:inter_token_latency_seconds_count", "sglang:time_per_output_token_seconds_count"],
    ),
    "fastapi_instrumentator": _FASTAPI,
    "opentelemetry": _OTEL,
}
"""What each server family exports for chat traffic: latency (end to end, first token, per token),
the running and waiting queue, and token counters that must grow by the tokens the answers counted."""


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""A scrape: (sample name, sorted labels) -> value."""


def scrape(text: str) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return out


def total(samples: Samples, spec: SeriesSpec, name: str | None = None) -> float | None:
    """The sum over the series of ``name`` (default: the first of the spec's names present) whose labels match."""
    names = [name] if name is not None else [spec.name, *spec.aliases]
    for n in names:
        values = [v for (sample, labels), v in samples.items() if sample == n and spec.matches(dict(labels))]
        if values:
            return float(sum(values))
    return None


def present_name(samples: Samples, spec: SeriesSpec) -> str:
    """The first of the spec's names that has a matching series (its main name when none has)."""
    return next((n for n in (spec.name, *spec.aliases) if total(samples, spec, n) is not None), spec.name)


def exposed_conventions(
    samples: Samples,
    accepted: Sequence[ConventionName],
    table: Mapping[ConventionName, tuple[SeriesSpec, ...]] = CONVENTIONS,
) -> list[ConventionName]:
    """The accepted conventions whose request-latency series is exported."""
    return [c for c in accepted if total(samples, table[c][0]) is not None]
