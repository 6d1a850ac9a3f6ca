"""The target as the request path uses it: inputs checked and decoded, one model call at a time
through the circuit breaker, the stage timings, and the target's tokenizer.

Everything here runs in a worker thread or the batcher's thread. The model runs one call at a
time: targets are not assumed thread-safe. With batching on, one call may carry the inputs of
several requests (:mod:`.batcher`); off, one request's inputs are one batch, so answers never
depend on what else is in flight.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

from mmchaos.errors import TargetCallError
from mmchaos.guard.breaker import CircuitBreaker
from mmchaos.guard.preflight import Preflight, PreflightError
from mmchaos.server.errors import RequestCancelled, ServerError
from mmchaos.server.inputs import Item, bare_data_url_bytes
from mmchaos.server.metrics import ServerMetrics
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.wrappers import unwrap

__all__ = ["ModelAccess", "as_is"]

T = TypeVar("T")

# Preprocessing seconds of the model call running in this thread (see ModelAccess.hook_preprocess).
_PREPROCESS: ContextVar[list[float] | None] = ContextVar("mmchaos_server_preprocess", default=None)


def as_is(out: T, n: int) -> T:
    """The output check of calls that checked their output themselves."""
    return out


class ModelAccess:
    """One target behind a model lock and a breaker (``guards`` off: no breaker, no Preflight)."""

    def __init__(
        self,
        target: Target,
        model_name: str,
        preflight: Preflight,
        breaker: CircuitBreaker,
        metrics: ServerMetrics,
        *,
        guards: bool,
    ) -> None:
        self.target = target
        self.model_name = model_name
        self.preflight = preflight
        self.breaker = breaker
        self.metrics = metrics
        self.guards = guards
        self.lock = threading.Lock()
        #: EWMA of one model call's seconds (the model lock's hold time): calls run one at a time,
        #: so the service cannot complete requests faster than one such call each.
        self.call_seconds = 0.0
        self._hooks: list[str] = []

    # -- preprocessing timings -------------------------------------------------------------------

    def hook_preprocess(self) -> None:
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

    def unhook_preprocess(self) -> None:
        for name in self._hooks:
            with contextlib.suppress(AttributeError):
                delattr(self.target, name)
        self._hooks.clear()

    # -- the two stages of a job -----------------------------------------------------------------

    def decode(self, items: Sequence[Item], cancel: threading.Event) -> list[Any]:
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
                raise ServerError(err.message, code=err.code, param=item.param) from err
            except TargetCallError as err:  # the bare path's decoder: the request's image is bad
                raise ServerError(err.message, code=err.code, param=item.param, origin="request") from err
            seconds[item.modality] = seconds.get(item.modality, 0.0) + time.perf_counter() - start
        for modality, s in seconds.items():
            self.metrics.stages.labels(modality, "decode").observe(s)
        return values

    def call(
        self,
        modality: str,
        fn: Callable[[Any], Any],
        batch: Sequence[Any],
        check: Callable[[Any, int], T],
        cancel: threading.Event,
        *,
        tentative: bool = False,
    ) -> T:
        """``check(fn(batch), len(batch))`` under the model lock and the breaker, its stages timed.

        ``tentative``: a failure is not counted by the breaker (a batch of several requests that
        is run again one request at a time: those calls count)."""
        with self.lock:
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
                    if tentative:
                        permit.release()
                    else:
                        permit.failure(exc)
                raise
            except BaseException:
                if permit is not None:
                    permit.release()
                raise
            finally:
                elapsed = time.perf_counter() - start
                _PREPROCESS.reset(token)
                self.call_seconds = 0.8 * self.call_seconds + 0.2 * elapsed if self.call_seconds else elapsed
            if permit is not None:
                permit.success()
        if self._hooks:
            self.metrics.stages.labels(modality, "preprocess").observe(acc[0])
        self.metrics.stages.labels(modality, "model").observe(max(0.0, elapsed - acc[0]))
        return out

    # -- the tokenizer ---------------------------------------------------------------------------

    def tokenizer(self) -> Any:
        """The target's tokenizer, if it has one (hf:, onnx:, builtin: targets)."""
        return getattr(unwrap(self.target), "tokenizer", None)

    def detokenize(self, ids: Sequence[int], param: str) -> str:
        """Token ids of the target's tokenizer as text (decoded, then embedded as that text)."""
        tokenizer = self.tokenizer()
        decode = getattr(tokenizer, "decode", None)
        if not callable(decode):
            raise ServerError(
                f"{self.model_name} has no tokenizer to read token ids; send text",
                code="token_ids_unsupported", param=param,
            )  # fmt: skip
        try:
            size: int | None = len(tokenizer)
        except TypeError:
            size = getattr(tokenizer, "vocab_size", None)
        for i in ids:
            if i < 0 or (size is not None and i >= size):
                top = "" if size is None else f" (0..{size - 1})"
                raise ServerError(f"token id {i} is not in the vocabulary{top}", code="invalid_token_id", param=param)
        return str(decode(list(ids), skip_special_tokens=True))

    def token_texts(self, ids: Sequence[int], as_ids: bool) -> list[str]:
        """Each token's text by the target's tokenizer (``token_id:N`` with ``as_ids``, vLLM's form)."""
        decode = getattr(self.tokenizer(), "decode", None)
        if as_ids or not callable(decode):
            return [f"token_id:{i}" for i in ids]
        return [str(decode([i], skip_special_tokens=False)) for i in ids]

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
