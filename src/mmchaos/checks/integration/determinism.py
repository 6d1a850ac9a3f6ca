"""Step 5: the same inputs give the same outputs twice in one process and in two processes.

In-process: every batch is run twice through the target the run holds. Across processes: two
worker processes each load the target by URI (as ``mmchaos validate`` would on two replicas;
in a run, the pool the contract check used too, started once) and run the same batches; their
outputs must be identical (the gate can allow a tolerance). This process's outputs are compared
with the workers' too, for information: they may legitimately differ when earlier checks changed
process-wide settings.

Generative targets (in this process): the same greedy requests twice give the same completions
(text, token ids, finish reason, and logprobs within the gate), and sampling with a seed gives the
same completions twice for each seed; how many different completions the seeds give is reported
for information (a backend that ignores the seed gives one).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from pydantic import Field

from mmchaos.checks.base import ANY_MODALITY, Check, CheckContext, Gate, Params
from mmchaos.checks.engine.generation_inputs import probe_requests, result_signature
from mmchaos.checks.integration.thread_safety import max_difference
from mmchaos.errors import MMChaosError, TargetLoadError
from mmchaos.findings import Artifact, Finding, Severity, Step, Verdict
from mmchaos.isolation import JobResult, WorkerSpec, describe_exception, prefetch_pool, run_pool, shared_spec
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import Completion, GenerationParams, GenerationResult, Message
from mmchaos.targets.wrappers import unwrap

__all__ = ["Determinism"]


def _result(out: Any) -> Any:
    if isinstance(out, list | tuple) and all(isinstance(s, str) for s in out):
        return list(out)
    return np.array(out, copy=True)


def call_job(target: Target, spec: WorkerSpec, payload: tuple[str, list[Any]]) -> dict[str, Any]:
    """Worker handler: ``getattr(target, method)(items)``."""
    method, items = payload
    try:
        return {"output": _result(getattr(target, method)(items))}
    except Exception as exc:
        return {"error": describe_exception(exc)}


class DeterminismParams(Params):
    samples: int = Field(default=16, ge=1)
    batch_size: int = Field(default=8, ge=1)
    cross_process: bool = Field(default=True, description="also compare two worker processes (the run's shared pool)")
    timeout_s: float = Field(default=120.0, gt=0)
    start_timeout_s: float = Field(default=300.0, gt=0)
    target_options: dict[str, Any] = Field(default_factory=dict)
    generate_requests: int = Field(default=6, ge=1, description="generative targets: requests compared")
    max_new_tokens: int = Field(default=12, ge=1, description="generative targets: tokens per completion")
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], description="seeds of the sampled requests")
    temperature: float = Field(default=1.0, gt=0, description="temperature of the sampled requests")
    threads_per_worker: int | None = Field(default=1, ge=1, description="as contract's, so a run shares one pool")
    memory_limit_mb: int = Field(default=6144, ge=0, description="as contract's, so a run shares one pool")


class DeterminismGate(Gate):
    max_abs_diff: float = Field(default=0.0, ge=0.0, description="0 = bit-identical")


class Determinism(Check[DeterminismParams, DeterminismGate]):
    """The same inputs twice in one process and once in each of two processes: identical outputs."""

    name = "determinism"
    step = Step.INTEGRATION
    requires = (*ANY_MODALITY, frozenset({Capability.GENERATE}))

    def _batches(self, ctx: CheckContext) -> list[tuple[str, list[Any], list[str]]]:
        p = self.params
        data = ctx.dataset.sample(p.samples, ctx.seed)
        target = ctx.target
        out: list[tuple[str, list[Any], list[str]]] = []
        images = [s.load_image() for s in data] if data.has_images else []
        texts = [t for t in (s.caption or s.text or "" for s in data) if t]
        ids = [s.id for s in data]
        chunks = range(0, len(data), p.batch_size)
        if images and target.has(Capability.EMBED_IMAGE):
            out += [("embed_images", images[i : i + p.batch_size], ids[i : i + p.batch_size]) for i in chunks]
        if texts and target.has(Capability.EMBED_TEXT):
            step = range(0, len(texts), p.batch_size)
            out += [("embed_texts", texts[i : i + p.batch_size], texts[i : i + p.batch_size]) for i in step]
        if images and target.has(Capability.READ_TEXT):
            out += [("read_text", images[i : i + p.batch_size], ids[i : i + p.batch_size]) for i in chunks]
        return out

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        g = self.gate
        generative = ctx.target.has(Capability.GENERATE)
        if generative:
            yield from self._generation(ctx)
        batches = self._batches(ctx)
        if not batches:
            if not generative:
                yield self.finding(ctx, Verdict.SKIPPED, "no inputs of a modality the target handles")
            return
        first = [_result(getattr(ctx.target, m)(items)) for m, items, _ in batches]
        second = [_result(getattr(ctx.target, m)(items)) for m, items, _ in batches]
        yield self._compare(ctx, "in_process", "twice in this process", batches, first, second, g)
        if not p.cross_process:
            return
        inner = unwrap(ctx.target)
        runs: list[list[Any]] = [[], []]
        failure = ""
        try:
            with run_pool(ctx, self._spec(inner), call_job, workers=2, start_timeout=p.start_timeout_s) as pool:
                for method, items, _ in batches:
                    results: list[JobResult] = pool.broadcast((method, items), p.timeout_s)
                    for w, res in enumerate(results):
                        if res.status != "ok" or "error" in res.value:
                            failure = res.detail or (res.value or {}).get("error", "").short()
                            break
                        runs[w].append(res.value["output"])
                    if failure:
                        break
        except TargetLoadError as exc:
            yield self.finding(
                ctx,
                Verdict.ERROR,
                f"cross-process: the target cannot be loaded in a worker by its URI {inner.uri!r}",
                severity=Severity.MEDIUM,
                message=exc.message,
                suggestion="give a loadable URI, or set cross_process: false",
            )
            return
        if failure:
            yield self.finding(
                ctx, Verdict.ERROR, f"cross-process: a worker failed: {failure}"[:300], severity=Severity.MEDIUM
            )
            return
        parent = max(max_difference(a, b) for a, b in zip(first, runs[0], strict=True))
        finding = self._compare(ctx, "cross_process", "in two worker processes", batches, runs[0], runs[1], g)
        finding.metrics["max_abs_diff_this_process_vs_worker"] = parent
        yield finding

    def _spec(self, inner: Target) -> WorkerSpec:
        p = self.params
        return shared_spec(inner, p.target_options, threads=p.threads_per_worker, memory_limit_mb=p.memory_limit_mb)

    def prepare(self, ctx: CheckContext) -> None:
        """Start the run's worker pool now (the one contract uses too)."""
        if self.params.cross_process:
            prefetch_pool(ctx, self._spec(unwrap(ctx.target)), workers=2, start_timeout=self.params.start_timeout_s)

    def _compare(
        self,
        ctx: CheckContext,
        mode: str,
        how: str,
        batches: list[tuple[str, list[Any], list[str]]],
        a: list[Any],
        b: list[Any],
        g: DeterminismGate,
    ) -> Finding:
        diffs = [max_difference(x, y) for x, y in zip(a, b, strict=True)]
        worst = int(np.argmax(diffs))
        metrics = {"max_abs_diff": diffs[worst], "batches": float(len(batches)),
                   "differing_batches": float(sum(d > g.max_abs_diff for d in diffs))}  # fmt: skip
        method, _items, labels = batches[worst]
        evidence: dict[str, Any] = {"mode": mode, "seed": ctx.seed, "methods": sorted({m for m, _, _ in batches})}
        gate = f"max abs diff <= {g.max_abs_diff:g}"
        if diffs[worst] <= g.max_abs_diff:
            return self.finding(
                ctx, Verdict.PASS, f"{how}: identical outputs ({len(batches)} batches)", metrics=metrics, gate=gate,
                evidence=evidence,
            )  # fmt: skip
        evidence["worst"] = {"method": method, "batch": labels, "max_abs_diff": diffs[worst]}
        import json

        repro = json.dumps({"method": method, "batch": labels}).encode()
        artifact = Artifact(f"{ctx.check_id}-{mode}-batch.json", repro, "application/json")
        return self.finding(
            ctx,
            Verdict.FAIL,
            f"{how}: outputs differ (max abs diff {diffs[worst]:.3g} in {method} on {', '.join(labels)[:80]}; "
            f"{int(metrics['differing_batches'])} of {len(batches)} batches)",
            severity=Severity.HIGH,
            metrics=metrics,
            gate=gate,
            message=f"{method} on the same batch gave different outputs {how}",
            suggestion="call model.eval(); disable dropout/augmentation at inference; seed nothing from process "
            "state (hash(), time, PIDs); pin thread counts and deterministic kernels",
            evidence=evidence,
            artifacts=[artifact],
        )

    # --- generative targets -------------------------------------------------------------------------

    def _generation(self, ctx: CheckContext) -> Iterator[Finding]:
        """Greedy twice, then each seed twice: the same completions every time."""
        p = self.params
        requests, names = probe_requests(ctx, p.generate_requests)
        greedy = GenerationParams(max_new_tokens=p.max_new_tokens, logprobs=True)
        yield self._generation_pair(ctx, "generate_greedy", "greedy generate twice", requests, names, [greedy])
        sampled = [
            GenerationParams(max_new_tokens=p.max_new_tokens, temperature=p.temperature, seed=seed, logprobs=True)
            for seed in p.seeds
        ]
        if sampled:
            how = "seeded sampling twice per seed"
            yield self._generation_pair(ctx, "generate_seeded", how, requests, names, sampled)

    def _generation_pair(
        self,
        ctx: CheckContext,
        mode: str,
        how: str,
        requests: list[list[Message]],
        names: list[str],
        settings: list[GenerationParams],
    ) -> Finding:
        g = self.gate
        evidence: dict[str, Any] = {"mode": mode, "seed": ctx.seed, "methods": ["generate_batch"],
                                    "requests": names, "seeds": [s.seed for s in settings]}  # fmt: skip
        runs: list[tuple[GenerationParams, list[GenerationResult], list[GenerationResult]]] = []
        try:
            for params in settings:
                first = ctx.target.generate_batch(requests, params)
                runs.append((params, first, ctx.target.generate_batch(requests, params)))
        except MMChaosError as exc:
            return self.finding(
                ctx, Verdict.ERROR, f"{how}: the target refused the requests ({exc.code})", severity=Severity.MEDIUM,
                message=exc.message[:500], evidence=evidence,
            )  # fmt: skip
        differing: list[dict[str, Any]] = []
        worst_logprob = 0.0
        for params, first, second in runs:
            for name, a, b in zip(names, first, second, strict=True):
                gap = max((_logprob_gap(x, y) for x, y in zip(a.completions, b.completions, strict=False)), default=0.0)
                same = result_signature(a) == result_signature(b)
                if same:
                    worst_logprob = max(worst_logprob, gap)
                if not same or gap > g.max_abs_diff:
                    differing.append({"request": name, "seed": params.seed, "first": a.text[:200],
                                      "second": b.text[:200], "max_logprob_diff": gap})  # fmt: skip
        metrics = {
            "requests": float(len(requests) * len(runs)),
            "differing_requests": float(len(differing)),
            "max_logprob_diff": worst_logprob,
        }
        if mode == "generate_seeded":
            distinct = [len({result_signature(first[i]) for _, first, _ in runs}) for i in range(len(requests))]
            metrics["mean_distinct_over_seeds"] = float(np.mean(distinct)) if distinct else 0.0
        gate = f"identical completions (text, tokens, finish reason) and logprobs within {g.max_abs_diff:g}"
        if not differing:
            return self.finding(
                ctx, Verdict.PASS, f"{how}: identical completions ({len(requests)} requests)", metrics=metrics,
                gate=gate, evidence=evidence,
            )  # fmt: skip
        evidence["differing"] = differing[:10]
        first_bad = differing[0]
        seeded = mode == "generate_seeded"
        return self.finding(
            ctx,
            Verdict.FAIL,
            f"{how}: completions differ ({len(differing)} of {int(metrics['requests'])} requests; "
            f"{first_bad['request']}" + (f", seed {first_bad['seed']}" if seeded else "") + ")",
            severity=Severity.HIGH,
            metrics=metrics,
            gate=gate,
            message=f"{first_bad['first']!r} then {first_bad['second']!r}",
            suggestion="seed the sampler from the request (a per-request torch.Generator or a forked RNG), never from "
            "process state or time"
            if seeded
            else "greedy decoding must not depend on state left by earlier calls (caches, batch composition, "
            "non-deterministic kernels)",
            evidence=evidence,
        )


def _logprob_gap(a: Completion, b: Completion) -> float:
    """The largest difference of two completions' logprobs (0 when either has none; inf on length)."""
    if a.logprobs is None or b.logprobs is None:
        return 0.0
    if len(a.logprobs) != len(b.logprobs):
        return float("inf")
    if not a.logprobs:
        return 0.0
    return float(np.max(np.abs(np.asarray(a.logprobs, np.float64) - np.asarray(b.logprobs, np.float64))))
