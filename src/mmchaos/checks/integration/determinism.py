"""Step 5: the same inputs give the same outputs twice in one process and in two processes.

In-process: every batch is run twice through one loaded target (the run's own, or with
``--executor ray`` an actor's). Across processes: two worker processes each load the target by URI
(as ``mmchaos validate`` would on two replicas; in a run, the pool the contract check used too,
started once; on Ray, two workers of one actor) and run the same batches; their outputs must be
identical (the gate can allow a tolerance). The in-process outputs are compared with the workers'
too, for information: they may legitimately differ when earlier checks changed process-wide settings.

Generative targets: the same greedy requests twice give the same completions
(text, token ids, finish reason, and logprobs within the gate), and sampling with a seed gives the
same completions twice for each seed; how many different completions the seeds give is reported
for information (a backend that ignores the seed gives one).

Every part is journaled work (the in-process pass and the generation pairs one work unit each,
each cross-process batch a job), so ``--resume`` after a kill reads back what had finished.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
from pydantic import Field

from mmchaos.checks.base import ANY_MODALITY, Check, CheckContext, Gate, Params
from mmchaos.checks.engine.generation_inputs import probe_requests, result_signature
from mmchaos.checks.integration.thread_safety import max_difference
from mmchaos.checks.logprobs import LogprobsTally
from mmchaos.errors import MMChaosError, TargetLoadError
from mmchaos.executors.base import Worker
from mmchaos.executors.codec import decode_value, encode_value
from mmchaos.executors.jobs import JobResult, WorkerSpec, describe_exception, shared_spec
from mmchaos.findings import Artifact, Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import Completion, GenerationParams, GenerationResult, Message
from mmchaos.targets.wrappers import unwrap

__all__ = ["Determinism"]


def _result(out: Any) -> Any:
    if isinstance(out, list | tuple) and all(isinstance(s, str) for s in out):
        return list(out)
    return np.array(out, copy=True)


Batch = tuple[str, list[Any]]
"""(method, inputs): ``getattr(target, method)(inputs)``."""


def twice_unit(worker: Worker, shared: None, batches: list[Batch]) -> dict[str, list[Any]]:
    """Work unit: every batch through the worker's target, then every batch again (so state one
    batch leaves behind shows in the other's second run)."""
    target = worker.target
    first = [_result(getattr(target, method)(items)) for method, items in batches]
    return {"first": first, "second": [_result(getattr(target, method)(items)) for method, items in batches]}


def _decode_twice(body: dict[str, Any]) -> dict[str, list[Any]]:
    return {k: decode_value(v) for k, v in body.items()}


def generate_twice_unit(
    worker: Worker, requests: list[list[Message]], settings: list[GenerationParams]
) -> list[dict[str, Any]]:
    """Work unit: for each setting in turn, the same requests twice (or the target's typed refusal).

    One unit on one target, so what earlier settings left behind (a warm cache) is there for the
    later ones wherever the unit runs: on Ray, settings split over actors would meet fresh state."""
    out: list[dict[str, Any]] = []
    for params in settings:
        try:
            first = worker.target.generate_batch(requests, params)
            second = worker.target.generate_batch(requests, params)
        except MMChaosError as exc:
            out.append({"refused": exc.code, "message": exc.message[:500]})
            continue
        out.append({"first": first, "second": second})
    return out


def _encode_generation(outs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        dict(out) if "refused" in out else {k: [_encode_result(r) for r in out[k]] for k in ("first", "second")}
        for out in outs
    ]


def _encode_result(r: GenerationResult) -> dict[str, Any]:
    """A result as JSON values: its completions and prompt tokens (``extra`` is not compared)."""
    return {
        "completions": [[c.text, c.finish_reason, c.token_ids, c.logprobs] for c in r.completions],
        "prompt_tokens": r.prompt_tokens,
    }


def _decode_generation(body: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        out if "refused" in out else {k: [_decode_result(r) for r in out[k]] for k in ("first", "second")}
        for out in body
    ]


def _decode_result(body: dict[str, Any]) -> GenerationResult:
    completions = tuple(
        Completion(text, reason, tuple(ids) if ids is not None else None, tuple(lp) if lp is not None else None)
        for text, reason, ids, lp in body["completions"]
    )
    return GenerationResult(completions, body["prompt_tokens"])


def call_job(target: Target, spec: WorkerSpec, payload: Batch) -> dict[str, Any]:
    """Worker handler: ``getattr(target, method)(items)``."""
    method, items = payload
    try:
        return {"output": _result(getattr(target, method)(items))}
    except Exception as exc:
        return {"error": describe_exception(exc)}


class DeterminismParams(Params):
    samples: int = Field(default=16, ge=1)
    batch_size: int = Field(default=8, ge=1)
    cross_process: bool = Field(default=True, description="also compare two fresh worker processes")
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
        unit = [(m, items) for m, items, _ in batches]
        [twice] = ctx.map_units(twice_unit, None, [unit], keys=["in_process"], encode=encode_value,
                                decode=_decode_twice)  # fmt: skip
        first, second = twice["first"], twice["second"]
        yield self._compare(ctx, "in_process", "twice in this process", batches, first, second, g)
        if not p.cross_process:
            return
        inner = unwrap(ctx.target)
        runs: list[list[Any]] = [[], []]
        failure = ""
        try:
            with ctx.isolated(call_job, self._spec(inner), workers=2, start_timeout=p.start_timeout_s) as pool:
                for b, (method, items, _) in enumerate(batches):
                    results: list[JobResult] = pool.broadcast((method, items), p.timeout_s, key=f"cross_process/{b}")
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
        spec = shared_spec(inner, p.target_options, threads=p.threads_per_worker, memory_limit_mb=p.memory_limit_mb)
        return replace(spec, fresh_process=True)  # forked workers would share this process's load

    def prepare(self, ctx: CheckContext) -> None:
        """Start the run's worker pool now (the one contract uses too)."""
        if self.params.cross_process:
            ctx.prefetch_isolated(self._spec(unwrap(ctx.target)), workers=2, start_timeout=self.params.start_timeout_s)

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
        sampled = [
            GenerationParams(max_new_tokens=p.max_new_tokens, temperature=p.temperature, seed=seed, logprobs=True)
            for seed in p.seeds
        ]
        [outs] = ctx.map_units(generate_twice_unit, requests, [[greedy, *sampled]], keys=["generate"],
                               encode=_encode_generation, decode=_decode_generation)  # fmt: skip
        yield self._generation_pair(ctx, "generate_greedy", "greedy generate twice", names, [greedy], outs[:1])
        if sampled:
            how = "seeded sampling twice per seed"
            yield self._generation_pair(ctx, "generate_seeded", how, names, sampled, outs[1:])

    def _generation_pair(
        self,
        ctx: CheckContext,
        mode: str,
        how: str,
        names: list[str],
        settings: list[GenerationParams],
        outs: list[dict[str, Any]],
    ) -> Finding:
        g = self.gate
        evidence: dict[str, Any] = {"mode": mode, "seed": ctx.seed, "methods": ["generate_batch"],
                                    "requests": names, "seeds": [s.seed for s in settings]}  # fmt: skip
        refused = next((out for out in outs if "refused" in out), None)
        if refused is not None:
            return self.finding(
                ctx, Verdict.ERROR, f"{how}: the target refused the requests ({refused['refused']})",
                severity=Severity.MEDIUM, message=refused["message"], evidence=evidence,
            )  # fmt: skip
        runs = [(params, out["first"], out["second"]) for params, out in zip(settings, outs, strict=True)]
        differing: list[dict[str, Any]] = []
        worst_logprob = 0.0
        logprobs = LogprobsTally()
        for params, first, second in runs:
            for name, a, b in zip(names, first, second, strict=True):
                logprobs.add(*a.completions, *b.completions)
                gap = max((_logprob_gap(x, y) for x, y in zip(a.completions, b.completions, strict=False)), default=0.0)
                same = result_signature(a) == result_signature(b)
                if same:
                    worst_logprob = max(worst_logprob, gap)
                if not same or gap > g.max_abs_diff:
                    differing.append({"request": name, "seed": params.seed, "first": a.text[:200],
                                      "second": b.text[:200], "max_logprob_diff": gap})  # fmt: skip
        metrics = {"requests": float(len(names) * len(runs)), "differing_requests": float(len(differing))}
        if logprobs.measured:  # a difference of logprobs the target never gave is no measurement
            metrics["max_logprob_diff"] = worst_logprob
        evidence["logprobs"] = logprobs.evidence(ctx.target)
        if mode == "generate_seeded":
            distinct = [len({result_signature(first[i]) for _, first, _ in runs}) for i in range(len(names))]
            metrics["mean_distinct_over_seeds"] = float(np.mean(distinct)) if distinct else 0.0
        gate = f"identical completions (text, tokens, finish reason) and logprobs within {g.max_abs_diff:g}"
        if not differing:
            unmeasured = "" if logprobs.measured else f"; {logprobs.clause()}, so they were not compared"
            return self.finding(
                ctx, Verdict.PASS, f"{how}: identical completions ({len(names)} requests{unmeasured})",
                metrics=metrics, gate=gate, evidence=evidence,
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
