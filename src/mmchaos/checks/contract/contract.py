"""Step 1: hostile and malformed inputs get a clean rejection or a correct answer, never worse.

Every case of the hostile corpus (:mod:`mmchaos.hostile`) runs through the target's own decoding
path (``embed_encoded_images``, ``read_encoded_images``, ``embed_encoded_texts``) or its array
API (a target that only generates gets them as greedy chat requests: :mod:`.generative`), inside a
pool of worker processes that each load the target once by URI (the run's shared
pool, or with ``--executor ray`` a one-worker pool on each Ray actor). Each case is a keyed work
unit, committed to the run store as it arrives, so ``--resume`` does not run it again. Outcomes:

* ``rejected`` -- a typed error (an :class:`~mmchaos.errors.MMChaosError`, or a class the
  parameters accept);
* ``handled`` -- an answer, and for a valid input the same answer as for the correct picture;
* ``crashed`` -- the worker died (signal, memory limit) or an untyped exception escaped;
* ``hung`` -- no answer within the timeout (the worker is killed and replaced);
* ``garbage`` -- NaN/Inf, an all-zero or constant embedding, an empty transcription of a legible
  picture, an answer to an input that has none, or the answer a known decoding bug gives.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import Field

from mmchaos.checks.base import ANY_MODALITY, AnyCheck, Check, CheckContext, Gate, Params
from mmchaos.checks.contract.generative import GENERATIVE_METHODS, answer_verdict, call
from mmchaos.checks.evidence import png_bytes, safe_name
from mmchaos.errors import TargetLoadError
from mmchaos.executors.isolated import JournaledRunner
from mmchaos.executors.jobs import ErrorInfo, JobResult, JobRunner, WorkerSpec, describe_exception, shared_spec
from mmchaos.findings import Artifact, Finding, Severity, Step, Verdict
from mmchaos.guard.limits import INT32_MAX, int32_wrapped_product
from mmchaos.hostile import Case, CorpusBase, Payload, get_case, select_cases
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.options import OptionValues
from mmchaos.targets.wrappers import unwrap

__all__ = [
    "CaseOutcome",
    "Contract",
    "classify",
    "pool_spec",
    "prefetch_shared_pool",
    "replay",
    "route",
    "worker_load_error",
]

Outcome = Literal["rejected", "handled", "crashed", "hung", "garbage", "error"]

_ROUTES: dict[str, tuple[tuple[Capability, str, str], ...]] = {
    "image_bytes": (
        (Capability.EMBED_IMAGE, "embed_encoded_images", "embed_images"),
        (Capability.READ_TEXT, "read_encoded_images", "read_text"),
        (Capability.GENERATE, "generate_encoded_images", "generate_images"),
    ),
    "image_array": (
        (Capability.EMBED_IMAGE, "embed_images", "embed_images"),
        (Capability.READ_TEXT, "read_text", "read_text"),
        (Capability.GENERATE, "generate_images", "generate_images"),
    ),
    "text": (
        (Capability.EMBED_TEXT, "embed_texts", "embed_texts"),
        (Capability.GENERATE, "generate_texts", "generate_texts"),
    ),
    "text_bytes": ((Capability.EMBED_TEXT, "embed_encoded_texts", "embed_texts"),),
}


def route(capabilities: frozenset[Capability], kind: str) -> tuple[str, str] | None:
    """(method for the hostile payload, array method for references), or None if not applicable."""
    for cap, method, reference in _ROUTES[kind]:
        if cap in capabilities:
            return method, reference
    return None


# -- worker side ---------------------------------------------------------------------------------

_BASES: dict[bytes, CorpusBase] = {}


def _base(context: dict[str, Any]) -> CorpusBase:
    key = context["base_png"]
    if key not in _BASES:
        from PIL import Image

        with Image.open(io.BytesIO(key)) as img:
            image = np.asarray(img.convert("RGB"), dtype=np.uint8)
        _BASES[key] = CorpusBase(image=image, caption=str(context["caption"]))
    return _BASES[key]


def _maxrss_mb() -> float:
    try:
        import resource

        return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024.0
    except ImportError:  # pragma: no cover - not on every platform
        return 0.0


def _sanitise(out: Any) -> Any:
    if isinstance(out, list | tuple) and all(isinstance(x, str) for x in out):
        return list(out)
    try:
        return np.array(out, copy=True)
    except Exception:  # an answer that is not even array-like is garbage, reported as such
        return repr(out)[:500]


def _invoke(fn: Any, item: Any, accepted: tuple[str, ...]) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        out = fn([item])
    except Exception as exc:
        return {"status": "raised", "error": describe_exception(exc, accepted), "seconds": time.perf_counter() - start}
    return {"status": "ok", "output": _sanitise(out), "seconds": time.perf_counter() - start}


def run_case_job(target: Target, spec: WorkerSpec, name: str) -> dict[str, Any]:
    """Worker handler: build case ``name``, run it, and run its reference pictures."""
    case = get_case(name)
    payload = case.build(_base(spec.context))
    methods = route(target.capabilities, case.kind)
    if methods is None:
        return {"not_applicable": True}
    method, reference = methods
    rss = _maxrss_mb()
    main = _invoke(call(target, method), payload.data, spec.accepted_errors)
    main["rss_growth_mb"] = max(0.0, _maxrss_mb() - rss)
    main["method"] = method
    refs: dict[str, Any] = {}
    if payload.expected is not None:
        refs["expected"] = _invoke(call(target, reference), payload.expected, spec.accepted_errors)
    for bug, picture in payload.wrong.items():
        refs[bug] = _invoke(call(target, reference), picture, spec.accepted_errors)
    return {"main": main, "refs": refs}


def _warmup_job(target: Target, spec: WorkerSpec, _: Any) -> None:
    base = _base(spec.context)
    if target.has(Capability.EMBED_IMAGE):
        target.embed_images([base.image])
    if target.has(Capability.READ_TEXT):
        target.read_text([base.image])
    if target.has(Capability.EMBED_TEXT):
        target.embed_texts([base.caption])
    if not target.has(Capability.EMBED_IMAGE, Capability.READ_TEXT) and target.has(Capability.GENERATE):
        call(target, "generate_images")([base.image])


def _job(target: Target, spec: WorkerSpec, payload: tuple[str, Any]) -> Any:
    op, arg = payload
    if op == "warmup":
        return _warmup_job(target, spec, arg)
    return run_case_job(target, spec, arg)


# -- classification ------------------------------------------------------------------------------


@dataclass
class CaseOutcome:
    case: str
    outcome: Outcome
    detail: str
    metrics: dict[str, float] = field(default_factory=dict)
    error: ErrorInfo | None = None
    late_rejection: bool = False
    expect: str = "either"
    stderr: str = ""

    def failed(self, fail_on: list[str]) -> bool:
        if self.late_rejection and "rejected_late" in fail_on:
            return True
        if self.outcome == "rejected":
            return self.expect != "reject" and "rejected_valid" in fail_on
        return self.outcome in fail_on


def _cosine(a: Any, b: Any) -> float:
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    y = np.asarray(b, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        return float("nan")
    denom = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(x @ y / denom) if denom > 0 else float("nan")


def _garbage_in_embedding(out: Any) -> str | None:
    if isinstance(out, str):
        return f"an answer that is not an array: {out[:80]}"
    arr = np.asarray(out)
    if arr.ndim != 2 or arr.shape[0] != 1 or arr.shape[1] == 0:
        return f"output shape {tuple(arr.shape)}, expected (1, D)"
    if not np.issubdtype(arr.dtype, np.number):
        return f"output dtype {arr.dtype}"
    vec = arr.astype(np.float64)[0]
    bad = int((~np.isfinite(vec)).sum())
    if bad:
        return f"{bad} of {vec.size} embedding values are NaN/Inf"
    if not np.any(vec):
        return "an all-zero embedding"
    if float(np.ptp(vec)) == 0.0:
        return f"a constant embedding (every value {vec[0]:.4g})"
    return None


def _text_of(out: Any) -> str | None:
    if isinstance(out, list) and len(out) == 1 and isinstance(out[0], str):
        return out[0]
    return None


def classify(
    case: Case, job: JobResult, min_cosine: float, max_cer: float, max_reject_rss_mb: float, reader: bool = False
) -> CaseOutcome:
    """Turn one worker result into an outcome, with the precise reason."""
    outcome = _classify(case, job, min_cosine, max_cer, max_reject_rss_mb, case.expected_for(reader))
    outcome.expect = case.expected_for(reader)
    outcome.stderr = job.stderr
    return outcome


def _classify(
    case: Case, job: JobResult, min_cosine: float, max_cer: float, max_reject_rss_mb: float, expect: str
) -> CaseOutcome:
    if job.status == "hung":
        return CaseOutcome(case.name, "hung", job.detail, {"seconds": job.seconds})
    if job.status == "crashed":
        return CaseOutcome(case.name, "crashed", f"the worker process died: {job.detail}", {"seconds": job.seconds})
    if job.status != "ok":
        why = job.error.short() if job.error else job.detail
        return CaseOutcome(case.name, "error", f"the harness could not run this case: {why}", error=job.error)
    main = job.value["main"]
    refs = job.value["refs"]
    metrics = {"seconds": float(main["seconds"]), "rss_growth_mb": float(main.get("rss_growth_mb", 0.0))}
    if main["status"] == "raised":
        err: ErrorInfo = main["error"]
        if not err.typed:
            return CaseOutcome(case.name, "crashed", f"uncaught {err.short()}", metrics, error=err)
        late = expect == "reject" and metrics["rss_growth_mb"] > max_reject_rss_mb
        detail = f"{err.short()}"
        if late:
            detail += f" -- but only after allocating {metrics['rss_growth_mb']:.0f} MB"
        return CaseOutcome(case.name, "rejected", detail, metrics, error=err, late_rejection=late)
    out = main["output"]
    if main["method"] in GENERATIVE_METHODS:
        return _classify_answer(case, main["method"], out, refs, expect, metrics)
    is_text = main["method"] in ("read_text", "read_encoded_images")
    if is_text:
        text = _text_of(out)
        if text is None:
            return CaseOutcome(case.name, "garbage", f"expected one transcription, got {str(out)[:80]}", metrics)
    else:
        bad = _garbage_in_embedding(out)
        if bad:
            return CaseOutcome(case.name, "garbage", bad, metrics)
    if expect == "reject":
        return CaseOutcome(
            case.name, "garbage", "answered an input that has no correct answer instead of rejecting it", metrics
        )
    if expect == "either":
        return CaseOutcome(case.name, "handled", "answered sanely", metrics)
    expected = refs.get("expected")
    if expected is None or expected["status"] != "ok":
        why = expected["error"].short() if expected else "no reference"
        return CaseOutcome(case.name, "error", f"the correct picture itself failed: {why}", metrics)
    wrong_ok = {k: v["output"] for k, v in refs.items() if k != "expected" and v["status"] == "ok"}
    if is_text:
        return _classify_text(case, text or "", expected["output"], wrong_ok, max_cer, metrics)
    cos = _cosine(out, expected["output"])
    metrics["cosine_to_correct"] = cos
    best_bug, best_cos = "", -2.0
    for bug, wout in wrong_ok.items():
        c = _cosine(out, wout)
        metrics[f"cosine_to_{bug}"] = c
        if c > best_cos and _cosine(wout, expected["output"]) < 1 - 1e-6:
            best_bug, best_cos = bug, c
    if best_bug and best_cos > cos:
        return CaseOutcome(
            case.name,
            "garbage",
            f"the output matches the known bug '{best_bug}' (cosine {best_cos:.4f}) better than the correct "
            f"picture (cosine {cos:.4f})",
            metrics,
        )
    if not cos >= min_cosine:
        return CaseOutcome(
            case.name, "garbage", f"cosine {cos:.4f} to the correct picture's output (gate >= {min_cosine:g})", metrics
        )
    return CaseOutcome(case.name, "handled", f"same answer as the correct picture (cosine {cos:.6f})", metrics)


def _classify_answer(
    case: Case, method: str, out: Any, refs: dict[str, Any], expect: str, metrics: dict[str, float]
) -> CaseOutcome:
    answer = _text_of(out)
    if answer is None:
        return CaseOutcome(case.name, "garbage", f"expected one answer, got {str(out)[:80]}", metrics)
    expected = refs.get("expected")
    want = _text_of(expected["output"]) if expected and expected["status"] == "ok" else None
    if expect == "equivalent" and want is None:
        why = expected["error"].short() if expected else "no reference"
        return CaseOutcome(case.name, "error", f"the correct picture itself failed: {why}", metrics)
    wrong = {k: t for k, v in refs.items() if k != "expected" and v["status"] == "ok"
             for t in [_text_of(v["output"])] if t is not None}  # fmt: skip
    outcome, detail = answer_verdict(method, answer, expect, want, wrong)
    metrics["answer_chars"] = float(len(answer))
    return CaseOutcome(case.name, outcome, detail, metrics)


def _classify_text(
    case: Case, text: str, expected_out: Any, wrong: dict[str, Any], max_cer: float, metrics: dict[str, float]
) -> CaseOutcome:
    from mmchaos.tasks.ocr_metrics import cer

    want = _text_of(expected_out) or ""
    error_rate = float(cer(text, want)) if (text or want) else 0.0
    metrics["cer_to_correct"] = error_rate
    if want.strip() and not text.strip():
        return CaseOutcome(
            case.name, "garbage", f"empty transcription of a legible picture (correct: {want!r})", metrics
        )
    for bug, wout in wrong.items():
        wtext = _text_of(wout)
        if wtext is not None and wtext == text and wtext != want:
            return CaseOutcome(
                case.name, "garbage", f"read {text!r}, what the known bug '{bug}' reads (correct: {want!r})", metrics
            )
    if error_rate > max_cer:
        return CaseOutcome(
            case.name, "garbage", f"read {text!r} instead of {want!r} (CER {error_rate:.3f} > {max_cer:g})", metrics
        )
    return CaseOutcome(case.name, "handled", f"same transcription as the correct picture ({text!r})", metrics)


# -- the check -----------------------------------------------------------------------------------


class ContractParams(Params):
    cases: list[str] = Field(default_factory=list, description="case names or groups (globs); empty = all")
    exclude: list[str] = Field(default_factory=list)
    isolation: Literal["subprocess", "inprocess"] = Field(
        default="subprocess", description="worker processes (default), or this process for targets not loadable by URI"
    )
    workers: int = Field(default=2, ge=1, le=32)
    timeout_s: float = Field(default=30.0, gt=0, description="per input; past it the input is 'hung'")
    start_timeout_s: float = Field(default=300.0, gt=0)
    memory_limit_mb: int = Field(
        default=6144, ge=0, description="address-space limit per CPU worker (not applied on accelerators); 0 = none"
    )
    threads_per_worker: int | None = Field(default=1, ge=1)
    accepted_errors: list[str] = Field(
        default_factory=list, description="exception class names that count as clean rejections"
    )
    target_options: OptionValues = Field(
        default_factory=dict,
        description="target options for the workers, over the target's own (checked against its scheme's options "
        "when they load it)",
    )


Failure = Literal["crashed", "hung", "garbage", "rejected_valid", "rejected_late"]


class ContractGate(Gate):
    fail_on: list[Failure] = Field(default=["crashed", "hung", "garbage", "rejected_late"])
    min_equivalent_cosine: float = Field(default=0.99, ge=-1.0, le=1.0)
    max_equivalent_cer: float = Field(default=0.0, ge=0.0)
    max_reject_rss_mb: float = Field(
        default=512.0, ge=0.0, description="a rejection that first grew the worker's peak memory by more is 'late'"
    )


_SEVERITY = {"crashed": Severity.CRITICAL, "hung": Severity.HIGH, "garbage": Severity.HIGH, "rejected": Severity.MEDIUM}
_SUGGESTION = {
    "crashed": "validate inputs before decoding/allocating (declared size in 64-bit, mode, dtype, finiteness) and "
    "turn every refusal into a typed error",
    "hung": "bound decoding and preprocessing work by the declared size; put a deadline on every request",
    "garbage": "reject what has no correct answer with a typed error; decode like the reference decoder "
    "(EXIF transpose, 16-bit to 8-bit, CMYK, first frame)",
    "rejected": "check the declared size (64-bit) before decoding, not after",
}


def _base_sample(ctx: CheckContext) -> CorpusBase:
    data = ctx.dataset
    image = None
    caption = ""
    if len(data):
        sample = data[0]
        if data.has_images:
            image = sample.load_image()
        caption = sample.caption or sample.text or ""
    if image is None:
        from mmchaos.data.shapes import make_sample

        fallback = make_sample(0, "test", 0)
        image = fallback.image
        caption = caption or fallback.caption or ""
    return CorpusBase(image=np.ascontiguousarray(image, dtype=np.uint8), caption=caption or "a photo of a red circle")


def payload_artifact(case: Case, payload: Payload, prefix: str) -> Artifact:
    """The exact input as a file (zero-stride giants as a JSON recipe, never materialised)."""
    data = payload.data
    stem = safe_name(f"{prefix}-{case.name}")
    if isinstance(data, bytes | bytearray):
        ext = payload.filename.rsplit(".", 1)[-1] if "." in payload.filename else "bin"
        return Artifact(f"{stem}.{ext}", bytes(data), payload.media_type)
    if isinstance(data, str):
        return Artifact(f"{stem}.txt", data.encode("utf-8", "surrogatepass"), "text/plain")
    arr = np.asarray(data)
    if 0 in arr.strides or arr.nbytes > 16 << 20:
        recipe = {
            "shape": list(arr.shape),
            "dtype": str(arr.dtype),
            "strides": list(arr.strides),
            "recipe": f"numpy.broadcast_to(numpy.zeros((1,)*{arr.ndim}, '{arr.dtype}'), {tuple(arr.shape)})",
        }
        return Artifact(f"{stem}.json", json.dumps(recipe, indent=1).encode(), "application/json")
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return Artifact(f"{stem}.npy", buf.getvalue(), "application/x-npy")


def replay(
    target: Target, case_name: str, image: Any = None, caption: str = "a photo of a red circle"
) -> dict[str, Any]:
    """Run one corpus case in this process and return the raw result (for debugging a finding)."""
    from mmchaos.data.shapes import make_sample

    picture = np.asarray(image if image is not None else make_sample(0, "test", 0).image, dtype=np.uint8)
    spec = WorkerSpec(uri=target.uri, context={"base_png": png_bytes(picture), "caption": caption})
    return run_case_job(target, spec, case_name)


class Contract(Check[ContractParams, ContractGate]):
    """Hostile and malformed inputs in isolated workers: clean rejection or correct answer only."""

    name = "contract"
    step = Step.CONTRACT
    requires = (*ANY_MODALITY, frozenset({Capability.GENERATE}))

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        target = unwrap(ctx.target)
        cases = [c for c in select_cases(p.cases, p.exclude) if route(target.capabilities, c.kind) is not None]
        unsafe: list[str] = []
        if p.isolation == "inprocess":
            # Without a worker's memory limit, an unvalidated array API would really allocate these.
            unsafe = [c.name for c in cases if c.kind == "image_array" and c.over_int32]
            cases = [c for c in cases if c.name not in unsafe]
        if not cases:
            yield self.finding(ctx, Verdict.SKIPPED, "no corpus case applies to this target's capabilities")
            return
        base = _base_sample(ctx)
        overlay = {
            "accepted_errors": tuple(p.accepted_errors),
            "context": {"base_png": png_bytes(base.image), "caption": base.caption},
        }
        start = time.perf_counter()
        try:
            # The run's shared pool, a worker on each Ray actor, or this process; cases are journaled units.
            with ctx.isolated(
                _job, pool_spec(target, p), workers=self._workers(cases), start_timeout=p.start_timeout_s,
                overlay=overlay, in_process=p.isolation == "inprocess",
            ) as runner:  # fmt: skip
                outcomes = self._run_cases(ctx, target, cases, runner)
        except TargetLoadError as exc:
            yield worker_load_error(self, ctx, target, exc)
            return
        wall = time.perf_counter() - start
        yield from self._findings(ctx, cases, outcomes, base, wall, runner, unsafe)

    def _workers(self, cases: list[Case] | None = None) -> int:
        return min(self.params.workers, len(cases)) if cases is not None else self.params.workers

    def prepare(self, ctx: CheckContext) -> None:
        """Start the run's worker pool now, so it loads the model while other checks run."""
        prefetch_shared_pool(ctx, self.params)

    def _run_cases(
        self, ctx: CheckContext, target: Target, cases: list[Case], runner: JournaledRunner
    ) -> dict[str, CaseOutcome]:
        p = self.params
        g = self.gate
        outcomes: dict[str, CaseOutcome] = {}
        bar = ctx.progress.task(f"{ctx.check_id}: hostile inputs", total=len(cases))
        try:
            list(runner.map([("warmup", None)] * runner.workers, p.timeout_s * 4))
            payloads = [("case", c.name) for c in cases]
            for index, job in runner.map(payloads, p.timeout_s, keys=[f"case:{c.name}" for c in cases]):
                case = cases[index]
                if job.status == "ok" and job.value.get("not_applicable"):
                    continue
                # A reader's and a generator's "nothing here" are fair answers to an empty picture
                reader = str((route(target.capabilities, case.kind) or ("",))[0]).startswith(("read", "generate"))
                outcomes[case.name] = classify(
                    case, job, g.min_equivalent_cosine, g.max_equivalent_cer, g.max_reject_rss_mb, reader
                )
                bar.advance()
        finally:
            bar.close()
        return outcomes

    def _findings(
        self,
        ctx: CheckContext,
        cases: list[Case],
        outcomes: dict[str, CaseOutcome],
        base: CorpusBase,
        wall: float,
        runner: JobRunner,
        unsafe: list[str],
    ) -> Iterator[Finding]:
        p = self.params
        g = self.gate
        counts = {k: 0 for k in ("rejected", "handled", "crashed", "hung", "garbage", "error")}
        passed: dict[str, str] = {}
        for case in cases:
            outcome = outcomes.get(case.name)
            if outcome is None:
                continue
            counts[outcome.outcome] += 1
            if outcome.outcome == "error":
                yield self.finding(
                    ctx,
                    Verdict.ERROR,
                    f"{case.name}: could not be judged -- {outcome.detail}"[:300],
                    severity=Severity.MEDIUM,
                    message=outcome.detail,
                    evidence={"case": case.name, "input": case.description},
                )
                continue
            if not outcome.failed(list(g.fail_on)):
                passed[case.name] = f"{outcome.outcome}: {outcome.detail}"[:200]
                continue
            yield self._failure(ctx, case, outcome, base)
        int32 = [c for c in cases if c.over_int32 and c.name in outcomes]
        metrics: dict[str, float] = {f"n_{k}": float(v) for k, v in counts.items()}
        metrics.update(
            {
                "n_cases": float(len(outcomes)),
                "n_passed": float(len(passed)),
                "wall_seconds": wall,
                "worker_replacements": float(runner.replacements),
                "worker_load_seconds_max": max(runner.load_seconds, default=0.0),
                "int32_cases_rejected": float(sum(outcomes[c.name].outcome == "rejected" for c in int32)),
                "int32_cases": float(len(int32)),
            }
        )
        gate = f"no input may end {', '.join(g.fail_on)}; valid inputs must match the correct picture (cosine >= "
        gate += f"{g.min_equivalent_cosine:g}, CER <= {g.max_equivalent_cer:g})"
        yield self.finding(
            ctx,
            Verdict.PASS,
            f"{len(passed)} of {len(outcomes)} hostile inputs rejected cleanly or handled correctly"
            + (f" ({len(outcomes) - len(passed)} failed, listed separately)" if len(passed) < len(outcomes) else ""),
            metrics=metrics,
            gate=gate,
            evidence={
                "isolation": p.isolation,
                "workers": p.workers,
                "timeout_s": p.timeout_s,
                "memory_limit_mb": p.memory_limit_mb,
                "base_caption": base.caption,
                "base_shape": list(base.image.shape),
                "passed": passed,
                "not_run_in_process": unsafe,
            },
        )

    def _failure(self, ctx: CheckContext, case: Case, outcome: CaseOutcome, base: CorpusBase) -> Finding:
        label = "rejected late" if outcome.late_rejection else outcome.outcome
        evidence: dict[str, Any] = {
            "case": case.name,
            "group": case.group,
            "input": case.description,
            "expected_behaviour": outcome.expect,
            "outcome": outcome.outcome,
            "detail": outcome.detail,
            "seed": ctx.seed,
            "replay": f"from mmchaos.checks.contract.contract import replay; replay(target, {case.name!r})",
        }
        if outcome.stderr.strip():
            evidence["worker_stderr"] = outcome.stderr
        if outcome.error is not None:
            evidence["error"] = {
                "type": outcome.error.type,
                "code": outcome.error.code,
                "message": outcome.error.message,
            }
            evidence["traceback"] = outcome.error.traceback
        if case.declared_shape is not None:
            evidence["declared_shape"] = list(case.declared_shape)
            evidence["declared_elements"] = case.declared_elements
            evidence["int32_wrapped_product"] = int32_wrapped_product(case.declared_shape)
            evidence["over_int32"] = bool((case.declared_elements or 0) > INT32_MAX)
        artifacts: list[Artifact] = []
        try:
            payload = case.build(base)
            artifacts.append(payload_artifact(case, payload, ctx.check_id))
            evidence["input_artifact"] = artifacts[0].name
            if payload.note:
                evidence["note"] = payload.note
        except Exception as exc:  # evidence is best effort; the finding stands without it
            evidence["artifact_error"] = repr(exc)
        return self.finding(
            ctx,
            Verdict.FAIL,
            f"{case.name}: {label} -- {outcome.detail}"[:300],
            severity=_SEVERITY.get(outcome.outcome, Severity.MEDIUM) if not outcome.late_rejection else Severity.MEDIUM,
            metrics=outcome.metrics,
            gate=f"{outcome.expect}: "
            + ("typed rejection" if outcome.expect == "reject" else "typed rejection or correct answer"),
            message=f"{case.description}: {outcome.detail}"[:1000],
            suggestion=_SUGGESTION["rejected" if outcome.late_rejection else outcome.outcome]
            if outcome.outcome in _SUGGESTION
            else "",
            evidence=evidence,
            artifacts=artifacts,
        )


def pool_spec(target: Target, p: Any) -> WorkerSpec:
    """The run's shared worker pool for a check whose params carry ``target_options``,
    ``threads_per_worker`` and ``memory_limit_mb`` as contract's do (contract, contract_fuzz)."""
    return shared_spec(target, p.target_options, threads=p.threads_per_worker, memory_limit_mb=p.memory_limit_mb)


def prefetch_shared_pool(ctx: CheckContext, p: Any) -> None:
    """Start the run's worker pool now (a check's ``prepare``), so it loads the model while other checks run.

    Not with a Ray executor: the checks' workers run on the actors then (started on first use)."""
    if p.isolation == "subprocess":
        ctx.prefetch_isolated(pool_spec(unwrap(ctx.target), p), workers=p.workers, start_timeout=p.start_timeout_s)


def worker_load_error(check: AnyCheck, ctx: CheckContext, target: Target, exc: TargetLoadError) -> Finding:
    """The finding of a check whose target cannot be loaded in a worker process by its URI."""
    return check.finding(
        ctx,
        Verdict.ERROR,
        f"the target cannot be loaded in a worker process by its URI {target.uri!r}",
        severity=Severity.HIGH,
        message=exc.message,
        suggestion="give a loadable URI (and target_options), or set isolation: inprocess",
    )
