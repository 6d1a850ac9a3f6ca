"""``serving_poison``: malformed, huge and decompression-bomb inputs mixed into good traffic.

One bad request must not take down the others: every good request next to the poison must still
succeed within the SLO, and each poison kind must get a typed 4xx refusal (or, for legitimate large
inputs, a 200), never a 5xx or no answer."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, field_validator

from mmchaos.chaos.budget import PROBE_HEADER
from mmchaos.chaos.experiment import Experiment, jsonable
from mmchaos.chaos.payloads import (
    bomb_png,
    declared_png,
    good_path,
    gradient_jpeg,
    image_request_body,
    png_data_url,
)
from mmchaos.chaos.spec import ServingParams
from mmchaos.chaos.windows import Phase
from mmchaos.checks.base import Check, CheckContext, Gate
from mmchaos.checks.evidence import png_bytes
from mmchaos.checks.serving._common import (
    EMBEDS,
    TRANSPORT_KINDS,
    closest_hint,
    experiment_finding,
    measured,
)
from mmchaos.findings import Artifact, Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability
from mmchaos.targets.openai_forms import ImageForm, chat_body, chat_image_content
from mmchaos.targets.wrappers import unwrap

if TYPE_CHECKING:
    import random

    from mmchaos.chaos.load import LoadRequest, PayloadMix

__all__ = ["POISONS", "PoisonKind", "ServingPoison"]


Outcome = Literal["refused", "any"]


@dataclass(frozen=True)
class PoisonKind:
    name: str
    needs: Capability | None
    outcome: Outcome
    what: str


POISONS: dict[str, PoisonKind] = {
    p.name: p
    for p in (
        PoisonKind("malformed_base64", Capability.EMBED_IMAGE, "refused", "a data: URL whose base64 is invalid"),
        PoisonKind("garbage_image", Capability.EMBED_IMAGE, "refused", "random bytes labelled image/png"),
        PoisonKind("truncated_png", Capability.EMBED_IMAGE, "refused", "the first half of a valid PNG"),
        PoisonKind("declared_huge", Capability.EMBED_IMAGE, "refused", "a PNG header declaring 30000x30000 RGB"),
        PoisonKind("decompression_bomb", Capability.EMBED_IMAGE, "refused", "a 1-bit PNG bomb, KBs -> GBs"),
        PoisonKind("huge_image", Capability.EMBED_IMAGE, "any", "a legitimate large image within the limits"),
        PoisonKind("huge_text", Capability.EMBED_TEXT, "any", "a text of about 1 MB"),
        PoisonKind("invalid_json", None, "refused", "a body that is not JSON"),
        PoisonKind("wrong_schema", None, "refused", "JSON of the wrong shape"),
    )
}


class ServingPoisonParams(ServingParams):
    poisons: list[str] = Field(default_factory=lambda: list(POISONS))
    poison_share: float = Field(0.2, gt=0.0, lt=1.0, description="share of the requests that are poison")
    poison_s: float = Field(3.0, gt=0.0, le=3600.0, description="seconds of mixed traffic")
    huge_side: int = Field(3072, ge=64, le=16384, description="side of the legitimate large image")
    declared_side: int = Field(30000, ge=1000, le=1_000_000)
    bomb_side: int = Field(20000, ge=1000, le=200_000)
    huge_text_bytes: int = Field(1_000_000, ge=1000, le=50_000_000)

    @field_validator("poisons")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in POISONS:
                raise ValueError(f"unknown poison {name!r}{closest_hint(name, list(POISONS))}")
        if not value:
            raise ValueError("give at least one poison")
        return value


class ServingPoisonGate(Gate):
    min_good_success_rate: float = Field(1.0, ge=0.0, le=1.0, description="of good requests during the poison")
    good_within_slo: bool = Field(True, description="good requests also keep the SLO's p99")


def _poison_urls(p: ServingPoisonParams, ctx: CheckContext) -> dict[str, str]:
    """The ``data:`` URL of each image poison kind asked for."""
    rng = ctx.rng("poison")
    sample = ctx.dataset[0] if len(ctx.dataset) and ctx.dataset.has_images else None
    png = png_bytes(sample.load_image()) if sample is not None else png_bytes(np.full((64, 64, 3), 90, np.uint8))
    out: dict[str, str] = {}
    for name in p.poisons:
        if name == "malformed_base64":
            out[name] = "data:image/png;base64,iVBORw0KGgo!!not*base64@@"
        elif name == "garbage_image":
            out[name] = png_data_url(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
        elif name == "truncated_png":
            out[name] = png_data_url(png[: len(png) // 2])
        elif name == "declared_huge":
            out[name] = png_data_url(declared_png(p.declared_side, p.declared_side))
        elif name == "decompression_bomb":
            out[name] = png_data_url(bomb_png(p.bomb_side))
        elif name == "huge_image":
            out[name] = png_data_url(gradient_jpeg(p.huge_side), "image/jpeg")
    return out


def _huge_text(p: ServingPoisonParams) -> str:
    words = ("lorem", "ipsum", "dolor", "sit", "amet")
    return " ".join(words[i % 5] for i in range(p.huge_text_bytes // 6))


def _poison_bodies(
    p: ServingPoisonParams, model: str, ctx: CheckContext, *, form: ImageForm, chat: bool = False
) -> dict[str, bytes]:
    """One request body per poison kind, in ``p.poisons`` order; the images in the deployment's
    image ``form`` (``/embeddings``), or, with ``chat`` (a generative target), each in an
    ``image_url`` part beside a question in a chat message."""
    import json

    def chat_request(content: Any) -> bytes:
        return json.dumps(chat_body(model, content, max_tokens=8, temperature=0)).encode()

    urls = _poison_urls(p, ctx)
    field = "messages" if chat else "input"
    out: dict[str, bytes] = {}
    for name in p.poisons:
        if name in urls:
            out[name] = (
                chat_request(chat_image_content([urls[name]], "What is this?"))
                if chat
                else image_request_body(form, model, urls[name])
            )
        elif name == "huge_text":
            text = _huge_text(p)
            out[name] = chat_request(text) if chat else json.dumps({"model": model, "input": text}).encode()
        elif name == "invalid_json":
            tail = '"messages": [{"role": "user", "content": "unter' if chat else '"input": ["unterminated'
            out[name] = b'{"model": "' + model.encode() + b'", ' + tail.encode()
        elif name == "wrong_schema":
            out[name] = json.dumps({"model": model, field: {"nested": [1, 2, 3]}}).encode()
    return out


def _poison_mix(good: PayloadMix, bodies: Mapping[str, bytes], share: float, path: str) -> PayloadMix:
    """Good traffic with a ``share`` of poison, the poison kinds taken in turn.

    The first ``2 * len(kinds)`` requests alternate good and poison, so every kind is sent early
    even when a slow server answers only a few requests in the phase; after that each request is
    poison with probability ``share``.
    """
    from mmchaos.chaos.load import LoadRequest, PayloadMix

    kinds = list(bodies)
    sent = [0, 0]  # requests made, poison requests made

    def poison(n: int) -> LoadRequest:
        kind = kinds[n % len(kinds)]
        headers = {"Content-Type": "application/json", PROBE_HEADER: kind}
        return LoadRequest(kind, path, "POST", content=bodies[kind], headers=headers)

    def factory(rng: random.Random) -> LoadRequest:
        n = sent[0]
        sent[0] += 1
        early = sent[1] < len(kinds)
        if (early and n % 2 == 1) or (not early and rng.random() < share):
            sent[1] += 1
            return poison(sent[1] - 1)
        return good.pick(rng)

    return PayloadMix([factory])


class ServingPoison(Check[ServingPoisonParams, ServingPoisonGate]):
    """Malformed, huge and bomb inputs mixed into good traffic: every good request must still succeed."""

    name = "serving_poison"
    step = Step.SERVING
    requires = (*EMBEDS, frozenset({Capability.GENERATE}))

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        g = self.gate
        caps = set(unwrap(ctx.target).capabilities)
        chat = Capability.GENERATE in caps and not caps & {Capability.EMBED_IMAGE, Capability.EMBED_TEXT}
        if chat:  # a chat request carries images and text alike
            caps |= {Capability.EMBED_IMAGE, Capability.EMBED_TEXT}
        kinds = [k for k in p.poisons if POISONS[k].needs is None or POISONS[k].needs in caps]
        if Capability.EMBED_IMAGE in caps and not ctx.dataset.has_images:
            kinds = [k for k in kinds if POISONS[k].needs != Capability.EMBED_IMAGE]
        bar = ctx.progress.task(f"{ctx.check_id}: poison", total=3)
        findings: list[Finding] = []
        # uvicorn closes a connection after a poison request's 500: a request that went out on it next was
        # never read, so it is sent again (counted) instead of counted against good traffic or the next poison.
        ex = Experiment(
            ctx, p, title="poison isolation", description="poison inputs mixed into good traffic; good must succeed",
            resend_stale=True,
        )  # fmt: skip
        mixed: Phase | None = None
        settle: float | None = None
        try:
            with ex:
                path = good_path(ex.dep)
                made = _poison_bodies(p, ex.dep.model, ctx, form=ex.dep.image_form, chat=chat)
                bodies = {k: v for k, v in made.items() if k in kinds}
                ex.warmup()
                before = ex.steady_state("before")
                bar.advance()
                if before.met(ex.slo) and not ex.stopped and bodies:
                    mix = _poison_mix(ex.mix, bodies, p.poison_share, path)
                    mixed = ex.phase(
                        "poison", seconds=p.poison_s, guarded=True, mix=mix, track=lambda r: r.kind not in bodies
                    )
                    bar.advance()
                    if not ex.stopped:
                        settle = ex.recover("poison:recovery")[1]
                    if not ex.stopped:
                        ex.steady_state("after")
                bar.advance()
        finally:
            bar.close()
        if mixed is not None and mixed.result is not None:
            findings.append(self._isolation(ctx, ex, mixed, before.p99_ms, set(bodies), g, settle))
            for kind in bodies:
                findings.append(self._kind(ctx, ex, mixed, kind, bodies[kind]))
        yield from findings
        yield experiment_finding(self, ctx, ex, title="poison isolation experiment", extra={"poisons": kinds})

    def _isolation(
        self,
        ctx: CheckContext,
        ex: Experiment,
        ph: Phase,
        baseline_p99: float | None,
        poison: set[str],
        g: ServingPoisonGate,
        settle: float | None,
    ) -> Finding:
        assert ph.result is not None
        good = [r for r in ph.result.records if r.kind not in poison and r.error != "client_shed"]
        ok = [r for r in good if r.ok]
        rate = len(ok) / len(good) if good else 0.0
        lat = sorted(r.latency * 1000.0 for r in ok)
        p99 = round(float(np.percentile(lat, 99)), 3) if lat else None
        failures: dict[str, int] = {}
        first_failure: float | None = None
        for r in good:
            if not r.ok:
                label = f"{r.error}:{r.status}" if r.status else str(r.error)
                failures[label] = failures.get(label, 0) + 1
                first_failure = r.start if first_failure is None else min(first_failure, r.start)
        problems = []
        if rate < g.min_good_success_rate:
            problems.append(f"{len(good) - len(ok)} of {len(good)} good requests failed next to poison")
        if g.good_within_slo and (p99 is None or p99 > ex.slo.p99_ms):
            problems.append(f"good requests' p99 {p99} ms is over the SLO's {ex.slo.p99_ms:g} ms")
        aborted = ex.aborted is not None and "poison" in ex.aborted
        if aborted:
            problems.append(f"aborted: {ex.aborted}")
        verdict = Verdict.FAIL if problems else Verdict.PASS
        poison_requests = sum(1 for r in ph.result.records if r.kind in poison)
        title = (
            "; ".join(problems)
            if problems
            else f"{len(good)} good requests all succeeded next to {poison_requests} poison requests"
        )
        evidence: dict[str, Any] = {
            "good_requests": len(good),
            "good_ok": len(ok),
            "good_failures": failures,
            "first_good_failure_s": first_failure,
            "poison_requests": poison_requests,
            "resent_after_closed_connection": ph.result.resent,
            "baseline_p99_ms": baseline_p99,
            "settled_after_s": settle,
            "phase": ph.summary(ex.slo, windows=True),
            "seed": ex.seed,
        }
        if aborted:
            evidence["aborted"] = True
            evidence["reason"] = ex.aborted
        return self.finding(
            ctx,
            verdict,
            f"isolation: {title}",
            severity=Severity.CRITICAL
            if rate < g.min_good_success_rate
            else Severity.HIGH
            if problems
            else Severity.INFO,
            metrics={
                "good_success_rate": rate,
                # a latency not measured (no good request answered) is left out, never a placeholder
                **measured(good_p99_ms=p99, baseline_p99_ms=baseline_p99),
                "good_requests": float(len(good)),
                "poison_requests": float(poison_requests),
            },
            gate=f"good success rate >= {g.min_good_success_rate:.2%}"
            + (f" and good p99 <= {ex.slo.p99_ms:g} ms" if g.good_within_slo else ""),
            message="; ".join(problems),
            suggestion=(
                "one bad input must never reach shared state: validate and size-check inputs before the model "
                "(the server's Preflight does), decode in the request's own worker, and keep a model failure "
                "from poisoning the engine for everyone"
                if problems
                else ""
            ),
            evidence=jsonable(evidence),
        )

    def _kind(self, ctx: CheckContext, ex: Experiment, ph: Phase, kind: str, body: bytes) -> Finding:
        assert ph.result is not None
        spec = POISONS[kind]
        mine = [r for r in ph.result.records if r.kind == kind and r.error != "client_shed"]
        outcomes = ex.inspector.outcomes(ph.label, kind)
        accepted = sum(1 for r in mine if r.ok)
        untyped = sum(n for k, n in outcomes.items() if k.endswith(":untyped"))
        fivexx = sum(n for k, n in outcomes.items() if k.startswith("5"))
        transport = sum(1 for r in mine if r.error in TRANSPORT_KINDS)
        bad_body = sum(1 for r in mine if r.error == "bad_body")
        problems = []
        if not mine:
            return self.finding(
                ctx, Verdict.SKIPPED, f"poison {kind}: none was sent in the time given", evidence={"poison": kind}
            )
        if fivexx:
            problems.append(f"{fivexx} answered 5xx (a server failure, not a refusal)")
        if transport:
            problems.append(f"{transport} got no HTTP answer (timeout/reset)")
        if untyped:
            problems.append(f"{untyped} refusals were not OpenAI error JSON")
        if spec.outcome == "refused" and accepted:
            problems.append(f"{accepted} were accepted (200) instead of refused")
        if bad_body:
            problems.append(f"{bad_body} got a 200 without a valid embedding")
        verdict = Verdict.FAIL if problems else Verdict.PASS
        shown = ", ".join(f"{k} x{n}" for k, n in sorted(outcomes.items())) or "200"
        artifacts = (
            [Artifact(f"{ctx.check_id}-{kind}.json", body, "application/json")]
            if problems and len(body) <= 256_000
            else []
        )
        return self.finding(
            ctx,
            verdict,
            f"poison {kind}: " + ("; ".join(problems) if problems else f"answered {shown}"),
            severity=Severity.HIGH if fivexx or transport else Severity.MEDIUM if problems else Severity.INFO,
            metrics={
                "sent": float(len(mine)),
                "accepted": float(accepted),
                "answers_5xx": float(fivexx),
                "no_answer": float(transport),
                "untyped": float(untyped),
            },
            gate="a typed 4xx refusal" if spec.outcome == "refused" else "a 200 or a typed 4xx, never 5xx or no answer",
            message="; ".join(problems),
            suggestion=(
                "refuse bad inputs at the edge with a typed 4xx (Preflight: size, declared pixels and element "
                "count before decoding, decompression ratio)"
                if problems
                else ""
            ),
            evidence={
                "poison": kind,
                "what": spec.what,
                "expected": spec.outcome,
                "outcomes": outcomes,
                "body_bytes": len(body),
            },
            artifacts=artifacts,
        )
