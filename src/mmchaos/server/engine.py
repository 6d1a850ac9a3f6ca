"""The state behind one app: the target, its guards, admission, the worker pool and the metrics.

A request's work goes: admission (a slot among ``max_concurrency``, or a place among ``max_queue``
waiting; 429 beyond) -> one worker thread that decodes and checks every input with Preflight
(400/413/415/422), then takes the model lock and calls the target through the CircuitBreaker
(503 when open) -> DriftMonitor on the embeddings. The whole request has ``request_timeout``
seconds (504 past it); a timed-out model call keeps its slot until it really ends, so a hung model
fills the queue instead of piling up threads.

The model runs one call at a time: targets are not assumed thread-safe, and one request's inputs
are one batch, so answers never depend on what else is in flight (no cross-request batching).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, Counter

from mmchaos import __version__
from mmchaos.errors import CapabilityError, TargetCallError
from mmchaos.guard.breaker import CircuitBreaker
from mmchaos.guard.compat import COMPONENTS, CompatibilityError, check_compatible, check_consistency
from mmchaos.guard.drift import DriftMonitor
from mmchaos.guard.preflight import Preflight, PreflightError
from mmchaos.guard.slo import BurnRateSLO
from mmchaos.server.admission import Admission
from mmchaos.server.config import ServerConfig
from mmchaos.server.errors import CLIENT_CLOSED, BadModelOutput, HTTPError, RequestCancelled
from mmchaos.server.inputs import Item, Turn, bare_data_url_bytes
from mmchaos.server.metrics import GenerationMetrics, ServerMetrics
from mmchaos.server.pixels import declared_pixels
from mmchaos.server.tracing import RequestTracer, otlp_tracer_provider
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import GenerationParams, GenerationResult, Message
from mmchaos.targets.wrappers import unwrap

__all__ = ["GenerationStream", "GuardedServer", "load_mismatch", "served_model_name"]

log = logging.getLogger("mmchaos.server")

# Preprocessing seconds of the model call running in this thread (see GuardedServer._hook_preprocess).
_PREPROCESS: ContextVar[list[float] | None] = ContextVar("mmchaos_server_preprocess", default=None)
_SERVED_CAPABILITIES = frozenset(
    {Capability.EMBED_IMAGE, Capability.EMBED_TEXT, Capability.READ_TEXT, Capability.GENERATE}
)
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

T = TypeVar("T")
FloatArray = npt.NDArray[np.float32]


def served_model_name(target: Target, config: ServerConfig) -> str:
    """The model id clients use: the configured name, else the last part of the target URI."""
    if config.model_name:
        return config.model_name
    rest = target.uri.partition(":")[2] or target.uri or "model"
    return rest.rstrip("/").replace("\\", "/").split("/")[-1].split(":")[-1] or "model"


class _ClientGone(Exception):
    """The client disconnected while its request waited or ran."""


async def _unless_gone(
    work: Awaitable[T], gone: asyncio.Future[Any] | None, undo: Callable[[T], object] | None = None
) -> T:
    """``await work``, unless ``gone`` completes first: then ``work`` is cancelled and _ClientGone raised.

    ``undo(result)`` runs when ``work`` finishes with a result that nobody reads because this await
    was cancelled (the cancellation came after ``work`` completed, or ``work`` completed in spite of
    it): an admission that took a slot must give it back, or the slot is lost for good (the
    post-overload wedge)."""
    if gone is None:
        return await work
    task = asyncio.ensure_future(work)

    def drop() -> None:
        if undo is not None:
            # Now, or later: a cancelled ``work`` may still finish with a result (3.11's wait_for
            # returns its inner result when that is ready as the cancellation arrives).
            task.add_done_callback(lambda t: t.cancelled() or t.exception() is not None or undo(t.result()))
        task.cancel()

    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        drop()
        raise
    if task in done:
        return task.result()
    drop()
    await asyncio.gather(task, return_exceptions=True)
    raise _ClientGone()


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
        self.admission = Admission(cfg.max_concurrency, cfg.max_queue, cfg.max_inflight_pixels, cfg.max_queue_wait)
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
        self.model_lock = threading.Lock()
        self.pool: ThreadPoolExecutor | None = None
        self.started = time.time()
        self.draining = False
        self.running = False
        self.outstanding = 0  # jobs in the worker pool, answered or not
        self._ewma_seconds = 0.05
        self._ewma_measured = False  # the first job's time replaces the 0.05 s guess outright
        #: EWMA of one model call's seconds (the model lock's hold time): calls run one at a time,
        #: so the service cannot complete requests faster than one such call each.
        self._model_seconds = 0.0
        self._hooks: list[str] = []
        self.api_keys = frozenset(k.get_secret_value() for k in cfg.api_keys)

    # -- lifecycle -------------------------------------------------------------------------------

    def startup(self) -> None:
        self.load_mismatch = load_mismatch(self.target, self.config.expected_fingerprint)
        if self.load_mismatch is not None:
            self._load_mismatches.inc()
            log.error("not serving %s: %s", self.target.uri, self.load_mismatch)
        self.pool = ThreadPoolExecutor(self.config.max_concurrency, thread_name_prefix="mmchaos-serve")
        self._hook_preprocess()
        self.draining = False
        self.running = True
        self.metrics.ready.set(0.0 if self.load_mismatch else 1.0)

    def shutdown(self, wait: bool = True) -> None:
        """Stop the workers: with ``wait``, after the calls still running finish."""
        self.running = False
        self.metrics.ready.set(0.0)
        if self.pool is not None:
            self.pool.shutdown(wait=wait, cancel_futures=True)
            self.pool = None
        self._unhook_preprocess()
        if self._own_provider and self.tracer_provider is not None:
            self.tracer_provider.shutdown()  # flushes the spans still batched

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

    def declared_pixels(self, items: Sequence[Item], param: str = "input") -> int:
        """The pixels a request's images declare; 413 above ``max_request_pixels``. Nothing decoded."""
        if not self.guards:
            return 0
        contract = self.config.contract
        sizes = [declared_pixels(i.value, contract.formats) for i in items if i.modality == "image"]
        # An image over the per-image limit is refused by Preflight from its header, with its own
        # code, before anything is decoded: it holds no pixels.
        total = sum(p for p in sizes if p <= contract.max_pixels)
        limit = self.config.max_request_pixels
        if total > limit:
            raise HTTPError(
                413, "request_pixels_too_large",
                f"the request's images declare {total} pixels in all; the limit is {limit} per request",
                param=param,
            )  # fmt: skip
        return total

    def detokenize(self, ids: Sequence[int], param: str) -> str:
        """Token ids of the target's tokenizer as text (decoded, then embedded as that text), or 400."""
        tokenizer = getattr(unwrap(self.target), "tokenizer", None)
        decode = getattr(tokenizer, "decode", None)
        if not callable(decode):
            raise HTTPError(
                400, "token_ids_unsupported", f"{self.model_name} has no tokenizer to read token ids; send text",
                param=param,
            )  # fmt: skip
        try:
            size: int | None = len(tokenizer)  # type: ignore[arg-type]
        except TypeError:
            size = getattr(tokenizer, "vocab_size", None)
        for i in ids:
            if i < 0 or (size is not None and i >= size):
                top = "" if size is None else f" (0..{size - 1})"
                raise HTTPError(400, "invalid_token_id", f"token id {i} is not in the vocabulary{top}", param=param)
        return str(decode(list(ids), skip_special_tokens=True))

    def retry_after(self) -> int:
        waiting = len(self.admission.waiters) + 1
        return max(1, math.ceil(self._ewma_seconds * waiting / self.config.max_concurrency))

    async def run(
        self, job: Callable[[threading.Event], T], *, pixels: int = 0, gone: Awaitable[object] | None = None
    ) -> T:
        """Run ``job(cancel)`` in a worker thread under admission control and the request timeout.

        ``pixels`` is what the request's images declare (taken from the budget until the job really
        ends); ``gone`` completes when the client disconnects. A request whose client left (499) or
        timed out (504) sets ``cancel``: the job stops before its next decode or model call.
        """
        loop = asyncio.get_running_loop()
        watcher = asyncio.ensure_future(gone) if gone is not None else None
        cancel = threading.Event()
        work = partial(contextvars.copy_context().run, job, cancel)  # the request's span goes along
        try:
            pool = self.pool
            if pool is None:
                raise HTTPError(503, "not_ready", "the server is not running")
            if self.load_mismatch is not None:
                raise HTTPError(503, "model_load_mismatch", self.load_mismatch)
            if not self.guards:
                self.outstanding += 1
                try:
                    return await loop.run_in_executor(pool, work)  # the bare baseline: nothing watched
                finally:
                    self.outstanding -= 1
            return await self._run_admitted(pool, work, pixels, watcher)
        except _ClientGone as exc:
            cancel.set()
            raise HTTPError(CLIENT_CLOSED, "client_disconnected", "the client closed the connection") from exc
        except HTTPError as exc:
            if exc.status == 504:
                cancel.set()
            raise
        except asyncio.CancelledError:
            cancel.set()
            raise
        finally:
            if watcher is not None:
                watcher.cancel()

    async def _run_admitted(
        self, pool: ThreadPoolExecutor, work: Callable[[], T], pixels: int, watcher: asyncio.Future[Any] | None
    ) -> T:
        loop = asyncio.get_running_loop()
        timeout = self.config.request_timeout
        deadline = loop.time() + timeout
        await self._admit(pixels, watcher, deadline)
        fut = self._submit(pool, work, pixels, admitted=True)
        try:
            return await _unless_gone(asyncio.wait_for(asyncio.shield(fut), max(0.0, deadline - loop.time())), watcher)
        except TimeoutError as exc:
            raise HTTPError(504, "request_timeout", f"the request took longer than {timeout:g}s") from exc

    async def _admit(self, pixels: int, watcher: asyncio.Future[Any] | None, deadline: float) -> None:
        """A slot and ``pixels`` of the budget by ``deadline`` (loop time): else 504, 429 or _ClientGone."""
        self.metrics.queued.inc()
        try:
            # Until the admission measured the service saturated, the interval between completions
            # is estimated as the longer of a job's time over the slots (what it is when the slots
            # are the limit) and one model call (the model lock serialises the calls).
            fallback = max(self._model_seconds, self._ewma_seconds / self.config.max_concurrency)
            await _unless_gone(
                self.admission.enter(deadline, self.retry_after, pixels, fallback),
                watcher,
                undo=lambda _: self.admission.release(pixels),
            )
        except TimeoutError as exc:
            raise HTTPError(
                504, "request_timeout", f"no slot freed up within the {self.config.request_timeout:g}s request timeout"
            ) from exc
        finally:
            self.metrics.queued.dec()

    def _submit(
        self, pool: ThreadPoolExecutor, work: Callable[[], T], pixels: int, *, admitted: bool
    ) -> asyncio.Future[T]:
        """Start ``work`` in the pool; an admitted request's slot and pixels are held until it really ends."""
        loop = asyncio.get_running_loop()
        if admitted:
            self.metrics.inflight.inc()
        started = time.perf_counter()
        try:
            fut = loop.run_in_executor(pool, work)
        except BaseException:
            if admitted:
                self.admission.release(pixels)
                self.metrics.inflight.dec()
            raise
        self.outstanding += 1

        def done(f: asyncio.Future[T]) -> None:
            # The slot and the pixels are held until the work really ends, even after a 504.
            self.outstanding -= 1
            if admitted:
                self.admission.release(pixels)
                self.metrics.inflight.dec()
                took = time.perf_counter() - started
                self._ewma_seconds = 0.8 * self._ewma_seconds + 0.2 * took if self._ewma_measured else took
                self._ewma_measured = True
            if not f.cancelled():
                f.exception()  # retrieved: a late failure after a 504 is not an unhandled error

        fut.add_done_callback(done)
        return fut

    async def open_stream(
        self,
        job: Callable[[threading.Event, Callable[[str], None]], object],
        *,
        pixels: int = 0,
        gone: Awaitable[object] | None = None,
    ) -> GenerationStream:
        """Admit a streamed request and start ``job(cancel, emit)`` in a worker thread.

        Admission as :meth:`run` (429, 504 while waiting, 499 when the client leaves first). The job
        calls ``emit(delta)`` for each piece of text; the caller reads them from the returned stream
        and calls :meth:`GenerationStream.cancel` when its client goes away: the job stops at its
        next delta and the slot is given back when it really ends.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, object]] = asyncio.Queue()
        cancel = threading.Event()

        def emit(delta: str) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (time.perf_counter(), delta))

        work = partial(contextvars.copy_context().run, job, cancel, emit)
        watcher = asyncio.ensure_future(gone) if gone is not None else None
        try:
            pool = self.pool
            if pool is None:
                raise HTTPError(503, "not_ready", "the server is not running")
            if self.load_mismatch is not None:
                raise HTTPError(503, "model_load_mismatch", self.load_mismatch)
            if self.guards:
                await self._admit(pixels, watcher, loop.time() + self.config.request_timeout)
            fut = self._submit(pool, work, pixels, admitted=self.guards)
        except _ClientGone as exc:
            raise HTTPError(CLIENT_CLOSED, "client_disconnected", "the client closed the connection") from exc
        finally:
            if watcher is not None:
                watcher.cancel()
        fut.add_done_callback(lambda f: queue.put_nowait((time.perf_counter(), f)))
        return GenerationStream(queue, cancel)

    def _model(
        self,
        modality: str,
        fn: Callable[[Any], Any],
        batch: Sequence[Any],
        check: Callable[[Any, int], T],
        cancel: threading.Event,
    ) -> T:
        """One model call: the model lock, the breaker, the stage timings. Runs in a worker thread."""
        with self.model_lock:
            if cancel.is_set():  # nobody waits for this answer any more: leave the model to others
                raise RequestCancelled()
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
                self._model_seconds = 0.8 * self._model_seconds + 0.2 * elapsed if self._model_seconds else elapsed
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

    def _decode(self, items: Sequence[Item], cancel: threading.Event) -> list[Any]:
        """Every input checked and decoded, in order; the decode stage timed per modality."""
        seconds: dict[str, float] = {}
        values: list[Any] = []
        for item in items:
            if cancel.is_set():
                raise RequestCancelled()
            start = time.perf_counter()
            try:
                if item.modality == "text":
                    values.append(self.preflight.text(item.value) if self.guards else item.value)
                elif self.guards:
                    values.append(self.preflight.image_from_data_url(item.value).array)
                else:
                    values.append(self.target.decode_image(bare_data_url_bytes(item.value)))
            except PreflightError as err:
                raise HTTPError(err.http_status, err.code, err.message, param=item.param) from err
            except TargetCallError as err:  # the bare path's decoder
                raise HTTPError(400, err.code, err.message, param=item.param) from err
            seconds[item.modality] = seconds.get(item.modality, 0.0) + time.perf_counter() - start
        for modality, s in seconds.items():
            self.metrics.stages.labels(modality, "decode").observe(s)
        return values

    def embed_job(self, items: Sequence[Item], cancel: threading.Event) -> FloatArray:
        values = self._decode(items, cancel)
        by_modality: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            by_modality.setdefault(item.modality, []).append(i)
        out: FloatArray | None = None
        for modality, index in by_modality.items():
            batch = [values[i] for i in index]
            fn = self.target.embed_texts if modality == "text" else self.target.embed_images
            vectors = self._model(modality, fn, batch, self._check_embeddings, cancel)
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

    def read_job(self, items: Sequence[Item], cancel: threading.Event) -> str:
        values = self._decode(items, cancel)
        images = [v for v, item in zip(values, items, strict=True) if item.modality == "image"]
        texts = self._model("image", self.target.read_text, images, self._check_texts, cancel)
        return "\n".join(texts)

    # -- generation --------------------------------------------------------------------------------

    def _chat_messages(self, turns: Sequence[Turn], cancel: threading.Event) -> list[Message]:
        """The turns' inputs checked and decoded (Preflight), as the target's messages."""
        flat = [item for turn in turns for item in turn.items]
        values = iter(self._decode(flat, cancel))
        messages = []
        for turn in turns:
            parts = tuple(next(values) for _ in turn.items)
            role = _ROLES[turn.role]
            content: str | tuple[Any, ...] = (parts[0] if parts else "") if turn.plain else parts
            messages.append(Message(role, content))  # type: ignore[arg-type]
        return messages

    @staticmethod
    def _check_generation(out: Any, n: int) -> GenerationResult:
        if not isinstance(out, GenerationResult) or len(out.completions) < n:
            got = len(out.completions) if isinstance(out, GenerationResult) else type(out).__name__
            raise BadModelOutput("bad_model_output", f"the model returned {got} completions for n={n}")
        for c in out.completions[:n]:
            if not isinstance(c.text, str):
                raise BadModelOutput("bad_model_output", f"the model returned {type(c.text).__name__} as text")
            if c.logprobs is not None and any(math.isnan(x) or x == math.inf for x in c.logprobs):
                raise BadModelOutput("non_finite_output", "the model returned NaN or +inf token logprobs")
        return out

    def generate_job(
        self, turns: Sequence[Turn], params: GenerationParams, token_ids: bool, cancel: threading.Event
    ) -> tuple[GenerationResult, list[list[str]] | None]:
        """The answer, and with ``params.logprobs`` each completion's tokens as text (decoded under the
        model lock, as ``token_id:N`` with ``token_ids``)."""
        messages = self._chat_messages(turns, cancel)

        def call(m: list[Message]) -> tuple[GenerationResult, list[list[str]] | None]:
            result = self._check_generation(self.target.generate(m, (), params), params.n)
            if not params.logprobs:
                return result, None
            return result, [self.token_texts(c.token_ids or (), token_ids) for c in result.completions[: params.n]]

        answer: tuple[GenerationResult, list[list[str]] | None] = self._model("chat", call, messages, _as_is, cancel)
        return answer

    def token_texts(self, ids: Sequence[int], as_ids: bool) -> list[str]:
        """Each token's text by the target's tokenizer (``token_id:N`` with ``as_ids``, vLLM's form)."""
        decode = getattr(self.tokenizer(), "decode", None)
        if as_ids or not callable(decode):
            return [f"token_id:{i}" for i in ids]
        return [str(decode([i], skip_special_tokens=False)) for i in ids]

    def stream_job(
        self, turns: Sequence[Turn], params: GenerationParams, cancel: threading.Event, emit: Callable[[str], None]
    ) -> int | None:
        """Decode, then stream the target's deltas through ``emit`` under the model lock and breaker.

        A cancelled request (its client left) stops at its next delta and closes the target's
        stream, so the model and the slot go to the next request.
        """
        messages = self._chat_messages(turns, cancel)

        def run(msgs: list[Message]) -> int | None:
            deltas = self.target.generate_stream(msgs, (), params)
            sent: list[str] = []
            try:
                for delta in deltas:
                    if cancel.is_set():
                        raise RequestCancelled()
                    if not isinstance(delta, str):
                        raise BadModelOutput("bad_model_output", f"the model streamed {type(delta).__name__}, not text")
                    if delta:
                        emit(delta)
                        sent.append(delta)
            finally:
                close = getattr(deltas, "close", None)
                if callable(close):
                    close()
            return self.count_tokens("".join(sent))

        counted: int | None = self._model("chat", run, messages, _as_is, cancel)
        return counted

    def tokenizer(self) -> Any:
        """The target's tokenizer, if it has one (hf:, onnx:, builtin: targets)."""
        return getattr(unwrap(self.target), "tokenizer", None)

    def count_tokens(self, text: str) -> int | None:
        """``text``'s tokens by the target's tokenizer (None without one). Called under the model
        lock: fast tokenizers are not thread-safe."""
        encode = getattr(self.tokenizer(), "encode", None)
        if not text or not callable(encode):
            return 0 if not text else None
        try:
            return len(encode(text, add_special_tokens=False))
        except Exception:  # a tokenizer that cannot take this text: the caller estimates
            return None


def _as_is(out: T, n: int) -> T:
    """The output check of calls that checked their output themselves."""
    return out


class GenerationStream:
    """The events of one streamed job: ``(time, delta)`` as the model produces them, then the end."""

    def __init__(self, queue: asyncio.Queue[tuple[float, object]], cancel: threading.Event) -> None:
        self._queue = queue
        self._cancel = cancel
        self.finished = False
        self.result: object = None
        """What the job returned (the stream job: its completion tokens, where the tokenizer counted them)."""

    async def next(self, timeout: float) -> tuple[float, str] | None:
        """The next delta with its time (perf_counter), or None at the end; the job's error is raised
        here, and TimeoutError when nothing came within ``timeout`` seconds."""
        stamp, event = await asyncio.wait_for(self._queue.get(), timeout)
        if isinstance(event, str):
            return stamp, event
        self.finished = True
        assert isinstance(event, asyncio.Future)
        if event.cancelled():
            raise RequestCancelled()
        exc = event.exception()
        if exc is not None:
            raise exc
        self.result = event.result()
        return None

    def cancel(self) -> None:
        """Stop the job at its next delta (its client left or timed out)."""
        self._cancel.set()
