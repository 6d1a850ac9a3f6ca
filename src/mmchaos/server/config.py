"""Configuration of the reference server: limits, guards and their settings, validated at the boundary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from mmchaos.guard._config import build_config, load_yaml_config
from mmchaos.guard.breaker import BreakerConfig
from mmchaos.guard.drift import DriftConfig
from mmchaos.guard.preflight import InputContract

__all__ = ["DEFAULT_BREAKER", "DEFAULT_CONTRACT", "ServerConfig", "contract_from_yaml"]

#: The server's input contract unless one is given: Preflight's defaults, except that empty and
#: whitespace-only texts go to the model (a CLIP text tower embeds them; rejecting them would change
#: what the model answers, not protect it).
DEFAULT_CONTRACT = InputContract.model_validate({"allow_empty_text": True})

#: Opens when half of the last 20 model calls failed (or ran past the slow-call threshold, the
#: request timeout unless set), once 10 calls were seen; tries 3 calls again after 5 s.
DEFAULT_BREAKER = BreakerConfig.model_validate(
    {
        "failure_rate_threshold": 50.0,
        "slow_call_rate_threshold": 100.0,
        "sliding_window_size": 20,
        "minimum_number_of_calls": 10,
        "wait_duration_in_open_state": 5.0,
        "permitted_number_of_calls_in_half_open_state": 3,
    }
)


class ServerConfig(BaseModel):
    """How ``mmchaos serve`` guards a target. Durations are seconds, sizes bytes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The model id clients send and ``/v1/models`` lists; default: the last part of the target URI.
    model_name: str | None = Field(default=None, min_length=1, max_length=256)
    #: False serves the bare target (no Preflight, breaker, drift, SLO, admission limit or timeout):
    #: the baseline of the guard-overhead benchmark, never a production setting.
    guards: bool = True
    contract: InputContract = DEFAULT_CONTRACT
    #: Requests admitted at once: decoded in parallel (a worker thread each) and, with batching,
    #: run together as model batches of up to ``max_batch_size``; the model itself runs one call at
    #: a time (targets are not assumed thread-safe). ``mmchaos serve`` admits 16 (4 without batching).
    max_concurrency: int = Field(default=4, ge=1, le=1024)
    #: Dynamic batching across requests (:mod:`mmchaos.server.batcher`): the embeddings of requests
    #: admitted together are one model call per modality, and generations with the same sampling
    #: parameters one batched ``generate`` (for a target that batches: one whose ``generate_batch``
    #: pads and runs one forward pass per step). Seeded-sampled requests run alone, and so do streams
    #: outside continuous batching.
    #: False: every request is its own model call (a deployment that must not batch).
    batching: bool = True
    #: With batching, continuous batching of chat generations (:mod:`mmchaos.server.continuous`)
    #: for a target that decodes step by step (``Target.step_decoder``): a request joins the
    #: running batch between two decoding steps and leaves it after its last token, instead of
    #: waiting for a whole ``generate_batch`` to end. False: dynamic batching of whole calls.
    continuous_batching: bool = True
    #: Most requests in one model batch.
    max_batch_size: int = Field(default=16, ge=1, le=1024)
    #: Seconds a batch waits for more requests once the model is free: for requests already
    #: admitted and decoding, and (at most a tenth of the measured batch call, and only when the
    #: last batch had more than one request) for new ones.
    batch_window: float = Field(default=0.005, ge=0.0, le=1.0)
    #: Requests allowed to wait for a slot; one more is answered 429 with Retry-After.
    max_queue: int = Field(default=64, ge=0, le=100_000)
    #: Load shedding: a request that would wait longer than this many seconds for a slot (its
    #: expected wait: the requests ahead of it times the measured interval between completions) is
    #: refused at once with 429 ``overloaded`` and Retry-After, so the admitted ones stay within a
    #: latency objective instead of all queueing past it. None (the library default): queue up to
    #: ``max_queue``; ``mmchaos serve`` sets 0.5 s (half the checks' default 1 s p99 SLO). Off here
    #: because the run's shared server in the serving checks shares one process with the load
    #: driver and the fault proxy: past the knee their HTTP work, not this queue, is the bottleneck,
    #: and a closed loop that re-sends each 429 at once turns shed requests into more of that work
    #: (docs/server.md has the numbers).
    max_queue_wait: float | None = Field(default=None, gt=0.0, le=3600.0)
    #: Whole-request budget (queueing, decoding, model); past it the answer is 504.
    request_timeout: float = Field(default=30.0, gt=0.0, le=3600.0)
    #: None: :data:`DEFAULT_BREAKER` with the slow-call threshold at the request timeout (a call
    #: the client has already given up on is slow).
    breaker: BreakerConfig | None = None
    drift: DriftConfig = Field(default_factory=lambda: DriftConfig.model_validate({}))
    #: Availability objective of the in-process burn-rate SLO (5xx answers are the bad events).
    slo_objective: float = Field(default=0.999, gt=0.0, lt=1.0)
    #: Largest request body; a bigger one is refused (413) before it is parsed.
    max_body_bytes: int = Field(default=32 * 2**20, ge=1024)
    #: Most inputs in one embeddings request (413 above).
    max_items: int = Field(default=64, ge=1, le=4096)
    #: Tokens a chat completion of a generative target may generate when the request names no
    #: ``max_tokens``; a request asking for more than ``max_tokens_limit`` is 400 ``max_tokens_too_large``.
    default_max_tokens: int = Field(default=256, ge=1, le=1_000_000)
    max_tokens_limit: int = Field(default=4096, ge=1, le=1_000_000)
    #: When set, requests need ``Authorization: Bearer <key>`` with one of these keys (401 otherwise).
    api_keys: tuple[SecretStr, ...] = ()
    #: Other names clients may send as ``model`` (vLLM's extra ``--served-model-name`` values); the
    #: target URI is always accepted too.
    model_aliases: tuple[str, ...] = ()
    #: Decoded pixels one request may declare (the sum over its images, read from the image headers
    #: before anything is decoded); more is refused with 413 ``request_pixels_too_large``.
    max_request_pixels: int = Field(default=50_000_000, ge=1)
    #: Decoded pixels all admitted requests may hold at once; a request that does not fit waits in
    #: the queue (undecoded) like one waiting for a slot. At least ``max_request_pixels``. A decoded
    #: pixel costs about 8 bytes at the peak (the RGB array, Pillow's 4-byte decode buffer, the
    #: processor's copy): 50 M keeps tiny-clip under twice its idle memory through a burst of
    #: requests at ``max_request_pixels`` (benchmarks/serve_pixel_burst.py; 100 M reached 2.7x).
    max_inflight_pixels: int = Field(default=50_000_000, ge=1)
    #: Seconds a connection may take to send a request's headers (slowloris); then it is closed.
    header_timeout: float = Field(default=10.0, gt=0.0, le=3600.0)
    #: Seconds a client may take to send a request's body once its headers arrived; then 408.
    body_timeout: float = Field(default=30.0, gt=0.0, le=3600.0)
    #: Seconds an idle keep-alive connection stays open (uvicorn's ``timeout_keep_alive``). Longer
    #: than the idle expiry of common client pools (httpx and the openai SDK 5 s, aiohttp 15 s): a
    #: server that closes a connection as the client takes it from its pool makes the client's next
    #: request fail (``httpx.ReadError``, "Server disconnected") with nothing logged on the server
    #: (benchmarks/keepalive_race.py).
    keep_alive_timeout: float = Field(default=20.0, gt=0.0, le=3600.0)
    #: Largest request line plus headers in bytes (uvicorn's ``h11_max_incomplete_event_size``).
    max_header_bytes: int = Field(default=16 * 1024, ge=1024, le=2**20)
    #: The validated model's component hashes (``weights``, ``tokenizer``, ``processor``,
    #: ``config``; from a fingerprint or a report). A served model that differs never becomes ready.
    expected_fingerprint: dict[str, str] | None = None
    #: OTLP/HTTP traces endpoint (e.g. ``http://127.0.0.1:4318/v1/traces``): spans of every request
    #: are exported there; needs ``opentelemetry-sdk`` and ``opentelemetry-exporter-otlp-proto-http``.
    otlp_endpoint: str | None = Field(default=None, min_length=1, max_length=2048)

    @model_validator(mode="after")
    def _budgets(self) -> ServerConfig:
        if self.max_inflight_pixels < self.max_request_pixels:
            raise ValueError(
                f"max_inflight_pixels ({self.max_inflight_pixels}) is below max_request_pixels "
                f"({self.max_request_pixels}): a request at the limit could never be admitted"
            )
        return self

    def breaker_config(self) -> BreakerConfig:
        if self.breaker is not None:
            return self.breaker
        return DEFAULT_BREAKER.model_copy(update={"slow_call_duration_threshold": self.request_timeout})

    @classmethod
    def build(cls, base: ServerConfig | None = None, **settings: Any) -> ServerConfig:
        """``base`` (or the defaults) with ``settings`` laid over it; bad values raise ConfigError."""
        return build_config(cls, base, settings, "server config")

    @classmethod
    def from_yaml(cls, source: str | Path) -> ServerConfig:
        return load_yaml_config(cls, source, "server config")


def contract_from_yaml(source: str | Path) -> InputContract:
    """An input contract file for ``mmchaos serve --contract`` (empty texts allowed unless it says)."""
    contract = InputContract.from_yaml(source)
    if "allow_empty_text" in contract.model_fields_set:
        return contract
    return InputContract.model_validate({**contract.model_dump(), "allow_empty_text": True})
