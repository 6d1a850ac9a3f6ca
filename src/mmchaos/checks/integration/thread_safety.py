"""Step 5: N threads x M calls through preprocessing and inference equal the sequential results.

A fixed set of batches (sizes 1..max_batch, different neighbours and lengths) is run once
sequentially, then again from many threads at once, each thread taking a different rotation of the
batches so that different inputs meet. Every concurrent result must match its sequential one
under batch_invariance's tolerance model: embeddings by ``1 - cosine`` per item (1e-4 by default)
and the same nearest item, transcriptions by character error rate. Bit-equality is too strict
for a server whose dynamic batching changes the last float bits (1e-7) from call to call, while
a race (another call's picture in a shared buffer) moves an embedding far past the tolerance. The
absolute difference is reported too. Every exception is reported with its trace (e.g. the
tokenizers library's "Already borrowed"). The encoded path (``embed_encoded_images``) runs too,
so decoders and image processors with shared state are covered.

Generative targets: batches of (image, question) requests through ``generate_batch``, greedy
(``generate``) and sampled with a fixed seed (``generate_sampled``); a concurrent completion must
be the sequential one exactly (text, token ids, finish reason: one changed character fails).
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field

from mmchaos.checks.base import ANY_MODALITY, Check, CheckContext, Gate, Params
from mmchaos.checks.engine.generation_inputs import probe_requests, result_signature
from mmchaos.checks.evidence import png_bytes
from mmchaos.findings import Artifact, Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import GenerationParams, Message
from mmchaos.targets.wrappers import unwrap

__all__ = ["ThreadSafety", "deviation", "max_difference"]


def max_difference(a: Any, b: Any) -> float:
    """0.0 when equal; the max abs difference of arrays; 1.0 per differing string; inf on shape change."""
    if isinstance(a, list) or isinstance(b, list):
        if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b):
            return float("inf")
        return float(sum(x != y for x, y in zip(a, b, strict=True)))
    x, y = np.asarray(a), np.asarray(b)
    if x.shape != y.shape:
        return float("inf")
    if x.size == 0:
        return 0.0
    if np.array_equal(x, y, equal_nan=True):
        return 0.0
    diff = np.abs(x.astype(np.float64) - y.astype(np.float64))
    return float(np.nanmax(np.where(np.isnan(diff), np.inf, diff)))


def deviation(a: Any, b: Any) -> tuple[float, bool]:
    """How far output ``b`` is from ``a``, in batch_invariance's units, and whether top-1 agrees.

    Embeddings: the largest ``1 - cosine`` over items (inf for a non-finite item), and whether
    every item of ``b`` is still nearest its own item of ``a``. Transcriptions: the largest
    character error rate, and exact equality. A changed shape or length is (inf, False).
    """
    if isinstance(a, list) or isinstance(b, list):
        if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b):
            return float("inf"), False
        from mmchaos.tasks.ocr_metrics import cer

        rates = [cer(y, x) if x or y else 0.0 for x, y in zip(a, b, strict=True)]
        return max(rates, default=0.0), a == b
    x, y = np.asarray(a), np.asarray(b)
    if x.shape != y.shape:
        return float("inf"), False
    if x.size == 0 or np.array_equal(x, y):
        return 0.0, True
    rows = len(x) if x.ndim >= 1 else 1
    u, v = _unit_rows(x, rows), _unit_rows(y, rows)
    finite = np.isfinite(u).all(axis=1) & np.isfinite(v).all(axis=1)
    devs = np.where(finite, np.maximum(1.0 - (u * v).sum(axis=1), 0.0), np.inf)
    with np.errstate(invalid="ignore"):
        nearest = np.nan_to_num(v @ u.T, nan=-np.inf).argmax(axis=1)
    agree = bool(((nearest == np.arange(rows)) & finite).all())
    return float(devs.max()), agree


def _unit_rows(x: Any, rows: int) -> Any:
    """Rows scaled to unit length in float64 (float32 rounding alone is ~1e-7 of 1 - cosine)."""
    wide = np.asarray(x, np.float64).reshape(rows, -1)
    with np.errstate(invalid="ignore", over="ignore"):
        return wide / np.maximum(np.linalg.norm(wide, axis=1, keepdims=True), 1e-300)


def _as_result(out: Any) -> Any:
    if isinstance(out, list | tuple) and all(isinstance(s, str) for s in out):
        return list(out)
    return np.array(out, copy=True)


@dataclass
class _Call:
    method: str
    items: list[Any]
    labels: list[str]


@dataclass
class _Outcome:
    thread: int
    order: int
    call: int
    result: Any = None
    error: str = ""
    trace: str = ""


class ThreadSafetyParams(Params):
    threads: int = Field(default=8, ge=2, le=64)
    calls_per_thread: int = Field(default=6, ge=1)
    samples: int = Field(default=16, ge=2)
    max_batch: int = Field(default=4, ge=1)
    encoded: bool = Field(default=True, description="also call embed_encoded_images with PNG bytes")
    rounds: int = Field(default=1, ge=1, le=10)
    timeout_s: float = Field(default=300.0, gt=0)
    max_new_tokens: int = Field(default=8, ge=1, description="generative targets: tokens per completion")
    sampled: bool = Field(default=True, description="generative targets: also seeded sampling (temperature 1)")


class ThreadSafetyGate(Gate):
    max_cosine_deviation: float = Field(
        default=1e-4, ge=0.0, description="max of 1 - cos(sequential, concurrent), as batch_invariance; CER for text"
    )
    min_top1_agreement: float = Field(default=1.0, ge=0.0, le=1.0)
    max_abs_diff: float | None = Field(
        default=None,
        ge=0.0,
        description="also bound the absolute difference (0 with max_cosine_deviation 0 = bit-identical)",
    )
    max_exceptions: int = Field(default=0, ge=0)


class ThreadSafety(Check[ThreadSafetyParams, ThreadSafetyGate]):
    """N threads x M calls vs sequential, within batch_invariance's tolerance; exceptions with their trace."""

    name = "thread_safety"
    step = Step.INTEGRATION
    requires = (*ANY_MODALITY, frozenset({Capability.GENERATE}))

    def _calls(self, ctx: CheckContext) -> dict[str, list[_Call]]:
        p = self.params
        data = ctx.dataset.sample(p.samples, ctx.seed)
        target = ctx.target
        images = [s.load_image() for s in data] if data.has_images else []
        ids = [s.id for s in data]
        texts = [t for t in (s.caption or s.text or "" for s in data) if t]
        inputs: dict[str, tuple[list[Any], list[str]]] = {}
        if images and target.has(Capability.EMBED_IMAGE):
            inputs["embed_images"] = (images, ids)
            if p.encoded:
                inputs["embed_encoded_images"] = ([png_bytes(i) for i in images], ids)
        if texts and target.has(Capability.EMBED_TEXT):
            inputs["embed_texts"] = (texts, texts)
        if images and target.has(Capability.READ_TEXT):
            inputs["read_text"] = (images, ids)
        if target.has(Capability.GENERATE):
            requests, names = probe_requests(ctx, min(p.samples, 8))
            inputs["generate"] = (requests, names)
            if p.sampled:
                inputs["generate_sampled"] = (requests, names)
        rng = ctx.rng("batches")
        out: dict[str, list[_Call]] = {}
        for method, (items, labels) in inputs.items():
            calls = []
            for k in range(max(p.threads, 8)):
                size = 1 + k % min(p.max_batch, len(items))
                picks = [int(j) for j in rng.choice(len(items), size=size, replace=False)]
                calls.append(_Call(method, [items[j] for j in picks], [labels[j] for j in picks]))
            out[method] = calls
        return out

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        by_method = self._calls(ctx)
        if not by_method:
            yield self.finding(ctx, Verdict.SKIPPED, "no inputs of a modality the target handles")
            return
        bar = ctx.progress.task(f"{ctx.check_id}: methods", total=len(by_method))
        try:
            for method, calls in by_method.items():
                # The encoded path must be the target's own (an override of decode_image), not a wrapper's.
                owner = unwrap(ctx.target) if "encoded" in method else ctx.target
                fn: Callable[[Sequence[Any]], Any] = (
                    _generate_fn(ctx.target, method, p) if method.startswith("generate") else getattr(owner, method)
                )
                yield self._method(ctx, method, fn, calls, p)
                bar.advance()
        finally:
            bar.close()

    def _method(
        self,
        ctx: CheckContext,
        method: str,
        fn: Callable[[Sequence[Any]], Any],
        calls: list[_Call],
        p: ThreadSafetyParams,
    ) -> Finding:
        g = self.gate
        sequential = [_as_result(fn(c.items)) for c in calls]
        again = [_as_result(fn(c.items)) for c in calls]
        noise = max(deviation(a, b)[0] for a, b in zip(sequential, again, strict=True))
        noise_abs = max(max_difference(a, b) for a, b in zip(sequential, again, strict=True))
        unit = "character error rate" if method == "read_text" or method.startswith("generate") else "1 - cosine"
        evidence: dict[str, Any] = {"method": method, "threads": p.threads, "calls_per_thread": p.calls_per_thread,
                                    "rounds": p.rounds, "seed": ctx.seed, "deviation_unit": unit}  # fmt: skip
        if noise > g.max_cosine_deviation or (g.max_abs_diff is not None and noise_abs > g.max_abs_diff):
            return self.finding(
                ctx,
                Verdict.ERROR,
                f"{method}: inconclusive, two sequential runs already differ (max {unit} {noise:.3g}, "
                f"max abs diff {noise_abs:.3g})",
                severity=Severity.MEDIUM,
                metrics={"sequential_noise": noise, "sequential_noise_abs": noise_abs},
                message="the target is not deterministic even without threads; see the determinism check",
                evidence=evidence,
            )
        outcomes: list[_Outcome] = []
        for _ in range(p.rounds):
            outcomes += self._concurrent(fn, calls, p)
        errors = [o for o in outcomes if o.error]
        compared = [(deviation(sequential[o.call], o.result), max_difference(o.result, sequential[o.call]), o)
                    for o in outcomes if not o.error]  # fmt: skip
        wrong = [
            (dev, o)
            for (dev, agree), abs_diff, o in compared
            if dev > g.max_cosine_deviation
            or (not agree and g.min_top1_agreement >= 1.0)
            or (g.max_abs_diff is not None and abs_diff > g.max_abs_diff)
        ]
        agreement = sum(agree for (_, agree), _, _ in compared) / max(1, len(compared))
        metrics = {
            "calls": float(len(outcomes)),
            "exceptions": float(len(errors)),
            "mismatches": float(len(wrong)),
            "max_deviation": max((dev for (dev, _), _, _ in compared), default=0.0),
            "max_abs_diff": max((d for _, d, _ in compared), default=0.0),
            "top1_agreement": agreement,
            "sequential_noise": noise,
            "sequential_noise_abs": noise_abs,
        }
        gate = (
            f"every concurrent result within {g.max_cosine_deviation:g} ({unit}) of the sequential one"
            + (f" and {g.max_abs_diff:g} absolute" if g.max_abs_diff is not None else "")
            + f"; top-1 agreement >= {g.min_top1_agreement:g}; at most {g.max_exceptions} exceptions"
        )
        if agreement < g.min_top1_agreement and not wrong:
            worst_disagreement = next(o for (_, agree), _, o in compared if not agree)
            wrong = [(metrics["max_deviation"], worst_disagreement)]
        if len(errors) <= g.max_exceptions and not wrong:
            return self.finding(
                ctx,
                Verdict.PASS,
                f"{method}: {len(outcomes)} concurrent calls from {p.threads} threads match the sequential results "
                f"(max {unit} {metrics['max_deviation']:.1e})",
                metrics=metrics,
                gate=gate,
                evidence=evidence,
            )
        parts = []
        artifacts: list[Artifact] = []
        if errors:
            first = errors[0]
            kinds = sorted({e.error.split(":")[0] for e in errors})
            parts.append(
                f"{len(errors)} of {len(outcomes)} calls raised ({', '.join(kinds)}; first: {first.error[:120]})"
            )
            evidence["first_exception"] = {
                "thread": first.thread,
                "call_order": first.order,
                "batch": calls[first.call].labels,
                "error": first.error,
                "traceback": first.trace,
            }
        if wrong:
            d, worst = max(wrong, key=lambda t: t[0])
            call = calls[worst.call]
            parts.append(
                f"{len(wrong)} of {len(outcomes)} results differ from sequential (max {unit} {d:.3g} in thread "
                f"{worst.thread}, call {worst.order}, batch of {len(call.items)}: {', '.join(call.labels)[:100]})"
            )
            evidence["worst_mismatch"] = {
                "thread": worst.thread,
                "call_order": worst.order,
                "batch": call.labels,
                "deviation": d,
                "max_abs_diff": max_difference(worst.result, sequential[worst.call]),
            }
            artifacts.append(self._artifact(ctx, method, call))
            evidence["input_artifact"] = artifacts[-1].name
        return self.finding(
            ctx,
            Verdict.FAIL,
            f"{method}: not thread-safe: " + "; ".join(parts),
            severity=Severity.HIGH,
            metrics=metrics,
            gate=gate,
            message="; ".join(parts)[:1000],
            suggestion="give each call its own buffers (no shared mutable preprocessing state); guard non-reentrant "
            "tokenizers with a lock or one instance per thread; or serialise calls",
            evidence=evidence,
            artifacts=artifacts,
        )

    @staticmethod
    def _concurrent(fn: Callable[[Sequence[Any]], Any], calls: list[_Call], p: ThreadSafetyParams) -> list[_Outcome]:
        barrier = threading.Barrier(p.threads)
        results: list[list[_Outcome]] = [[] for _ in range(p.threads)]

        def worker(t: int) -> None:
            try:
                barrier.wait(timeout=p.timeout_s)
            except threading.BrokenBarrierError:
                return
            for m in range(p.calls_per_thread):
                k = (t * p.calls_per_thread + m) % len(calls)
                outcome = _Outcome(thread=t, order=m, call=k)
                try:
                    outcome.result = _as_result(fn(calls[k].items))
                except Exception as exc:  # the point of the check: report, with the trace
                    outcome.error = f"{type(exc).__name__}: {exc}"[:500]
                    outcome.trace = traceback.format_exc()[-4000:]
                results[t].append(outcome)

        threads = [
            threading.Thread(target=worker, args=(t,), daemon=True, name=f"mmchaos-ts-{t}") for t in range(p.threads)
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join(p.timeout_s)
        return [o for rs in results for o in rs]

    @staticmethod
    def _artifact(ctx: CheckContext, method: str, call: _Call) -> Artifact:
        import io
        import json

        if method.startswith("generate"):
            return _requests_artifact(ctx, method, call)
        if method == "embed_texts":
            return Artifact(f"{ctx.check_id}-{method}-batch.json", json.dumps(call.items).encode(), "application/json")
        buf = io.BytesIO()
        arrays = [np.frombuffer(i, np.uint8) if isinstance(i, bytes) else np.asarray(i) for i in call.items]
        np.savez_compressed(buf, *arrays)
        return Artifact(f"{ctx.check_id}-{method}-batch.npz", buf.getvalue(), "application/x-npz")


def _generate_fn(target: Target, method: str, p: ThreadSafetyParams) -> Callable[[Sequence[Any]], list[str]]:
    """A call of ``generate_batch`` on a batch of requests, as one signature string per request."""
    sampled = method == "generate_sampled"
    params = GenerationParams(
        max_new_tokens=p.max_new_tokens, temperature=1.0 if sampled else 0.0, seed=1234 if sampled else None,
        logprobs=False,
    )  # fmt: skip

    def call(requests: Sequence[Any]) -> list[str]:
        batch: list[list[Message]] = [list(r) for r in requests]
        return [result_signature(r) for r in target.generate_batch(batch, params)]

    return call


def _requests_artifact(ctx: CheckContext, method: str, call: _Call) -> Artifact:
    """The requests of a batch: each one's images and text parts, in an ``.npz``."""
    import io

    arrays: dict[str, Any] = {}
    for i, request in enumerate(call.items):
        for j, message in enumerate(request):
            for k, part in enumerate(message.parts()):
                key = f"r{i}_m{j}_p{k}_{message.role}"
                arrays[key] = np.asarray(part) if not isinstance(part, str) else np.array(part)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return Artifact(f"{ctx.check_id}-{method}-batch.npz", buf.getvalue(), "application/x-npz")
