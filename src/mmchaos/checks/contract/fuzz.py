"""Step 1, searching: mutation fuzzing of the target's decoding path, in isolated workers.

The fixed corpus of ``contract`` asks known questions; this check looks for unknown ones. It
seeds a queue from the corpus (and from small inputs carrying every structure the mutators
edit), mutates them (PNG chunks with valid CRCs, JPEG markers, EXIF and ICC blocks, GIF/WebP/TIFF
headers, UTF-8 edge cases, byte flips and splices), runs each through ``embed_encoded_images`` /
``read_encoded_images`` / ``embed_encoded_texts`` in the contract check's worker processes, and
keeps inputs that show something new. Every crash, hang or garbage answer is deduplicated by
signature, minimised, and saved with its replay command (``mmchaos fuzz-replay``).

Against an ``openai:`` target the same cases are HTTP requests, booked against ``budget``; then
a schema-driven phase sends bodies derived from the server's ``/openapi.json`` when it has one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from pydantic import Field

from mmchaos.chaos.spec import BudgetSpec
from mmchaos.checks.base import ANY_MODALITY, Check, CheckContext, Gate, Params
from mmchaos.checks.contract.contract import _base_sample, pool_spec, prefetch_shared_pool, worker_load_error
from mmchaos.checks.evidence import safe_name
from mmchaos.errors import TargetLoadError
from mmchaos.executors.isolated import JournaledRunner
from mmchaos.executors.jobs import JobResult
from mmchaos.findings import Artifact, Finding, Severity, Step, Verdict
from mmchaos.fuzz import Failure, FuzzConfig, Fuzzer, FuzzReport, Seed
from mmchaos.fuzz.formats import sniff
from mmchaos.fuzz.replay import replay_command
from mmchaos.fuzz.seeds import corpus_seeds, format_seeds, shrink, text_seeds
from mmchaos.fuzz.worker import fuzz_job, method_for
from mmchaos.hostile import CorpusBase
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.wrappers import unwrap

__all__ = ["ContractFuzz", "ContractFuzzGate", "ContractFuzzParams"]

Kind = Literal["image_bytes", "text_bytes"]
_KINDS: tuple[Kind, ...] = ("image_bytes", "text_bytes")
_EXT = {"png": "png", "jpeg": "jpg", "gif": "gif", "webp": "webp", "tiff": "tiff"}


class ContractFuzzParams(Params):
    max_cases: int = Field(default=3000, ge=1, description="fuzzed inputs at most (the seeds count)")
    max_seconds: float = Field(default=60.0, gt=0, description="wall-clock budget of the mutation phase, s")
    kinds: list[Kind] = Field(default_factory=lambda: list(_KINDS))
    corpus_seeds: bool = Field(default=True, description="seed the queue with the contract corpus's valid files too")
    seed_side: int = Field(default=32, ge=4, le=512, description="seed pictures are shrunk to this side, px")
    isolation: Literal["subprocess", "inprocess"] = "subprocess"
    workers: int = Field(default=2, ge=1, le=32)
    timeout_s: float = Field(default=10.0, gt=0, description="per input; past it the input is 'hung'")
    start_timeout_s: float = Field(default=300.0, gt=0)
    memory_limit_mb: int = Field(
        default=6144, ge=0, description="address-space limit per CPU worker; 0 = none (as contract's: one shared pool)"
    )
    threads_per_worker: int | None = Field(default=1, ge=1)
    accepted_errors: list[str] = Field(default_factory=list)
    target_options: dict[str, Any] = Field(default_factory=dict)
    stop_after_failures: int = Field(
        default=0, ge=0, description="end the mutation phase after this many distinct failures; 0 = whole budget"
    )
    novelty: bool = Field(default=True, description="keep inputs that show a new feature (off: seeds only)")
    minimise: bool = True
    minimise_tests: int = Field(default=400, ge=1, description="runs per failure signature at most")
    minimise_seconds: float = Field(default=30.0, gt=0, description="per failure signature")
    budget: BudgetSpec = Field(
        default_factory=lambda: BudgetSpec.model_validate({"max_requests": 2000, "max_duration_s": 120}),
        description="HTTP targets: every fuzzed request, minimisation run and schema request is booked here",
    )
    openapi: bool = Field(default=True, description="HTTP targets: the schema-driven phase from /openapi.json")
    openapi_requests: int = Field(default=200, ge=0, description="requests of the budget kept for that phase")


Failing = Literal["crashed", "hung", "garbage", "server_error"]


class ContractFuzzGate(Gate):
    fail_on: list[Failing] = Field(default=["crashed", "hung", "garbage", "server_error"])


_SEVERITY = {"crashed": Severity.CRITICAL, "hung": Severity.HIGH, "garbage": Severity.HIGH}
_SUGGESTION = {
    "crashed": "turn every refusal of the decoder into a typed error; never index tables or allocate by a "
    "header value without a range check",
    "hung": "bound decoding work by the declared size and put a deadline on every input",
    "garbage": "reject what decodes to nothing meaningful with a typed error instead of answering",
}


def _seeds(target: Target, base: CorpusBase, p: ContractFuzzParams) -> list[Seed]:
    small = CorpusBase(image=shrink(base.image, p.seed_side), caption=base.caption)
    seeds = format_seeds(small.image) + text_seeds(small.caption)
    if p.corpus_seeds:
        seeds += corpus_seeds(small, list(p.kinds))
    return [s for s in seeds if s.kind in p.kinds and method_for(target.capabilities, s.kind) is not None]


def _file_name(prefix: str, index: int, what: str, kind: str, data: bytes) -> str:
    ext = "txt" if kind == "text_bytes" else _EXT.get(sniff(data), "bin")
    return safe_name(f"{prefix}-{index:02d}-{what}.{ext}")


class _RequestGate:
    """Books each fuzzed request against the HTTP budget, keeping ``reserve`` for the schema phase."""

    def __init__(self, budget: BudgetSpec, host: str, reserve: int) -> None:
        from mmchaos.chaos.budget import RequestLedger

        self.ledger = RequestLedger(budget)
        self.host = host
        self.reserve = reserve

    def __call__(self) -> bool:
        from mmchaos.chaos.budget import BudgetExhausted

        if self.ledger.remaining_requests() <= self.reserve:
            return False
        try:
            self.ledger.check_host(self.host)
            self.ledger.reserve()
        except BudgetExhausted:
            return False
        return True


class Rounds:
    """The fuzzer's batches as keyed units: the engine decides each batch on the driver from the
    results of the earlier ones (seeded), so a batch's inputs are known before they run, and a
    resumed run that replays the same seed asks for the same batches in the same order.

    An input's key is its batch number, its place in the batch and a digest of its bytes: a resumed
    campaign that took another path (a time budget ran out elsewhere) computes what it has not seen.
    """

    def __init__(self, runner: JournaledRunner) -> None:
        self.runner = runner
        self.batches = 0

    @property
    def replacements(self) -> int:
        return self.runner.replacements

    def map(self, payloads: Sequence[Any], timeout: float) -> Iterator[tuple[int, JobResult]]:
        batch = self.batches
        self.batches += 1
        keys = [f"b{batch}.{i}.{_digest(kind, data)}" for i, (kind, data) in enumerate(payloads)]
        return self.runner.map(payloads, timeout, keys=keys)


def _digest(kind: str, data: bytes) -> str:
    return hashlib.sha256(kind.encode() + b"\0" + bytes(data)).hexdigest()[:16]


class ContractFuzz(Check[ContractFuzzParams, ContractFuzzGate]):
    """Mutation fuzzing of encoded images and texts in isolated workers: no crash, hang or garbage."""

    name = "contract_fuzz"
    step = Step.CONTRACT
    requires = (*ANY_MODALITY, frozenset({Capability.GENERATE}))

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        target = unwrap(ctx.target)
        base = _base_sample(ctx)
        seeds = _seeds(target, base, p)
        if not seeds:
            yield self.finding(ctx, Verdict.SKIPPED, "the target takes no encoded images or texts to fuzz")
            return
        http = str(target.uri).startswith("openai:")
        gate: _RequestGate | None = None
        if http:
            from urllib.parse import urlsplit

            host = urlsplit(str(target.uri).removeprefix("openai:")).hostname or ""
            gate = _RequestGate(p.budget, host, p.openapi_requests if p.openapi else 0)
        config = FuzzConfig(
            max_cases=p.max_cases,
            max_seconds=p.max_seconds,
            timeout_s=p.timeout_s,
            minimise=p.minimise,
            minimise_tests=p.minimise_tests,
            minimise_seconds=p.minimise_seconds,
            stop_after_failures=p.stop_after_failures,
            novelty=p.novelty,
        )
        overlay = {"accepted_errors": tuple(p.accepted_errors)}
        try:
            # The run's shared pool (contract's and determinism's): started once, loaded already;
            # or a worker on each Ray actor, or this process. Every batch's inputs are journaled units.
            with ctx.isolated(
                fuzz_job, pool_spec(target, p), workers=p.workers, start_timeout=p.start_timeout_s, overlay=overlay,
                in_process=p.isolation == "inprocess",
            ) as runner:  # fmt: skip
                report = self._fuzz(ctx, Rounds(runner), seeds, config, gate)
        except TargetLoadError as exc:
            yield worker_load_error(self, ctx, target, exc)
            return
        schema: dict[str, Any] = {}
        schema_findings: list[Finding] = []
        if http and gate is not None and p.openapi:
            schema, schema_findings = self._schema_phase(ctx, target, gate, p)
        yield from self._findings(ctx, target, report, seeds, runner.replacements, gate, schema)
        yield from schema_findings

    def _fuzz(
        self,
        ctx: CheckContext,
        runner: Rounds,
        seeds: list[Seed],
        config: FuzzConfig,
        gate: _RequestGate | None,
    ) -> FuzzReport:
        bar = ctx.progress.task(f"{ctx.check_id}: fuzzing", total=self.params.max_cases)
        try:
            return Fuzzer(runner, seeds, config, ctx.rng("fuzz"), gate=gate, on_progress=bar.advance).run()
        finally:
            bar.close()

    def prepare(self, ctx: CheckContext) -> None:
        """Ask for the run's worker pool now, so it loads the model while other checks run."""
        prefetch_shared_pool(ctx, self.params)

    def _schema_phase(
        self, ctx: CheckContext, target: Target, gate: _RequestGate, p: ContractFuzzParams
    ) -> tuple[dict[str, Any], list[Finding]]:
        from mmchaos.fuzz.openapi import http_replay_command, schema_phase

        outcome = schema_phase(
            str(target.uri).removeprefix("openai:"),
            gate.ledger,
            ctx.rng("openapi"),
            model=str(getattr(target, "model", "") or ""),
            timeout_s=p.timeout_s,
        )
        findings: list[Finding] = []
        if "server_error" in self.gate.fail_on:
            for i, failure in enumerate(outcome.failures.values()):
                name = safe_name(f"{ctx.check_id}-http-{i:02d}.http.json")
                findings.append(
                    self.finding(
                        ctx,
                        Verdict.FAIL,
                        f"{failure.method} {failure.path}: {failure.detail}"[:300],
                        severity=Severity.HIGH,
                        message=f"a request built from the server's own OpenAPI schema ({failure.label}) got "
                        f"{failure.detail}: a client's mistake must get a 4xx, never a 5xx or a dropped connection",
                        suggestion="validate request bodies against the schema and answer 4xx with a typed error",
                        gate="no request may get a 5xx or a dropped connection",
                        evidence={
                            "signature": failure.signature,
                            "request": failure.label,
                            "hits": failure.hits,
                            "input_artifact": name,
                            "replay": http_replay_command(str(target.uri), name),
                        },
                        artifacts=[Artifact(name, failure.to_json(), "application/json")],
                    )
                )
        return outcome.summary(), findings

    def _findings(
        self,
        ctx: CheckContext,
        target: Target,
        report: FuzzReport,
        seeds: list[Seed],
        replacements: int,
        gate: _RequestGate | None,
        schema: dict[str, Any],
    ) -> Iterator[Finding]:
        failing = [f for f in report.failures.values() if f.outcome in self.gate.fail_on]
        for i, failure in enumerate(failing):
            yield self._failure(ctx, target, i, failure)
        errors = report.outcomes.get("error", 0)
        if errors:
            yield self.finding(
                ctx,
                Verdict.ERROR,
                f"{errors} fuzzed input(s) could not be run: {report.first_error}"[:300],
                severity=Severity.MEDIUM,
                message=report.first_error,
                metrics={"n_error": float(errors)},
            )
        metrics: dict[str, float] = {
            "cases": float(report.cases),
            "cases_per_s": report.cases_per_s,
            "seconds": report.seconds,
            "distinct_failures": float(len(failing)),
            "seeds": float(len(seeds)),
            "novel_features": float(report.features),
            "queue": float(report.queue),
            "minimise_runs": float(report.minimise_tests),
            "worker_replacements": float(replacements),
            **{f"n_{k}": float(v) for k, v in sorted(report.outcomes.items())},
        }
        if report.first_failure_s is not None:
            metrics["time_to_first_failure_s"] = report.first_failure_s
            metrics["cases_to_first_failure"] = float(report.first_failure_case or 0)
        if gate is not None:
            metrics["http_requests"] = float(gate.ledger.sent)
        for key, value in schema.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                metrics[f"openapi_{key}"] = float(value)
        p = self.params
        title = f"{report.cases} fuzzed inputs in {report.seconds:.1f} s ({report.cases_per_s:.0f}/s): " + (
            f"{len(failing)} distinct failure(s), listed separately" if failing else "no crash, hang or garbage"
        )
        yield self.finding(
            ctx,
            Verdict.PASS,
            title,
            metrics=metrics,
            gate=f"no fuzzed input may end {', '.join(self.gate.fail_on)}",
            evidence={
                "stopped_by": report.stopped_by,
                "budget": {"max_cases": p.max_cases, "max_seconds": p.max_seconds},
                "seed": ctx.seed,
                "guidance": "novelty: reference-decoder features, typed codes and output shapes never seen before",
                "outcomes": dict(report.outcomes),
                "signatures": {f.signature: f.hits for f in report.failures.values()},
                "openapi": schema,
            },
        )

    def _failure(self, ctx: CheckContext, target: Target, index: int, failure: Failure) -> Finding:
        p = self.params
        minimal = failure.minimised if failure.minimised is not None else failure.data
        main = _file_name(ctx.check_id, index, "min", failure.kind, minimal)
        artifacts = [Artifact(main, minimal, "application/octet-stream")]
        if minimal != failure.data:
            orig = _file_name(ctx.check_id, index, "orig", failure.kind, failure.data)
            artifacts.append(Artifact(orig, failure.data, "application/octet-stream"))
        evidence: dict[str, Any] = {
            "signature": failure.signature,
            "outcome": failure.outcome,
            "detail": failure.detail,
            "kind": failure.kind,
            "hits": failure.hits,
            "found_after_cases": failure.case_index,
            "found_after_s": round(failure.seconds_to_find, 3),
            "parent": failure.parent,
            "mutators": failure.mutators,
            "original_bytes": len(failure.data),
            "minimised_bytes": len(minimal),
            "minimise_runs": failure.minimise_tests,
            "input_artifact": main,
            "artifacts": [a.name for a in artifacts],
            "seed": ctx.seed,
            "replay": replay_command(str(target.uri), main, failure.kind, failure.signature, p.target_options),
        }
        if failure.error is not None:
            evidence["error"] = {
                "type": failure.error.type,
                "code": failure.error.code,
                "message": failure.error.message,
            }
            evidence["traceback"] = failure.error.traceback
        if failure.stderr.strip():
            evidence["worker_stderr"] = failure.stderr
        return self.finding(
            ctx,
            Verdict.FAIL,
            f"{failure.signature} -- {failure.detail}"[:300],
            severity=_SEVERITY.get(failure.outcome, Severity.MEDIUM),
            metrics={
                "found_after_cases": float(failure.case_index),
                "found_after_s": failure.seconds_to_find,
                "minimised_bytes": float(len(minimal)),
                "hits": float(failure.hits),
            },
            gate=f"no fuzzed input may end {', '.join(self.gate.fail_on)}",
            message=f"a fuzzed {failure.kind.replace('_', ' ')} input ({len(minimal)} bytes after minimisation, "
            f"from {failure.parent} by {', '.join(failure.mutators) or 'no mutation'}): {failure.detail}"[:1000],
            suggestion=_SUGGESTION.get(failure.outcome, ""),
            evidence=evidence,
            artifacts=artifacts,
        )
