"""The reference server: an OpenAI-compatible FastAPI app over an in-process target, guards on the path.

A request goes: request id and body limits (ASGI edge) -> JSON schema -> admission (a slot among
``max_concurrency``, or a place among ``max_queue`` waiting; 429 beyond) -> one worker thread that
decodes and checks every input with Preflight (400/413/415/422), then takes the model lock and
calls the target through the CircuitBreaker (503 when open) -> DriftMonitor on the embeddings ->
the answer. The whole request has ``request_timeout`` seconds (504 past it); a timed-out model call
keeps its slot until it really ends, so a hung model fills the queue instead of piling up threads.

The model runs one call at a time: targets are not assumed thread-safe, and one request's inputs
are one batch, so answers never depend on what else is in flight (no cross-request batching).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import contextlib
import json
import logging
import math
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mmchaos import __version__
from mmchaos.errors import CapabilityError, MMChaosError, TargetCallError
from mmchaos.guard.breaker import CallNotPermitted, CircuitBreaker
from mmchaos.guard.drift import DriftMonitor
from mmchaos.guard.preflight import Preflight, PreflightError, estimate_tokens
from mmchaos.guard.slo import BurnRateSLO
from mmchaos.server.config import ServerConfig
from mmchaos.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    EmbeddingRequest,
    EmbeddingResponse,
    ErrorBody,
    ImageURLPart,
    ModelList,
    TextPart,
)
from mmchaos.targets.base import Capability, Target

__all__ = ["REQUEST_ID_HEADER", "GuardedServer", "create_app", "served_model_name"]

log = logging.getLogger("mmchaos.server")

REQUEST_ID_HEADER = "x-request-id"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")
_JSON_TYPES = ("application/json", "application/vnd.openai+json")
_STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_ENDPOINTS = frozenset(
    {"/v1/embeddings", "/v1/chat/completions", "/v1/models", "/healthz", "/readyz", "/metrics", "/openapi.json"}
)
# Preprocessing seconds of the model call running in this thread (see GuardedServer._hook_preprocess).
_PREPROCESS: ContextVar[list[float] | None] = ContextVar("mmchaos_server_preprocess", default=None)

T = TypeVar("T")
FloatArray = npt.NDArray[np.float32]


def served_model_name(target: Target, config: ServerConfig) -> str:
    """The model id clients use: the configured name, else the last part of the target URI."""
    if config.model_name:
        return config.model_name
    rest = target.uri.partition(":")[2] or target.uri or "model"
    return rest.rstrip("/").replace("\\", "/").split("/")[-1].split(":")[-1] or "model"


class HTTPError(Exception):
    """An answer other than 200, with an OpenAI-style body. Internal to the server."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.headers = headers or {}

    @property
    def type(self) -> str:
        if self.status == 401:
            return "authentication_error"
        if self.status == 429:
            return "rate_limit_error"
        if self.status == 503:
            return "service_unavailable_error"
        if self.status == 504:
            return "timeout_error"
        return "server_error" if self.status >= 500 else "invalid_request_error"

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


class BadModelOutput(Exception):
    """The target answered with something that cannot be served (NaN, wrong shape): a model failure."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class _Item:
    modality: str  # "text" or "image"
    value: str  # the text, or the image's data URL
    param: str


class _Admission:
    """``limit`` concurrent slots and a bounded FIFO of waiters, on one event loop."""

    def __init__(self, limit: int, queue: int) -> None:
        self.limit = limit
        self.queue = queue
        self.active = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def enter(self, deadline: float, retry_after: Callable[[], int]) -> None:
        loop = asyncio.get_running_loop()
        if self.active < self.limit and not self.waiters:
            self.active += 1
            return
        if len(self.waiters) >= self.queue:
            wait = retry_after()
            raise HTTPError(
                429,
                "queue_full",
                f"the server is at capacity ({self.active} running, {len(self.waiters)} waiting); retry in {wait}s",
                headers={"Retry-After": str(wait)},
            )
        fut: asyncio.Future[None] = loop.create_future()
        self.waiters.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), max(0.0, deadline - loop.time()))
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release()  # the slot was handed over just as we gave up: pass it on
            else:
                fut.cancel()
                with contextlib.suppress(ValueError):
                    self.waiters.remove(fut)
            raise

    def release(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot passes straight to the next waiter
                return
        self.active -= 1


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "mmchaos_server_requests", "Requests answered, by endpoint and status.", ("endpoint", "status"),
            registry=registry,
        )  # fmt: skip
        self.seconds = Histogram(
            "mmchaos_server_request_seconds", "Request latency, by endpoint.", ("endpoint",),
            buckets=_STAGE_BUCKETS, registry=registry,
        )  # fmt: skip
        self.stages = Histogram(
            "mmchaos_server_stage_seconds",
            "Time per request in each stage (decode, preprocess, model), by input modality.",
            ("modality", "stage"),
            buckets=_STAGE_BUCKETS,
            registry=registry,
        )
        self.errors = Counter(
            "mmchaos_server_errors", "Error answers, by stable code.", ("code", "status"), registry=registry
        )
        self.inflight = Gauge("mmchaos_server_inflight", "Requests holding a slot.", registry=registry)
        self.queued = Gauge("mmchaos_server_queued", "Requests waiting for a slot.", registry=registry)
        self.ready = Gauge("mmchaos_server_ready", "1 when /readyz answers 200.", registry=registry)


class GuardedServer:
    """The state behind one app: the target, its guards, the worker pool and the metrics."""

    def __init__(self, target: Target, config: ServerConfig | None = None) -> None:
        self.target = target
        self.config = cfg = config or ServerConfig.model_validate({})
        self.model_name = served_model_name(target, cfg)
        self.registry = CollectorRegistry(auto_describe=True)
        self.metrics = _Metrics(self.registry)
        self.guards = cfg.guards
        self.preflight = Preflight(cfg.contract, name="server", registry=self.registry)
        self.breaker = CircuitBreaker(
            "model",
            cfg.breaker_config(),
            ignore_exceptions=(PreflightError, TargetCallError, CapabilityError),
            registry=self.registry,
        )
        self.drift = DriftMonitor(cfg.drift, name="server", registry=self.registry, on_alarm=self._on_drift)
        self.slo = BurnRateSLO(name="server", objective=cfg.slo_objective, registry=self.registry)
        self.admission = _Admission(cfg.max_concurrency, cfg.max_queue)
        self.model_lock = threading.Lock()
        self.pool: ThreadPoolExecutor | None = None
        self.started = time.time()
        self.draining = False
        self.running = False
        self.outstanding = 0  # jobs in the worker pool, answered or not
        self._ewma_seconds = 0.05
        self._hooks: list[str] = []
        self._api_keys = frozenset(k.get_secret_value() for k in cfg.api_keys)

    # -- lifecycle -------------------------------------------------------------------------------

    def startup(self) -> None:
        self.pool = ThreadPoolExecutor(self.config.max_concurrency, thread_name_prefix="mmchaos-serve")
        self._hook_preprocess()
        self.draining = False
        self.running = True
        self.metrics.ready.set(1.0)

    def shutdown(self, wait: bool = True) -> None:
        """Stop the workers: with ``wait``, after the calls still running finish."""
        self.running = False
        self.metrics.ready.set(0.0)
        if self.pool is not None:
            self.pool.shutdown(wait=wait, cancel_futures=True)
            self.pool = None
        self._unhook_preprocess()

    async def drain(self, timeout: float) -> bool:
        """Wait (up to ``timeout``) for model calls that outlived their requests; True if none is left."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.outstanding and loop.time() < deadline:
            await asyncio.sleep(0.02)
        return self.outstanding == 0

    def _hook_preprocess(self) -> None:
        """Time the target's own preprocessing (``preprocess_images``, ``tokenize``) when it exposes it.

        The wrappers sit in the target instance's ``__dict__`` while the server runs (removed at
        shutdown) and only add up seconds for calls made on a server thread; elsewhere they pass through.
        """
        if not self.target.has(Capability.PREPROCESS):
            return
        for name in ("preprocess_images", "tokenize"):
            fn = getattr(self.target, name, None)
            if not callable(fn) or name in vars(self.target):
                continue

            def timed(*args: Any, __fn: Callable[..., Any] = fn, **kwargs: Any) -> Any:
                acc = _PREPROCESS.get()
                if acc is None:
                    return __fn(*args, **kwargs)
                start = time.perf_counter()
                try:
                    return __fn(*args, **kwargs)
                finally:
                    acc[0] += time.perf_counter() - start

            try:
                setattr(self.target, name, timed)
            except (AttributeError, TypeError):  # slotted or frozen targets: no preprocess stage
                continue
            self._hooks.append(name)

    def _unhook_preprocess(self) -> None:
        for name in self._hooks:
            with contextlib.suppress(AttributeError):
                delattr(self.target, name)
        self._hooks.clear()

    def readiness(self) -> tuple[bool, str]:
        if not self.running:
            return False, "not started"
        if self.draining:
            return False, "shutting down"
        if self.guards and self.breaker.state.value in ("open", "forced_open"):
            return False, f"circuit breaker {self.breaker.state.value}"
        return True, "ready"

    def _on_drift(self, alarm: Any) -> None:
        log.warning("drift alarm on %s embeddings: %s %.4g (threshold %.4g)", alarm.modality, alarm.test,
                    alarm.statistic, alarm.threshold)  # fmt: skip

    def model_card(self) -> dict[str, Any]:
        caps = sorted(c.value for c in self.target.capabilities if c in _SERVED_CAPABILITIES)
        return {
            "id": self.model_name,
            "object": "model",
            "created": int(self.started),
            "owned_by": "mmchaos",
            "mmchaos": {
                "version": __version__,
                "target": self.target.uri,
                "capabilities": caps,
                "fingerprint": self.target.fingerprint().to_dict(),
                "image_input": ["input", "messages"],
                "max_items": self.config.max_items,
                "guards": self.guards,
            },
        }

    # -- running work ----------------------------------------------------------------------------

    def retry_after(self) -> int:
        waiting = len(self.admission.waiters) + 1
        return max(1, math.ceil(self._ewma_seconds * waiting / self.config.max_concurrency))

    async def run(self, job: Callable[[], T]) -> T:
        """Run ``job`` in a worker thread under admission control and the request timeout."""
        loop = asyncio.get_running_loop()
        pool = self.pool
        if pool is None:
            raise HTTPError(503, "not_ready", "the server is not running")
        if not self.guards:
            self.outstanding += 1
            try:
                return await loop.run_in_executor(pool, job)
            finally:
                self.outstanding -= 1
        timeout = self.config.request_timeout
        deadline = loop.time() + timeout
        self.metrics.queued.inc()
        try:
            await self.admission.enter(deadline, self.retry_after)
        except TimeoutError as exc:
            raise HTTPError(
                504, "request_timeout", f"no slot freed up within the {timeout:g}s request timeout"
            ) from exc
        finally:
            self.metrics.queued.dec()
        self.metrics.inflight.inc()
        started = time.perf_counter()
        try:
            fut = loop.run_in_executor(pool, job)
        except BaseException:
            self.admission.release()
            self.metrics.inflight.dec()
            raise
        self.outstanding += 1

        def done(f: asyncio.Future[T]) -> None:
            # The slot is held until the work really ends, even after the client got its 504.
            self.outstanding -= 1
            self.admission.release()
            self.metrics.inflight.dec()
            self._ewma_seconds = 0.8 * self._ewma_seconds + 0.2 * (time.perf_counter() - started)
            if not f.cancelled():
                f.exception()  # retrieved: a late failure after a 504 is not an unhandled error

        fut.add_done_callback(done)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), max(0.0, deadline - loop.time()))
        except TimeoutError as exc:
            raise HTTPError(504, "request_timeout", f"the request took longer than {timeout:g}s") from exc

    def _model(
        self, modality: str, fn: Callable[[Any], Any], batch: Sequence[Any], check: Callable[[Any, int], T]
    ) -> T:
        """One model call: the model lock, the breaker, the stage timings. Runs in a worker thread."""
        with self.model_lock:
            permit = self.breaker.acquire() if self.guards else None
            acc = [0.0]
            token = _PREPROCESS.set(acc)
            start = time.perf_counter()
            try:
                out = check(fn(batch), len(batch))
            except Exception as exc:
                if permit is not None:
                    permit.failure(exc)
                raise
            except BaseException:
                if permit is not None:
                    permit.release()
                raise
            finally:
                elapsed = time.perf_counter() - start
                _PREPROCESS.reset(token)
            if permit is not None:
                permit.success()
        if self._hooks:
            self.metrics.stages.labels(modality, "preprocess").observe(acc[0])
        self.metrics.stages.labels(modality, "model").observe(max(0.0, elapsed - acc[0]))
        return out

    @staticmethod
    def _check_embeddings(out: Any, n: int) -> FloatArray:
        try:
            arr = np.asarray(out, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise BadModelOutput("bad_model_output", f"the model returned no embedding array: {exc}") from exc
        if arr.ndim != 2 or arr.shape[0] != n or arr.shape[1] == 0:
            raise BadModelOutput(
                "bad_model_output", f"the model returned shape {arr.shape} for {n} inputs (expected ({n}, D))"
            )
        if not np.isfinite(arr).all():
            raise BadModelOutput("non_finite_output", "the model returned NaN or infinite embedding values")
        return arr

    @staticmethod
    def _check_texts(out: Any, n: int) -> list[str]:
        if not isinstance(out, list | tuple) or len(out) != n or not all(isinstance(t, str) for t in out):
            raise BadModelOutput("bad_model_output", f"the model returned {type(out).__name__} for {n} images, "
                                 "not one string per image")  # fmt: skip
        return list(out)

    # -- decoding --------------------------------------------------------------------------------

    def _decode(self, items: Sequence[_Item]) -> list[Any]:
        """Every input checked and decoded, in order; the decode stage timed per modality."""
        seconds: dict[str, float] = {}
        values: list[Any] = []
        for item in items:
            start = time.perf_counter()
            try:
                if item.modality == "text":
                    values.append(self.preflight.text(item.value) if self.guards else item.value)
                elif self.guards:
                    values.append(self.preflight.image_from_data_url(item.value).array)
                else:
                    values.append(self.target.decode_image(_bare_data_url_bytes(item.value)))
            except PreflightError as err:
                raise HTTPError(err.http_status, err.code, err.message, param=item.param) from err
            except TargetCallError as err:  # the bare path's decoder
                raise HTTPError(400, err.code, err.message, param=item.param) from err
            seconds[item.modality] = seconds.get(item.modality, 0.0) + time.perf_counter() - start
        for modality, s in seconds.items():
            self.metrics.stages.labels(modality, "decode").observe(s)
        return values

    def embed_job(self, items: Sequence[_Item]) -> FloatArray:
        values = self._decode(items)
        by_modality: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            by_modality.setdefault(item.modality, []).append(i)
        out: FloatArray | None = None
        for modality, index in by_modality.items():
            batch = [values[i] for i in index]
            fn = self.target.embed_texts if modality == "text" else self.target.embed_images
            vectors = self._model(modality, fn, batch, self._check_embeddings)
            if out is None:
                out = np.empty((len(items), vectors.shape[1]), dtype=np.float32)
            elif vectors.shape[1] != out.shape[1]:
                raise BadModelOutput(
                    "bad_model_output",
                    f"text and image embeddings differ in size ({out.shape[1]} vs {vectors.shape[1]})",
                )
            out[index] = vectors
            if self.guards:
                self.drift.update(modality, vectors)
        assert out is not None  # items is never empty here
        return out

    def read_job(self, items: Sequence[_Item]) -> str:
        values = self._decode(items)
        images = [v for v, item in zip(values, items, strict=True) if item.modality == "image"]
        texts = self._model("image", self.target.read_text, images, self._check_texts)
        return "\n".join(texts)

    # -- errors ----------------------------------------------------------------------------------

    def to_http_error(self, exc: BaseException) -> HTTPError:
        if isinstance(exc, HTTPError):
            return exc
        if isinstance(exc, PreflightError):
            return HTTPError(exc.http_status, exc.code, exc.message)
        if isinstance(exc, CallNotPermitted):
            wait = max(1, math.ceil(exc.retry_after or 1.0))
            return HTTPError(503, exc.code, exc.message, headers={"Retry-After": str(wait)})
        if isinstance(exc, CapabilityError):
            return HTTPError(400, exc.code, exc.message)
        if isinstance(exc, TargetCallError):  # the model refused this input with a typed error
            return HTTPError(422, exc.code, exc.message)
        if isinstance(exc, BadModelOutput):
            return HTTPError(500, exc.code, str(exc))
        if isinstance(exc, MMChaosError):
            return HTTPError(500, exc.code, exc.message)
        log.warning("model call failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
        return HTTPError(500, "model_error", f"the model raised {type(exc).__name__}: {str(exc)[:300]}")


_SERVED_CAPABILITIES = frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT, Capability.READ_TEXT})


def _bare_data_url_bytes(url: str) -> bytes:
    """The guard-free path's data URL parsing: base64 only, no size checks."""
    head, sep, payload = url.partition(",")
    if not sep or not head.lower().startswith("data:") or not head.lower().endswith(";base64"):
        raise HTTPError(400, "bad_data_url", "not a base64 data: URL")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise HTTPError(400, "bad_data_url", f"invalid base64: {exc}") from exc


def _parts(content: str | list[Any] | None, where: str) -> Iterable[tuple[Any, str]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [(TextPart(type="text", text=content), f"{where}.content")]
    return [(part, f"{where}.content[{j}]") for j, part in enumerate(content)]


def _part_item(part: Any, param: str) -> _Item:
    if isinstance(part, ImageURLPart):
        return _Item("image", part.image_url.url, f"{param}.image_url.url")
    if isinstance(part, TextPart):
        return _Item("text", part.text, f"{param}.text")
    return _Item("text", str(part), param)


def embedding_items(body: EmbeddingRequest, max_items: int) -> list[_Item]:
    items: list[_Item] = []
    if body.input is not None:
        raw = [body.input] if isinstance(body.input, str) else body.input
        if not raw:
            raise HTTPError(400, "empty_input", "'input' is an empty list", param="input")
        if len(raw) > max_items:
            raise HTTPError(413, "too_many_inputs", f"{len(raw)} inputs; the limit is {max_items}", param="input")
        for i, x in enumerate(raw):
            items.append(_Item("text", x, f"input[{i}]") if isinstance(x, str) else _part_item(x, f"input[{i}]"))
        return items
    messages: list[ChatMessage] = body.messages or []
    parts = [p for i, m in enumerate(messages) for p in _parts(m.content, f"messages[{i}]")]
    if len(parts) != 1:
        raise HTTPError(
            400,
            "one_item_per_conversation",
            f"a 'messages' request embeds exactly one image or one text, got {len(parts)} content parts "
            "(send a batch as 'input' items)",
            param="messages",
        )
    return [_part_item(*parts[0])]


def _encode(vector: FloatArray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    out: list[float] = vector.tolist()
    return out


def _json(payload: Any, status: int = 200) -> Response:
    body = json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()
    return Response(body, status_code=status, media_type="application/json")


def _validation_error(exc: RequestValidationError) -> HTTPError:
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return HTTPError(400, "invalid_json", "the request body is not valid JSON")
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return HTTPError(400, "invalid_request", "; ".join(parts) + more, param=param)


class _Edge:
    """ASGI middleware: request ids, API keys, content type and body size, request metrics and SLO."""

    def __init__(self, app: ASGIApp, server: GuardedServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        srv = self.server
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        given = headers.get(REQUEST_ID_HEADER, "")
        rid = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        path: str = scope.get("path", "")
        endpoint = path if path in _ENDPOINTS else "other"
        start = time.perf_counter()
        status = [500]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = rid
            await send(message)

        try:
            refusal = self._refuse(scope, headers, path)
            body: bytes | None = None
            if refusal is None and scope.get("method") == "POST":
                body, refusal = await self._read_body(receive, headers)
                if body is None and refusal is None:
                    return  # the client went away
            if refusal is not None:
                await refusal.response()(scope, receive, send_with_id)
                return
            await self.app(scope, _replay(body, receive) if body is not None else receive, send_with_id)
        finally:
            code = status[0]
            srv.metrics.requests.labels(endpoint, str(code)).inc()
            srv.metrics.seconds.labels(endpoint).observe(time.perf_counter() - start)
            if srv.guards and path.startswith("/v1/") and endpoint != "other":
                srv.slo.record(code < 500, time.perf_counter() - start)

    def _refuse(self, scope: Scope, headers: dict[str, str], path: str) -> HTTPError | None:
        srv = self.server
        if srv._api_keys and path.startswith("/v1/"):
            auth = headers.get("authorization", "")
            scheme, _, key = auth.partition(" ")
            if scheme.lower() != "bearer" or key.strip() not in srv._api_keys:
                return HTTPError(401, "invalid_api_key", "a valid API key is required (Authorization: Bearer ...)")
        if scope.get("method") == "POST" and path.startswith("/v1/"):
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype not in _JSON_TYPES:
                return HTTPError(
                    415,
                    "unsupported_media_type",
                    f"the body must be application/json, got {ctype or 'no content type'}",
                )
        return None

    async def _read_body(self, receive: Receive, headers: dict[str, str]) -> tuple[bytes | None, HTTPError | None]:
        limit = self.server.config.max_body_bytes
        too_big = HTTPError(413, "payload_too_large", f"the request body is over {limit} bytes")
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return b"", too_big
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None, None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return b"", too_big
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": what}
    for status, what in (
        (400, "malformed input (bad JSON, corrupt image, invalid UTF-8, ...)"),
        (401, "missing or wrong API key"),
        (404, "unknown model"),
        (413, "too large (body, image pixels, element count, text, tokens, inputs)"),
        (415, "unsupported content type, image format or mode"),
        (422, "well-formed but unprocessable input (too small, animated, refused by the model)"),
        (429, "queue full (Retry-After)"),
        (500, "the model failed or returned NaN"),
        (503, "circuit breaker open (Retry-After)"),
        (504, "request timeout"),
    )
}


def create_app(target: Target, config: ServerConfig | None = None) -> FastAPI:
    """An OpenAI-compatible app serving ``target`` with the guards of ``config`` on the request path.

    The caller owns ``target`` (and closes it). The app's :class:`GuardedServer` is
    ``app.state.mmchaos``; its Prometheus registry is ``app.state.mmchaos.registry``.
    """
    server = GuardedServer(target, config)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        server.startup()
        try:
            yield
        finally:
            # uvicorn has answered every request by now; calls that outlived theirs (a 504) get a
            # bounded while to finish, so a hung model cannot hold the shutdown forever.
            drained = await server.drain(server.config.request_timeout + 5.0)
            await asyncio.get_running_loop().run_in_executor(None, partial(server.shutdown, wait=drained))

    app = FastAPI(
        title="mmchaos reference server",
        version=__version__,
        summary=f"{server.model_name} ({target.uri}) behind mmchaos guards",
        description=(
            "OpenAI-compatible embeddings and chat completions over an in-process target. Images are "
            '`image_url` content parts holding `data:` URLs. Errors are `{"error": {"message", "type", '
            '"param", "code"}}` with a stable `code`.'
        ),
        lifespan=lifespan,
    )
    app.state.mmchaos = server
    app.add_middleware(_Edge, server=server)

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError) -> Response:
        server.metrics.errors.labels(exc.code, str(exc.status)).inc()
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return await _http_error(request, _validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _starlette(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        err = HTTPError(exc.status_code, code, str(exc.detail), headers=dict(exc.headers or {}))
        return await _http_error(request, err)

    async def guarded(work: Callable[[], Awaitable[T]]) -> T:
        try:
            return await work()
        except HTTPError:
            raise
        except Exception as exc:
            raise server.to_http_error(exc) from exc

    def check_model(model: str | None) -> None:
        if model is not None and model != server.model_name:
            raise HTTPError(
                404, "model_not_found", f"the model {model!r} does not exist (this server has {server.model_name!r})",
                param="model",
            )  # fmt: skip

    def check_capability(items: Sequence[_Item], text_cap: Capability) -> None:
        for item in items:
            cap = text_cap if item.modality == "text" else Capability.EMBED_IMAGE
            if not target.has(cap):
                raise HTTPError(
                    400, "capability_missing", f"{server.model_name} cannot embed {item.modality} inputs",
                    param=item.param,
                )  # fmt: skip

    @app.post("/v1/embeddings", response_model=EmbeddingResponse, responses=_ERROR_RESPONSES, tags=["openai"])
    async def embeddings(body: EmbeddingRequest) -> Response:
        """Embed texts and images (``image_url`` parts with ``data:`` URLs); one vector per input."""
        check_model(body.model)
        items = embedding_items(body, server.config.max_items)
        check_capability(items, Capability.EMBED_TEXT)
        vectors = await guarded(lambda: server.run(partial(server.embed_job, items)))
        if body.dimensions is not None and body.dimensions != vectors.shape[1]:
            raise HTTPError(
                400, "dimensions_unsupported", f"this model's embeddings have {vectors.shape[1]} dimensions",
                param="dimensions",
            )  # fmt: skip
        tokens = sum(estimate_tokens(i.value) if i.modality == "text" else 1 for i in items)
        return _json(
            {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
                    for i, v in enumerate(vectors)
                ],
                "model": server.model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    @app.post(
        "/v1/chat/completions", response_model=ChatCompletionResponse, responses=_ERROR_RESPONSES, tags=["openai"]
    )
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        """Read the text in the ``image_url`` parts of the messages (OCR targets): the reply is the text."""
        check_model(body.model)
        if not target.has(Capability.READ_TEXT):
            raise HTTPError(
                400, "capability_missing",
                f"{server.model_name} neither reads text nor generates; use /v1/embeddings",
            )  # fmt: skip
        if body.stream:
            raise HTTPError(400, "stream_unsupported", "streaming is not supported", param="stream")
        if body.n != 1:
            raise HTTPError(400, "n_unsupported", "only n=1 is supported", param="n")
        items = [
            _part_item(p, where)
            for i, m in enumerate(body.messages)
            for p, where in _parts(m.content, f"messages[{i}]")
        ]
        if not any(i.modality == "image" for i in items):
            raise HTTPError(400, "empty_input", "the messages hold no image_url content part", param="messages")
        if len(items) > server.config.max_items:
            raise HTTPError(
                413, "too_many_inputs", f"{len(items)} content parts; the limit is {server.config.max_items}"
            )
        text = await guarded(lambda: server.run(partial(server.read_job, items)))
        rid = request.state.request_id
        return _json(
            {
                "id": f"chatcmpl-{rid}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": server.model_name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": len(items), "completion_tokens": estimate_tokens(text) if text else 0,
                          "total_tokens": len(items) + (estimate_tokens(text) if text else 0)},
            }
        )  # fmt: skip

    @app.get("/v1/models", response_model=ModelList, tags=["openai"])
    async def models() -> Response:
        """The one served model, with the target's URI, capabilities and fingerprint under ``mmchaos``."""
        card = await asyncio.get_running_loop().run_in_executor(None, server.model_card)
        return _json({"object": "list", "data": [card]})

    @app.get("/healthz", tags=["operations"])
    async def healthz() -> Response:
        """Liveness: 200 while the event loop answers."""
        return _json({"status": "ok"})

    @app.get("/readyz", tags=["operations"], responses={503: {"model": ErrorBody}})
    async def readyz() -> Response:
        """Readiness: 503 while starting, draining for shutdown, or with the breaker open."""
        ok, why = server.readiness()
        server.metrics.ready.set(1.0 if ok else 0.0)
        if ok:
            return _json({"status": "ready", "model": server.model_name})
        raise HTTPError(503, "not_ready", why)

    @app.get("/metrics", tags=["operations"])
    async def metrics() -> Response:
        """Prometheus text format: requests, per-modality stage latencies and every guard's metrics."""
        return Response(generate_latest(server.registry), media_type=CONTENT_TYPE_LATEST)

    return app
