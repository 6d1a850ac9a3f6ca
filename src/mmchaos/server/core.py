"""The state behind one app: the target, its guards, the pixel budget, the load gate and the metrics.

A request's work goes: the model name and the images' declared pixels, checked here before
anything is decoded (404, 413) -> admission and a worker thread (:mod:`.work`: 429, 504, 499) ->
Preflight on every input, then (batching on) the batcher, which runs the model inputs of requests
admitted together as one call (:mod:`.batcher`), or for chat generations of a model that decodes
step by step the continuous-batching engine (:mod:`.continuous`) -> the model lock and the CircuitBreaker
(:mod:`.model`: 400/413/415/422, 503 when open) -> DriftMonitor on the embeddings. The endpoints
(:mod:`.endpoints`) say what each request's work is; this class holds what they share.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from mmchaos.errors import CapabilityError, TargetCallError
from mmchaos.guard.breaker import CircuitBreaker
from mmchaos.guard.compat import COMPONENTS, CompatibilityError, check_compatible, check_consistency
from mmchaos.guard.drift import DriftMonitor
from mmchaos.guard.preflight import Preflight, PreflightError
from mmchaos.guard.slo import BurnRateSLO
from mmchaos.server.admission import Admission
from mmchaos.server.batcher import Batcher
from mmchaos.server.config import ServerConfig
from mmchaos.server.continuous import ContinuousEngine
from mmchaos.server.errors import RequestCancelled, ServerError
from mmchaos.server.inputs import Item
from mmchaos.server.metrics import GenerationMetrics, ServerMetrics
from mmchaos.server.model import ModelAccess
from mmchaos.server.pixels import declared_pixels
from mmchaos.server.tracing import RequestTracer, otlp_tracer_provider
from mmchaos.server.work import WorkPool
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.wrappers import unwrap

__all__ = ["GuardedServer", "batches_generation", "load_mismatch", "served_model_name"]


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


log = logging.getLogger("mmchaos.server")


def served_model_name(target: Target, config: ServerConfig) -> str:
    """The model id clients use: the configured name, else the last part of the target URI."""
    if config.model_name:
        return config.model_name
    rest = target.uri.partition(":")[2] or target.uri or "model"
    return rest.rstrip("/").replace("\\", "/").split("/")[-1].split(":")[-1] or "model"


def batches_generation(target: Target) -> bool:
    """Whether ``target``'s ``generate_batch`` is its own (one padded batch), not the base class's
    loop of single calls: batching requests through the loop would only make them wait in turn."""
    inner = type(unwrap(target))
    return getattr(inner, "generate_batch", Target.generate_batch) is not Target.generate_batch


def load_mismatch(target: Target, expected: Mapping[str, str] | None) -> str | None:
    """Why ``target``'s components do not belong together, or None: the start-up gate.

    Checks the configured validated fingerprint, the target's own recorded one (an export
    manifest), and a model directory's files against its ``config.json`` (processor size vs image
    size, token ids vs the embedding table, ...), all with :mod:`mmchaos.guard.compat`.
    """
    try:
        actual = target.fingerprint()
        if expected:
            check_compatible(expected, actual, components=[c for c in COMPONENTS if c in expected])
        recorded = target.recorded_fingerprint()
        if recorded is not None:
            check_compatible(recorded, actual)
        path = getattr(unwrap(target), "path", None)
        if isinstance(path, str | os.PathLike) and (Path(path) / "config.json").is_file():
            check_consistency(Path(path))
    except CompatibilityError as exc:
        return f"the model failed its load check ({exc.code}): {exc.message}"
    return None


class GuardedServer:
    """The state behind one app: the target, its guards, the worker pool and the metrics."""

    def __init__(self, target: Target, config: ServerConfig | None = None, *, tracer_provider: Any = None) -> None:
        self.target = target
        self.config = cfg = config or ServerConfig.model_validate({})
        self.model_name = served_model_name(target, cfg)
        self.registry = CollectorRegistry(auto_describe=True)
        self.metrics = ServerMetrics(self.registry)
        self.guards = cfg.guards
        self._own_provider = tracer_provider is None and cfg.otlp_endpoint is not None
        if cfg.otlp_endpoint is not None and tracer_provider is None:
            tracer_provider = otlp_tracer_provider(cfg.otlp_endpoint, f"mmchaos-serve:{self.model_name}")
        self.tracer_provider = tracer_provider
        self.tracer = RequestTracer(tracer_provider)
        # The guards' spans go to the same provider, nested under the request's span.
        guard_tracer = None if tracer_provider is None else tracer_provider.get_tracer("mmchaos.guard")
        self.preflight = Preflight(cfg.contract, name="server", registry=self.registry, tracer=guard_tracer)
        self.breaker = CircuitBreaker(
            "model",
            cfg.breaker_config(),
            ignore_exceptions=(PreflightError, TargetCallError, CapabilityError, RequestCancelled),
            registry=self.registry,
            tracer=guard_tracer,
        )
        self.drift = DriftMonitor(
            cfg.drift, name="server", registry=self.registry, on_alarm=self._on_drift, tracer=guard_tracer
        )
        self.slo = BurnRateSLO(name="server", objective=cfg.slo_objective, registry=self.registry)
        #: The batcher when batching is on (None: every request is its own model call).
        self.batcher: Batcher | None = None
        if cfg.batching:
            self.batcher = Batcher(cfg.max_batch_size, cfg.batch_window, observe=self._observe_batch)
        #: Whether chat generations are batched too (the target batches for real).
        self.batch_generation = (
            self.batcher is not None and target.has(Capability.GENERATE) and batches_generation(target)
        )
        self.model = ModelAccess(
            target, self.model_name, self.preflight, self.breaker, self.metrics, guards=self.guards
        )
        #: The continuous-batching engine of chat generations (None: whole calls, or no batching).
        self.continuous: ContinuousEngine | None = None
        steps = getattr(target, "step_decoder", None)
        wanted = self.batcher is not None and cfg.continuous_batching and target.has(Capability.GENERATE)
        decoder = steps() if wanted and callable(steps) else None
        if decoder is not None:
            self.continuous = ContinuousEngine(decoder, self.model, cfg.max_batch_size, observe=self._observe_batch)
        batched = self.batcher is not None and (
            self.batch_generation or target.has(Capability.EMBED_TEXT) or target.has(Capability.EMBED_IMAGE)
        )
        self.admission = Admission(
            cfg.max_concurrency, cfg.max_queue, cfg.max_inflight_pixels, cfg.max_queue_wait,
            batch=min(cfg.max_concurrency, cfg.max_batch_size) if batched else 1,
        )  # fmt: skip
        self.work = WorkPool(
            cfg, self.admission, self.metrics, guards=self.guards,
            call_seconds=lambda: self.model.call_seconds, refusal=self._refusal,
        )  # fmt: skip
        #: vLLM's generation metrics, for a target that generates (an embeddings server has none: a
        #: vllm:* latency series that never moves would read as a broken exporter).
        self.generation: GenerationMetrics | None = None
        if target.has(Capability.GENERATE):
            self.generation = GenerationMetrics(self.registry, self.model_name)
            self.generation.running.labels(self.model_name).set_function(lambda: self.admission.active)
            self.generation.waiting.labels(self.model_name).set_function(lambda: len(self.admission.waiters))
        #: Every name a request may give as ``model``: the served name, its aliases, the target URI.
        self.model_names = frozenset({self.model_name, *cfg.model_aliases, *([target.uri] if target.uri else [])})
        self.load_mismatch: str | None = None
        self._load_mismatches = Counter(
            "mmchaos_model_load_mismatch",
            "Start-ups whose model components do not belong together (the server stays unready).",
            registry=self.registry,
        )
        self.started = time.time()
        self.draining = False
        self.running = False
        #: SHA-256 digests of the API keys: compared in constant time (:meth:`key_matches`).
        self.api_keys = tuple(_digest(k.get_secret_value()) for k in cfg.api_keys)

    def key_matches(self, given: str) -> bool:
        """Whether ``given`` is one of the API keys: equal-length digests compared with
        :func:`hmac.compare_digest`, every key tried, so the time says nothing about a key."""
        digest = _digest(given)
        found = False
        for key in self.api_keys:
            found |= hmac.compare_digest(digest, key)
        return found

    @property
    def outstanding(self) -> int:
        """Jobs in the worker pool, answered or not."""
        return self.work.outstanding

    # -- lifecycle -------------------------------------------------------------------------------

    def startup(self) -> None:
        self.load_mismatch = load_mismatch(self.target, self.config.expected_fingerprint)
        if self.load_mismatch is not None:
            self._load_mismatches.inc()
            log.error("not serving %s: %s", self.target.uri, self.load_mismatch)
        self.work.start()
        if self.batcher is not None:
            self.batcher.start()
        if self.continuous is not None:
            self.continuous.start()
        self.model.hook_preprocess()
        self.draining = False
        self.running = True
        self.metrics.ready.set(0.0 if self.load_mismatch else 1.0)

    def shutdown(self, wait: bool = True) -> None:
        """Stop the workers: with ``wait``, after the calls still running finish."""
        self.running = False
        self.metrics.ready.set(0.0)
        self.work.stop(wait)  # first: workers waiting on a batch need the batcher until they end
        if self.batcher is not None:
            self.batcher.stop(wait)
        if self.continuous is not None:
            self.continuous.stop(wait)
        self.model.unhook_preprocess()
        if self._own_provider and self.tracer_provider is not None:
            self.tracer_provider.shutdown()  # flushes the spans still batched

    async def drain(self, timeout: float) -> bool:
        """Wait (up to ``timeout``) for model calls that outlived their requests; True if none is left."""
        return await self.work.drain(timeout)

    def _observe_batch(self, key: Any, size: int) -> None:
        kind = key[0] if isinstance(key, tuple) and key else str(key)
        self.metrics.batch_size.labels(str(kind)).observe(size)

    def _refusal(self) -> ServerError | None:
        """The load gate: every request is refused while the model failed its load check."""
        if self.load_mismatch is None:
            return None
        return ServerError(self.load_mismatch, code="model_load_mismatch")

    def readiness(self) -> tuple[bool, str, str]:
        """(ready, why, stable code when not)."""
        if self.load_mismatch is not None:
            return False, self.load_mismatch, "model_load_mismatch"
        if not self.running:
            return False, "not started", "not_ready"
        if self.draining:
            return False, "shutting down", "not_ready"
        if self.guards and self.breaker.state.value in ("open", "forced_open"):
            return False, f"circuit breaker {self.breaker.state.value}", "not_ready"
        return True, "ready", ""

    def _on_drift(self, alarm: Any) -> None:
        log.warning("drift alarm on %s embeddings: %s %.4g (threshold %.4g)", alarm.modality, alarm.test,
                    alarm.statistic, alarm.threshold)  # fmt: skip

    # -- what every endpoint checks before admission -----------------------------------------------

    def check_model(self, model: str | None) -> None:
        """As vLLM: any served name (the first is the one answers carry) or the target URI; else 404."""
        if model is not None and model not in self.model_names:
            raise ServerError(
                f"the model {model!r} does not exist (this server has {self.model_name!r})",
                code="model_not_found", param="model",
            )  # fmt: skip

    def declared_pixels(self, items: Sequence[Item], param: str = "input") -> int:
        """The pixels a request's images declare (the budget admission holds); 413 above
        ``max_request_pixels``. Nothing decoded."""
        if not self.guards:
            return 0
        contract = self.config.contract
        sizes = [declared_pixels(i.value, contract.formats) for i in items if i.modality == "image"]
        # An image over the per-image limit is refused by Preflight from its header, with its own
        # code, before anything is decoded: it holds no pixels.
        total = sum(p for p in sizes if p <= contract.max_pixels)
        limit = self.config.max_request_pixels
        if total > limit:
            raise ServerError(
                f"the request's images declare {total} pixels in all; the limit is {limit} per request",
                code="request_pixels_too_large", param=param,
            )  # fmt: skip
        return total
