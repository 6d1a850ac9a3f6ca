"""Continuous batching of chat generations: requests join and leave a running batch at every step.

The dynamic batcher (:mod:`.batcher`) runs whole ``generate_batch`` calls: a request that
arrives while one runs waits for its longest row to end, and a short answer keeps its row until
then. Here one engine thread holds the running rows of a model that decodes step by step
(:class:`~mmchaos.targets.hf_steps.StepDecoder`): a request joins by its own prefill between two
steps, every step gives each row its next token in one forward pass, and a row leaves the step
after its last token (end of sequence, a stop string, ``max_tokens``), after its client left or
its request timed out. vLLM's scheduler works so; this is its small, CPU-sized form.

When joiners are taken: at once when nothing runs; otherwise when they are at least half as many
as the running rows, or the oldest has waited :data:`JOIN_AFTER_STEPS` steps (a prefill is a
long forward pass that stalls every running row, so lone arrivals are gathered a little).

What each request gets is what it gets alone: greedy tokens are the model's argmax (identical to
``generate``'s, checked family by family in tests/integration/targets/test_hf_steps.py), a sampled
row draws from its own generator, stop strings and end of sequence end a row as ``generate``
ends it, and a stream's deltas concatenate to the same text. Seeded sampling and ``n > 1``
sampling are not taken (:meth:`ContinuousEngine.takes`): a seed promises the answer of the
request alone, drawn from the process RNG as ``generate`` draws it.

Every forward pass is one call through :meth:`ModelAccess.call <mmchaos.server.model.ModelAccess.call>`
(the model lock, the breaker, the stage timings). A prefill of several joiners that fails is run
again one joiner at a time, so one bad request fails alone; a step that fails fails the rows of
that step (the cache of all of them is in one tensor) and nothing waiting.
"""

from __future__ import annotations

import contextvars
import secrets
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mmchaos.server.errors import BadModelOutput, RequestCancelled, ServerError
from mmchaos.server.model import ModelAccess, as_is
from mmchaos.server.model_thread import ModelThread
from mmchaos.targets.generation import (
    Completion,
    FinishReason,
    GenerationParams,
    GenerationResult,
    Message,
    cut_at_stop,
)
from mmchaos.targets.hf_steps import StepBatch, StepDecoder

__all__ = ["JOIN_AFTER_STEPS", "ContinuousEngine", "DeltaSink", "sample_token", "top_p_filter"]

JOIN_AFTER_STEPS = 4
"""Steps a lone joiner waits for company at most, while other rows decode."""

#: ``on_delta(text)``: a streamed request's next piece of text, called from the engine thread.
DeltaSink = Callable[[str], None]

_NOT_RUNNING = "the server is not running"


def top_p_filter(torch: Any, scores: Any, top_p: float) -> Any:
    """``scores`` (1-D) with the tail below ``1 - top_p`` of probability at -inf, as transformers'
    ``TopPLogitsWarper`` drops it (the most likely token always stays)."""
    if top_p >= 1.0:
        return scores
    ordered, order = scores.sort(descending=False)
    tail = ordered.softmax(-1).cumsum(-1) <= 1.0 - top_p
    tail[-1:] = False
    return scores.masked_fill(tail.scatter(0, order, tail), -float("inf"))


def sample_token(torch: Any, scores: Any, params: GenerationParams, generator: Any) -> int:
    """The next token as ``generate`` picks it from raw ``scores``: argmax, or temperature, then
    top-p (top_k is 0: the params say what is sampled), then one draw from ``generator``."""
    if params.greedy:
        return int(scores.argmax())
    warped = top_p_filter(torch, scores / params.temperature, params.top_p)
    return int(torch.multinomial(warped.softmax(-1), 1, generator=generator))


@dataclass(eq=False)
class _Request:
    messages: list[Message]
    params: GenerationParams
    cancel: threading.Event
    on_delta: DeltaSink | None
    context: contextvars.Context
    since_step: int  # the engine's step count when it arrived
    done: threading.Event = field(default_factory=threading.Event)
    running: bool = False
    result: GenerationResult | None = None
    error: BaseException | None = None

    def resolve(self, outcome: GenerationResult | BaseException) -> None:
        if self.done.is_set():
            return
        if isinstance(outcome, BaseException):
            self.error = outcome
        else:
            self.result = outcome
        self.done.set()


@dataclass(eq=False)
class _Row:
    """One running request: its tokens so far and what it streamed."""

    request: _Request
    prompt_tokens: int
    image_tokens: int | None
    joined_with: int
    generator: Any  # a torch.Generator for a sampled row, None for greedy
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[dict[int, float]] = field(default_factory=list)
    sent: int = 0  # characters streamed
    finish: FinishReason | None = None
    text: str = ""


class ContinuousEngine(ModelThread[_Request]):
    """One thread decoding the running rows of ``decoder``'s model, up to ``max_rows`` at once."""

    def __init__(
        self,
        decoder: StepDecoder,
        model: ModelAccess,
        max_rows: int,
        *,
        name: str = "mmchaos-continuous",
        observe: Callable[[Hashable, int], None] | None = None,
    ) -> None:
        super().__init__(name)
        self.decoder = decoder
        self.model = model
        self.max_rows = max_rows
        self.observe = observe  # ("chat", joiners) of every prefill
        self.torch = decoder.torch
        self.eos = decoder.eos_ids
        self._rows: list[_Row] = []
        self._batch: StepBatch = decoder.new_batch()
        self._never = threading.Event()  # the engine's own calls: rows leave by their own cancel
        self.steps = 0
        #: Rows of each step, the most recent last (bounded): for the tests and the benchmark.
        self.sizes: list[int] = []
        #: Joiners of each prefill, the most recent last (bounded).
        self.joins: list[int] = []

    @staticmethod
    def takes(params: GenerationParams) -> bool:
        """Whether a request with ``params`` decodes here: greedy, or sampled without a seed and n=1."""
        return params.greedy or (params.seed is None and params.n == 1)

    @property
    def running(self) -> int:
        with self._cond:
            return len(self._rows)

    # -- the worker's side ---------------------------------------------------------------------------

    def submit(
        self,
        messages: list[Message],
        params: GenerationParams,
        cancel: threading.Event,
        on_delta: DeltaSink | None = None,
    ) -> GenerationResult:
        """Decode ``messages`` with the running rows and return the answer (or raise its error).

        ``on_delta`` receives the text as it is produced. A request cancelled while it waits leaves
        at once; one cancelled while it runs leaves at the next step, with RequestCancelled."""
        if not self.takes(params):
            raise ValueError("seeded or n>1 sampling runs alone: check takes(params) first")
        request = _Request(messages, params, cancel, on_delta, contextvars.copy_context(), self.steps)
        with self._cond:
            if self._stopping:
                raise ServerError(_NOT_RUNNING, code="not_ready")
            if cancel.is_set():
                raise RequestCancelled()
            self._pending.append(request)
            self._cond.notify_all()
        result: GenerationResult = self._answer_of(request)  # running, it leaves at the next step
        return result

    # -- the engine thread -----------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                joiners = self._joiners()
                if joiners is None:
                    return
                if joiners:
                    self._join(joiners)
                self._leave()
                if self._rows:
                    self._step()
                    self._leave()
        finally:  # stopping (or going down): nobody waits forever
            self._refuse_all()

    def _joiners(self) -> list[_Request] | None:
        """The requests that join before the next step (maybe none); None: the engine stops."""
        with self._cond:
            while not self._pending and not self._rows and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            for r in [r for r in self._pending if r.cancel.is_set()]:
                self._pending.remove(r)
                r.resolve(RequestCancelled())
            free = self.max_rows - len(self._rows)
            if not self._pending or free <= 0:
                return []
            rows = len(self._rows)
            waited = self.steps - self._pending[0].since_step
            if rows and 2 * len(self._pending) < rows and waited < JOIN_AFTER_STEPS:
                return []
            joiners, self._pending = self._pending[:free], self._pending[free:]
            for r in joiners:
                r.running = True
            return joiners

    def _refuse_all(self) -> None:
        with self._cond:
            waiting, self._pending = self._pending, []
            rows, self._rows = self._rows, []
        for r in waiting:
            r.resolve(ServerError(_NOT_RUNNING, code="not_ready"))
        for row in rows:
            row.request.resolve(ServerError(_NOT_RUNNING, code="not_ready"))
        self._batch = self.decoder.new_batch()

    def _call(self, fn: Callable[[], Any], *, tentative: bool = False) -> Any:
        return self.model.call("chat", lambda _: fn(), (), as_is, self._never, tentative=tentative)

    def _join(self, joiners: list[_Request]) -> None:
        """Prefill ``joiners`` into the batch; a failing prefill of several runs again one by one."""
        try:
            fitting, inputs = self._inputs(joiners)
            if not fitting:
                return
            logits = self._call(lambda: self.decoder.join(self._batch, inputs), tentative=len(fitting) > 1)
        except Exception as exc:
            if len(joiners) == 1:
                joiners[0].resolve(exc)
                return
            for r in joiners:
                self._join([r])
            return
        self.joins = [*self.joins[-255:], len(fitting)]
        if self.observe is not None:
            self.observe(("chat", "continuous"), len(fitting))
        lengths = inputs["attention_mask"].sum(-1).tolist()
        new = []
        for i, r in enumerate(fitting):
            generator = None
            if not r.params.greedy:
                generator = self.torch.Generator().manual_seed(secrets.randbits(63))
            image_tokens = self.decoder.image_tokens(inputs["input_ids"][i])
            new.append(_Row(r, int(lengths[i]), image_tokens, len(fitting), generator))
        with self._cond:
            self._rows.extend(new)
        self._advance(new, logits)

    def _inputs(self, joiners: list[_Request]) -> tuple[list[_Request], dict[str, Any]]:
        """The processor's batch of the joiners that fit the model's context (the others fail,
        ``context_exceeded``), under the model lock (fast tokenizers are not thread-safe)."""
        fitting = list(joiners)
        while True:
            with self.model.lock:
                inputs = self.decoder.inputs([r.messages for r in fitting])
            lengths = inputs["attention_mask"].sum(-1).tolist()
            unfit = []
            for r, n in zip(fitting, lengths, strict=True):
                try:
                    self.decoder.check_context(int(n), r.params)
                except Exception as exc:
                    r.resolve(exc)
                    unfit.append(r)
            if not unfit:
                return fitting, inputs
            fitting = [r for r in fitting if r not in unfit]
            if not fitting:
                return [], inputs

    def _step(self) -> None:
        rows = list(self._rows)
        self.steps += 1
        self.sizes = [*self.sizes[-1023:], len(rows)]
        try:
            logits = self._call(lambda: self.decoder.step(self._batch, [row.ids[-1] for row in rows]))
        except Exception as exc:
            with self._cond:
                self._rows = []
            self._batch = self.decoder.new_batch()
            for row in rows:
                row.request.resolve(exc)
            return
        self._advance(rows, logits)

    def _leave(self) -> None:
        """Rows that finished, failed or were cancelled leave the batch (its cache is cut to the rest)."""
        with self._cond:
            for row in self._rows:
                if row.request.cancel.is_set():
                    row.request.resolve(RequestCancelled())  # a no-op for a row already answered
            keep = [i for i, row in enumerate(self._rows) if not row.request.done.is_set()]
            if len(keep) == len(self._rows):
                return
            self._rows = [self._rows[i] for i in keep]
        self._batch.keep(keep)

    # -- sampling and ending ---------------------------------------------------------------------------

    def _advance(self, rows: Sequence[_Row], logits: Any) -> None:
        """Each row's next token from its logits row; finished rows are answered (they leave next)."""
        torch = self.torch
        # One pass over the batch for what every row needs (a step's work per row is small).
        broken = (torch.isnan(logits).any(-1) | torch.isposinf(logits).any(-1)).tolist()
        argmax = logits.argmax(-1).tolist()
        with self.model.lock:  # the tokenizer (stop strings, streamed text) is not thread-safe
            for i, row in enumerate(rows):
                try:
                    if broken[i]:
                        raise BadModelOutput("the model returned NaN or +inf logits", code="non_finite_output")
                    params = row.request.params
                    token = argmax[i] if params.greedy else sample_token(torch, logits[i], params, row.generator)
                    self._take(row, token, logits[i])
                except Exception as exc:
                    row.request.resolve(exc)
                    continue
                if row.finish is not None:
                    row.request.resolve(self._answer(row))

    def _take(self, row: _Row, token: int, scores: Any) -> None:
        params = row.request.params
        row.ids.append(int(token))
        if params.logprobs:
            log_probs = scores.log_softmax(-1)
            row.logprobs.append(float(log_probs[token]))
            if params.top_logprobs:
                values, ids = log_probs.topk(params.top_logprobs)
                row.tops.append(dict(zip(ids.tolist(), values.tolist(), strict=True)))
        streamed = row.request.on_delta is not None
        if token in self.eos:
            row.finish = "stop"
        if params.stop or streamed or row.finish or len(row.ids) >= params.max_new_tokens:
            row.text = self.decoder.tokenizer.decode(row.ids, skip_special_tokens=True)
        if row.finish is None and params.stop:
            row.text, hit = cut_at_stop(row.text, params.stop)
            if hit:
                row.finish = "stop"
        if row.finish is None and len(row.ids) >= params.max_new_tokens:
            row.finish = "length"
        if streamed:
            self._stream(row)

    def _stream(self, row: _Row) -> None:
        """Send the row's new text: all of it at the end; before, less what a stop string may still
        claim and a trailing U+FFFD (a character whose bytes are not all decoded yet)."""
        text = row.text
        if row.finish is None:
            held = max((len(s) for s in row.request.params.stop), default=1) - 1
            safe = len(text) - held
            while safe > row.sent and text[safe - 1] == "\ufffd":
                safe -= 1
        else:
            safe = len(text)
        if safe > row.sent:
            sink = row.request.on_delta
            assert sink is not None
            piece, row.sent = text[row.sent : safe], safe
            row.request.context.run(sink, piece)

    def _answer(self, row: _Row) -> GenerationResult:
        params = row.request.params
        finish = row.finish or "length"
        completion = Completion(
            text=row.text,
            finish_reason=finish,
            token_ids=tuple(row.ids),
            logprobs=tuple(row.logprobs) if params.logprobs else None,
            top_logprobs=tuple(row.tops) if params.logprobs and params.top_logprobs else None,
        )
        copies = params.n if params.greedy else 1  # greedy has one answer; n copies, as vLLM returns
        extra: dict[str, object] = {"image_tokens": row.image_tokens, "batch_size": row.joined_with}
        return GenerationResult((completion,) * copies, prompt_tokens=row.prompt_tokens, extra=extra)
