"""``metrics_exposure``: are the signals an incident needs on ``/metrics``, and do they move?

Scrape ``/metrics`` before and after a little traffic (good texts and images, a malformed request)
and check the expected series exist and move: request latency (per modality where exported), guard
states, error answers by code.

Servers name their metrics differently, so the expectations come from naming conventions: the
reference server's ``mmchaos_*``, vLLM's ``vllm:*``, prometheus-fastapi-instrumentator's
``http_*`` and OpenTelemetry's HTTP semantic conventions. A convention applies when its
request-latency series is on ``/metrics``; a server that exports none of them fails.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from mmchaos.chaos.budget import ErrorInspector, RequestLedger, budgeted_transports
from mmchaos.chaos.deployment import Deployment
from mmchaos.chaos.experiment import jsonable
from mmchaos.chaos.payloads import image_request_body, png_data_url
from mmchaos.chaos.spec import BudgetSpec, Spec
from mmchaos.checks.base import Check, CheckContext, CheckGate, Params
from mmchaos.checks.evidence import png_bytes
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.server.config import ServerConfig
from mmchaos.targets.base import Capability
from mmchaos.targets.openai_forms import ImageForm
from mmchaos.targets.wrappers import unwrap

__all__ = ["CONVENTIONS", "DEFAULT_SERIES", "MetricsExposure", "SeriesSpec", "exposed_conventions"]

_MODALITY_CAP = {"image": Capability.EMBED_IMAGE, "text": Capability.EMBED_TEXT}


_SAMPLE_NAME = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"


class SeriesSpec(Spec):
    """A series that must be on /metrics: a sample name and a subset of its labels."""

    group: Literal["latency", "guards", "errors", "traffic"]
    name: str = Field(pattern=_SAMPLE_NAME, description="sample name, e.g. ..._count, ..._total")
    aliases: list[Annotated[str, Field(pattern=_SAMPLE_NAME)]] = Field(
        default_factory=list, description="other spellings of the same series (the first one present counts)"
    )
    labels: dict[str, str] = Field(default_factory=dict)
    label_match: Literal["exact", "regex"] = Field(
        "exact", description="how label values match: equal, or a regular expression matching the whole value"
    )
    moves: bool = Field(True, description="its value (summed over matching series) grows with the traffic")
    value: float | None = Field(None, description="its value (summed) after the traffic")
    modality: Literal["image", "text"] | None = Field(None, description="only when the target has this modality")
    what: str = ""

    @model_validator(mode="after")
    def _valid_patterns(self) -> SeriesSpec:
        if self.label_match == "regex":
            for key, pattern in self.labels.items():
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ValueError(f"label {key!r}: {pattern!r} is not a regular expression ({exc})") from None
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a sample's labels hold every label this spec asks for."""
        if self.label_match == "exact":
            return all(labels.get(k) == want for k, want in self.labels.items())
        return all(k in labels and re.fullmatch(want, labels[k]) for k, want in self.labels.items())

    def render(self, name: str | None = None) -> str:
        """``name{k="v",...}``, as the evidence shows it."""
        shown = ",".join(f'{k}{"=~" if self.label_match == "regex" else "="}"{v}"' for k, v in self.labels.items())
        return (name or self.name) + ("{" + shown + "}" if self.labels else "")


def _s(group: str, name: str, what: str, **kw: Any) -> SeriesSpec:
    return SeriesSpec.model_validate({"group": group, "name": name, "what": what, **kw})


DEFAULT_SERIES: tuple[SeriesSpec, ...] = (
    _s(
        "latency",
        "mmchaos_server_request_seconds_count",
        "request latency histogram",
        labels={"endpoint": "/v1/embeddings"},
    ),
    _s(
        "latency",
        "mmchaos_server_stage_seconds_count",
        "image model latency",
        labels={"modality": "image", "stage": "model"},
        modality="image",
    ),
    _s(
        "latency",
        "mmchaos_server_stage_seconds_count",
        "image decode latency",
        labels={"modality": "image", "stage": "decode"},
        modality="image",
    ),
    _s(
        "latency",
        "mmchaos_server_stage_seconds_count",
        "text model latency",
        labels={"modality": "text", "stage": "model"},
        modality="text",
    ),
    _s(
        "traffic",
        "mmchaos_server_requests_total",
        "answered requests",
        labels={"endpoint": "/v1/embeddings", "status": "200"},
    ),
    _s("errors", "mmchaos_server_errors_total", "error answers by code", labels={"status": "400"}),
    _s(
        "errors", "mmchaos_server_requests_total", "4xx answers", labels={"endpoint": "/v1/embeddings", "status": "400"}
    ),
    _s("guards", "mmchaos_server_ready", "readiness", moves=False, value=1.0),
    _s(
        "guards",
        "mmchaos_breaker_state",
        "breaker state",
        labels={"name": "model", "state": "closed"},
        moves=False,
        value=1.0,
    ),
    _s(
        "guards",
        "mmchaos_breaker_calls_total",
        "breaker sees model calls",
        labels={"name": "model", "kind": "successful"},
    ),
    _s("guards", "mmchaos_preflight_inputs_total", "preflight checks inputs", labels={"name": "server"}),
    _s("guards", "mmchaos_drift_embeddings_total", "drift monitor is fed", labels={"name": "server"}),
    _s("guards", "mmchaos_slo_requests_total", "SLO counts requests", labels={"slo": "server"}),
)


ConventionName = Literal["mmchaos", "vllm", "fastapi_instrumentator", "opentelemetry"]

CONVENTIONS: dict[ConventionName, tuple[SeriesSpec, ...]] = {
    # The first series of each is its request-latency series: the convention applies when it is exported.
    "mmchaos": DEFAULT_SERIES,
    "vllm": (
        _s("latency", "vllm:e2e_request_latency_seconds_count", "end-to-end request latency (vLLM)"),
        _s("traffic", "vllm:num_requests_running", "requests running (vLLM)", moves=False),
    ),
    "fastapi_instrumentator": (
        _s("latency", "http_request_duration_seconds_count", "request latency (prometheus-fastapi-instrumentator)"),
        _s("traffic", "http_requests_total", "2xx answers", labels={"status": "2xx"}),
        _s("errors", "http_requests_total", "4xx answers", labels={"status": "4xx"}),
    ),
    "opentelemetry": (
        _s(
            "latency",
            "http_server_request_duration_seconds_count",
            "HTTP server request duration (OpenTelemetry)",
            aliases=["http_server_request_duration_count"],
        ),
        _s(
            "traffic",
            "http_server_request_duration_seconds_count",
            "2xx answers",
            aliases=["http_server_request_duration_count"],
            labels={"http_response_status_code": "2[0-9][0-9]"},
            label_match="regex",
        ),
        _s(
            "errors",
            "http_server_request_duration_seconds_count",
            "4xx answers",
            aliases=["http_server_request_duration_count"],
            labels={"http_response_status_code": "4[0-9][0-9]"},
            label_match="regex",
        ),
    ),
}
"""What each server family exports, by its own names (vLLM's /metrics also carries the instrumentator's)."""


class MetricsExposureParams(Params):
    requests_per_modality: int = Field(5, ge=1, le=1000)
    malformed_requests: int = Field(2, ge=0, le=100, description="requests that must be refused (error series)")
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


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""A scrape: (sample name, sorted labels) -> value."""


def _scrape(text: str) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return out


def _total(samples: Samples, spec: SeriesSpec, name: str | None = None) -> float | None:
    """The sum over the series of ``name`` (default: the first of the spec's names present) whose labels match."""
    names = [name] if name is not None else [spec.name, *spec.aliases]
    for n in names:
        values = [v for (sample, labels), v in samples.items() if sample == n and spec.matches(dict(labels))]
        if values:
            return float(sum(values))
    return None


def _present_name(samples: Samples, spec: SeriesSpec) -> str:
    """The first of the spec's names that has a matching series (its main name when none has)."""
    return next((n for n in (spec.name, *spec.aliases) if _total(samples, spec, n) is not None), spec.name)


def exposed_conventions(samples: Samples, accepted: Sequence[ConventionName]) -> list[ConventionName]:
    """The accepted conventions whose request-latency series is exported."""
    return [c for c in accepted if _total(samples, CONVENTIONS[c][0]) is not None]


def _tls(ctx: CheckContext) -> Any:
    """The run's TLS context (httpx would build one per transport, parsing the CA bundle again)."""
    import httpx

    from mmchaos.executors.resources import shared

    with shared(ctx.resources, ("tls_context",), httpx.create_ssl_context, lambda _: None) as (tls, _):
        return tls


class MetricsExposure(Check[MetricsExposureParams, CheckGate]):
    """Scrape /metrics around some traffic: per-modality latency, guard states and error codes exist and move."""

    name = "metrics_exposure"
    step = Step.OBSERVABILITY
    requires = (frozenset({Capability.EMBED_IMAGE}), frozenset({Capability.EMBED_TEXT}))

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
        caps = unwrap(ctx.target).capabilities
        modalities = [m for m in ("image", "text") if _MODALITY_CAP[m] in caps]
        if "image" in modalities and not (len(ctx.dataset) and ctx.dataset.has_images):
            modalities.remove("image")
        sent: dict[str, int] = {}
        statuses: dict[str, int] = {}
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
                before = _scrape(before_resp.text)
                path = f"{dep.prefix}/embeddings"
                bodies = self._bodies(ctx, dep.model, modalities, p.requests_per_modality, dep.image_form)
                for kind, body in bodies:
                    resp = client.post(path, content=body, headers={"Content-Type": "application/json"})
                    sent[kind] = sent.get(kind, 0) + 1
                    statuses[f"{kind}:{resp.status_code}"] = statuses.get(f"{kind}:{resp.status_code}", 0) + 1
                after = _scrape(client.get(p.metrics_path).text)
        finally:
            teardown = dep.close()
        form = dep.image_form if "image" in modalities else None
        yield from self._judge(ctx, p, before, after, modalities, sent, statuses, teardown, ledger.summary(), form)

    def _bodies(
        self, ctx: CheckContext, model: str, modalities: list[str], n: int, form: ImageForm
    ) -> list[tuple[str, bytes]]:
        """The traffic between the scrapes; images in the endpoint's image ``form``."""
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
    ) -> Iterator[Finding]:
        families = sorted({name for name, _ in after})
        detected = exposed_conventions(after, list(p.conventions))
        specs = list(p.expect) if p.expect is not None else [s for c in detected for s in CONVENTIONS[c]]
        context = {
            "conventions": detected,
            "traffic": sent,
            "image_form": image_form,
            "answers": statuses,
            "families_seen": families[:200],
            "budget": budget,
            "teardown": teardown,
        }
        if p.expect is None and not detected:
            looked_for = [CONVENTIONS[c][0].render() for c in p.conventions]
            yield self.finding(
                ctx,
                Verdict.FAIL,
                "latency metrics: no request-latency metric of a known convention on " + p.metrics_path,
                severity=Severity.MEDIUM,
                metrics={"expected": 1.0, "missing_or_static": 1.0},
                gate="the request-latency series of one accepted convention (" + ", ".join(p.conventions) + ")",
                message="looked for " + ", ".join(looked_for),
                suggestion=(
                    "export a request-latency histogram (vLLM, prometheus-fastapi-instrumentator and OpenTelemetry "
                    "names are understood), or give your server's series as `expect:`"
                ),
                evidence=jsonable({"series": [], "looked_for": looked_for, **context}),
            )
        groups: dict[str, list[dict[str, Any]]] = {}
        for spec in specs:
            if spec.modality is not None and spec.modality not in modalities:
                continue
            if spec.group == "errors" and not p.malformed_requests:
                continue
            name = _present_name(after, spec)
            b, a = _total(before, spec, name), _total(after, spec, name)
            problem = None
            if a is None:
                problem = "missing"
            elif spec.moves and ((b is not None and a <= b) or (b is None and a <= 0)):
                problem = f"does not move ({b} -> {a})"
            elif spec.value is not None and abs(a - spec.value) > 1e-9:
                problem = f"is {a}, expected {spec.value}"
            groups.setdefault(spec.group, []).append(
                {"series": spec.render(name), "what": spec.what, "before": b, "after": a, "problem": problem}
            )
        for group, rows in groups.items():
            bad = [r for r in rows if r["problem"]]
            yield self.finding(
                ctx,
                Verdict.FAIL if bad else Verdict.PASS,
                f"{group} metrics: "
                + (
                    "; ".join(f"{r['what']} ({r['series']}) {r['problem']}" for r in bad)
                    if bad
                    else f"{len(rows)} expected series exist and move"
                ),
                severity=Severity.MEDIUM if bad else Severity.INFO,
                metrics={"expected": float(len(rows)), "missing_or_static": float(len(bad))},
                gate="each expected series exists, moves with traffic, and has its expected value",
                message="; ".join(f"{r['series']}: {r['problem']}" for r in bad),
                suggestion=(
                    "without these series an incident is invisible: export per-modality latency, guard states "
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
