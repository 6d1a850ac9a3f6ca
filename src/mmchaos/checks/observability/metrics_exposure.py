"""``metrics_exposure``: are the signals an incident needs on ``/metrics``, and do they move?

Scrape ``/metrics`` before and after a little traffic and check the expected series exist and move.
An embedding target gets good texts and images and a malformed request: request latency (per
modality where exported), guard states, error answers by code. A target that only generates gets
chat traffic, plain and streamed (images where the data has them), and requests that must be
refused: end-to-end latency, time to first token, per-token latency, the running/waiting queue,
and token counters that must grow by at least the tokens the answers' ``usage`` counted.

The expected series come from naming conventions (:mod:`.metric_series`): the reference server's
``mmchaos_*``, vLLM's ``vllm:*``, SGLang's ``sglang:*``, prometheus-fastapi-instrumentator's ``http_*``
and OpenTelemetry's HTTP semantic conventions. A convention applies when its request-latency series
is on ``/metrics``; a server that exports none of them fails.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import Field

from mmchaos.chaos.budget import ErrorInspector, RequestLedger, budgeted_transports
from mmchaos.chaos.deployment import Deployment
from mmchaos.chaos.experiment import jsonable
from mmchaos.chaos.payloads import chats, image_request_body, png_data_url
from mmchaos.chaos.spec import BudgetSpec
from mmchaos.checks.base import Check, CheckContext, CheckGate, Params
from mmchaos.checks.evidence import png_bytes
from mmchaos.checks.observability.chat_traffic import ChatTally, chat_requests, send_chat
from mmchaos.checks.observability.metric_series import (
    CHAT_CONVENTIONS,
    CONVENTIONS,
    DEFAULT_SERIES,
    ConventionName,
    Samples,
    SeriesSpec,
    exposed_conventions,
    present_name,
    scrape,
    total,
)
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.server.config import ServerConfig
from mmchaos.targets.base import Capability
from mmchaos.targets.openai_forms import CHAT_IMAGE_FORM, ImageForm
from mmchaos.targets.wrappers import unwrap

__all__ = [
    "CHAT_CONVENTIONS",
    "CONVENTIONS",
    "DEFAULT_SERIES",
    "MetricsExposure",
    "SeriesSpec",
    "exposed_conventions",
]

_MODALITY_CAP = {"image": Capability.EMBED_IMAGE, "text": Capability.EMBED_TEXT}


class MetricsExposureParams(Params):
    requests_per_modality: int = Field(
        5, ge=1, le=1000, description="requests per modality (chat: plain and as many streamed)"
    )
    malformed_requests: int = Field(2, ge=0, le=100, description="requests that must be refused (error series)")
    chat_max_tokens: int = Field(8, ge=2, le=256, description="max_tokens of each chat request")
    metrics_path: str = Field("/metrics", pattern=r"^/")
    conventions: list[ConventionName] = Field(
        default_factory=lambda: list(CONVENTIONS),
        min_length=1,
        description="naming conventions accepted: the series of each one whose request latency is exported",
    )
    expect: list[SeriesSpec] | None = Field(
        None, description="your own expected series, instead of the conventions' (null: use the conventions)"
    )
    budget: BudgetSpec = Field(
        default_factory=lambda: BudgetSpec.model_validate({"max_requests": 500, "max_rate": 50, "max_duration_s": 60})
    )
    request_timeout_s: float = Field(10.0, gt=0.0)
    server: ServerConfig = Field(
        default_factory=lambda: ServerConfig.model_validate({}),
        description="the reference server started for an in-process target (ignored for openai:)",
    )


def _tls(ctx: CheckContext) -> Any:
    """The run's TLS context (httpx would build one per transport, parsing the CA bundle again)."""
    import httpx

    from mmchaos.executors.resources import shared

    with shared(ctx.resources, ("tls_context",), httpx.create_ssl_context, lambda _: None) as (tls, _):
        return tls


class MetricsExposure(Check[MetricsExposureParams, CheckGate]):
    """Scrape /metrics around embeddings or chat traffic: latency, queue, tokens, guards, errors exist and move."""

    name = "metrics_exposure"
    step = Step.OBSERVABILITY
    requires = (
        frozenset({Capability.EMBED_IMAGE}),
        frozenset({Capability.EMBED_TEXT}),
        frozenset({Capability.GENERATE}),
    )

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        import httpx

        p = self.params
        # The run's reference server when the serving checks already started one with this config.
        dep = Deployment(
            ctx.target, p.server, proxy=False, loopback_only=p.budget.loopback_only, resources=ctx.resources
        )
        ledger = RequestLedger(p.budget)
        inspector = ErrorInspector(phase="metrics")
        _, sync_cls = budgeted_transports()
        inner = unwrap(ctx.target)
        chat = chats(dep)
        has_images = bool(len(ctx.dataset) and ctx.dataset.has_images)
        if chat:
            gaps: dict[str, str] = getattr(inner, "untested_modalities", dict)()  # openai: chat refused images?
            images = has_images and "image chat" not in gaps
            modalities = ["image", "text"] if images else ["text"]
        else:
            modalities = [m for m in ("image", "text") if _MODALITY_CAP[m] in inner.capabilities]
            if "image" in modalities and not has_images:
                modalities.remove("image")
        sent: dict[str, int] = {}
        statuses: dict[str, int] = {}
        tally: ChatTally | None = None
        teardown: dict[str, Any] = {}
        try:
            dep.start()
            transport = sync_cls(httpx.HTTPTransport(verify=_tls(ctx)), ledger, inspector)
            with httpx.Client(
                base_url=dep.root, transport=transport, timeout=p.request_timeout_s, headers=dep.auth, trust_env=False
            ) as client:
                before_resp = client.get(p.metrics_path)
                if before_resp.status_code != 200:
                    yield self._no_metrics(ctx, dep, before_resp.status_code)
                    return
                before = scrape(before_resp.text)
                if chat:
                    requests = chat_requests(
                        dep.model, ctx.dataset, p.requests_per_modality, p.malformed_requests, p.chat_max_tokens,
                        "image" in modalities,
                    )  # fmt: skip
                    tally = send_chat(client, f"{dep.prefix}/chat/completions", requests)
                    statuses = tally.statuses
                    for key, n in statuses.items():
                        kind = key.split(":", 1)[0]
                        sent[kind] = sent.get(kind, 0) + n
                else:
                    path = f"{dep.prefix}/embeddings"
                    bodies = self._bodies(ctx, dep.model, modalities, p.requests_per_modality, dep.image_form)
                    for kind, body in bodies:
                        resp = client.post(path, content=body, headers={"Content-Type": "application/json"})
                        sent[kind] = sent.get(kind, 0) + 1
                        statuses[f"{kind}:{resp.status_code}"] = statuses.get(f"{kind}:{resp.status_code}", 0) + 1
                after = scrape(client.get(p.metrics_path).text)
        finally:
            teardown = dep.close()
        form = (CHAT_IMAGE_FORM if chat else dep.image_form) if "image" in modalities else None
        yield from self._judge(
            ctx, p, before, after, modalities, sent, statuses, teardown, ledger.summary(), form, tally
        )

    def _bodies(
        self, ctx: CheckContext, model: str, modalities: list[str], n: int, form: ImageForm
    ) -> list[tuple[str, bytes]]:
        """The embeddings traffic between the scrapes; images in the endpoint's image ``form``."""
        import json

        p = self.params
        out: list[tuple[str, bytes]] = []
        data = ctx.dataset
        for i in range(n):
            s = data[i % len(data)] if len(data) else None
            if "text" in modalities:
                text = (s.caption or s.text or s.label) if s is not None else None
                out.append(("text", json.dumps({"model": model, "input": text or "a photo"}).encode()))
            if "image" in modalities and s is not None:
                out.append(("image", image_request_body(form, model, png_data_url(png_bytes(s.load_image())))))
        for i in range(p.malformed_requests):
            if i % 2 == 0 and "image" in modalities:
                malformed = png_data_url(b"\x89PNG\r\n\x1a\nnot really")
                out.append(("malformed", image_request_body(form, model, malformed)))
            else:
                out.append(("malformed", json.dumps({"model": model, "input": []}).encode()))
        return out

    @staticmethod
    def _problem(spec: SeriesSpec, b: float | None, a: float | None, need: int | None) -> str | None:
        """What is wrong with one series after the traffic (None: nothing)."""
        if a is None:
            return "missing"
        grew = a - (b or 0.0)
        if need is not None:
            if need > 0 and grew < need:
                return f"grew by {grew:g}, less than the {need} {str(spec.at_least).replace('_', ' ')} of the traffic"
        elif spec.moves and ((b is not None and a <= b) or (b is None and a <= 0)):
            return f"does not move ({b} -> {a})"
        if spec.value is not None and abs(a - spec.value) > 1e-9:
            return f"is {a}, expected {spec.value}"
        return None

    def _no_metrics(self, ctx: CheckContext, dep: Deployment, status: int) -> Finding:
        p = self.params
        return self.finding(
            ctx,
            Verdict.FAIL,
            f"no metrics: GET {p.metrics_path} answered {status}",
            severity=Severity.HIGH,
            gate="a Prometheus /metrics endpoint",
            message=f"{dep.root}{p.metrics_path} answered HTTP {status}",
            suggestion="export Prometheus metrics (latency per modality, guard states, error codes) on /metrics",
            evidence={"url": f"{dep.root}{p.metrics_path}", "status": status},
        )

    def _judge(
        self,
        ctx: CheckContext,
        p: MetricsExposureParams,
        before: Samples,
        after: Samples,
        modalities: list[str],
        sent: dict[str, int],
        statuses: dict[str, int],
        teardown: dict[str, Any],
        budget: dict[str, Any],
        image_form: str | None = None,
        tally: ChatTally | None = None,
    ) -> Iterator[Finding]:
        families = sorted({name for name, _ in after})
        table = CONVENTIONS if tally is None else CHAT_CONVENTIONS
        detected = exposed_conventions(after, list(p.conventions), table)
        specs = list(p.expect) if p.expect is not None else [s for c in detected for s in table[c]]
        amounts: Mapping[str, int] = tally.as_dict() if tally is not None else {}
        context = {
            "traffic_kind": "chat" if tally is not None else "embeddings",
            "conventions": detected,
            "traffic": sent,
            "image_form": image_form,
            "answers": statuses,
            "families_seen": families[:200],
            "budget": budget,
            "teardown": teardown,
        }
        if tally is not None:
            context["amounts"] = {
                **amounts,
                "tokens": "summed from the answers' usage (streams asked for it with stream_options.include_usage)",
            }
        if p.expect is None and not detected:
            looked_for = [table[c][0].render() for c in p.conventions]
            yield self.finding(
                ctx,
                Verdict.FAIL,
                "latency metrics: no request-latency metric of a known convention on " + p.metrics_path,
                severity=Severity.MEDIUM,
                metrics={"expected": 1.0, "missing_or_static": 1.0},
                gate="the request-latency series of one accepted convention (" + ", ".join(p.conventions) + ")",
                message="looked for " + ", ".join(looked_for),
                suggestion=(
                    "export a request-latency histogram (vLLM, SGLang, prometheus-fastapi-instrumentator and "
                    "OpenTelemetry names are understood), or give your server's series as `expect:`"
                ),
                evidence=jsonable({"series": [], "looked_for": looked_for, **context}),
            )
        groups: dict[str, list[dict[str, Any]]] = {}
        for spec in specs:
            if spec.modality is not None and spec.modality not in modalities:
                continue
            if spec.group == "errors" and not p.malformed_requests:
                continue
            name = present_name(after, spec)
            b, a = total(before, spec, name), total(after, spec, name)
            need = amounts.get(spec.at_least) if spec.at_least is not None else None
            row: dict[str, Any] = {"series": spec.render(name), "what": spec.what, "before": b, "after": a}
            if need is not None:
                row["at_least"] = {"of": spec.at_least, "value": need}
            row["problem"] = self._problem(spec, b, a, need)
            row["must_move"] = bool(need) if need is not None else spec.moves
            groups.setdefault(spec.group, []).append(row)
        what = (
            "time to first token, per-token and end-to-end latency, running and waiting requests, prompt and "
            "generated token counters"
            if tally is not None
            else "per-modality latency"
        )
        for group, rows in groups.items():
            bad = [r for r in rows if r["problem"]]
            yield self.finding(
                ctx,
                Verdict.FAIL if bad else Verdict.PASS,
                f"{group} metrics: "
                + ("; ".join(f"{r['what']} ({r['series']}) {r['problem']}" for r in bad) if bad else _shown(rows)),
                severity=Severity.MEDIUM if bad else Severity.INFO,
                metrics={"expected": float(len(rows)), "missing_or_static": float(len(bad))},
                gate="each expected series exists, moves with traffic (by at least what it sent, where it counts "
                "requests or tokens), and has its expected value",
                message="; ".join(f"{r['series']}: {r['problem']}" for r in bad),
                suggestion=(
                    f"without these series an incident is invisible: export {what}, guard states "
                    "(breaker, readiness, drift, SLO) and error answers by code, and keep the guards on the "
                    "request path"
                    if bad
                    else ""
                ),
                evidence=jsonable({"series": rows, **context}),
            )
        if teardown and not teardown.get("clean", True):
            yield self.finding(
                ctx,
                Verdict.FAIL,
                "teardown: something was left running",
                severity=Severity.HIGH,
                message=str(teardown),
                evidence=jsonable({"teardown": teardown}),
            )


def _shown(rows: list[dict[str, Any]]) -> str:
    """A passing group's title: what was required of its series, and no more."""
    moving = sum(r["must_move"] for r in rows)
    counted = sum("at_least" in r and r["at_least"]["value"] > 0 for r in rows)
    if moving == len(rows):
        out = f"{len(rows)} expected series exist and move"
    elif not moving:
        out = f"{len(rows)} expected series exist"
    else:
        out = f"{len(rows)} expected series exist, the {moving} that count traffic move"
    return out + (f" ({counted} by at least what the traffic sent)" if counted else "")
