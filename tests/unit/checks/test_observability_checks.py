"""Step 7: the drift monitor's power on a target's embeddings, and the metrics a server exports.

Each check passes a correct target and fails a deliberately broken one: a target whose state leaks
between calls (its embeddings drift on clean traffic), a monitor tuned blind, a server whose guards
are off (its guard metrics never move).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from mmchaos.checks.observability.drift_detection import DriftDetection
from mmchaos.checks.observability.metrics_exposure import MetricsExposure
from mmchaos.findings import Finding, Verdict
from tests.fakes.targets import HashEmbedTarget
from tests.support.observability_checks import SMALL, run


def test_drift_detection_fails_a_blind_monitor() -> None:
    blind = {"alpha": 60.0, "alpha_max": 60.0, "rff_features": 0}
    params = {**SMALL, "perturbations": ["keyboard_typo"], "clean_stream": "resample", "drift": blind}
    findings = run(DriftDetection, HashEmbedTarget(), params)
    typo = next(f for f in findings if f.evidence.get("perturbation") == "keyboard_typo")
    assert typo.verdict == Verdict.FAIL and typo.metrics["delay_s5"] == -1
    assert "missed at severity 5" in typo.title and "MMD" in typo.suggestion
    sight = run(DriftDetection, HashEmbedTarget(), {**params, "drift": {}})  # the server's default monitor
    assert next(f for f in sight if f.evidence.get("perturbation") == "keyboard_typo").verdict == Verdict.PASS


class _ThirdPartyServer:
    """A real OpenAI-compatible embeddings server on loopback (stdlib HTTP) whose /metrics follows one
    third-party convention only, written with prometheus_client as those servers do. Not a mock: it
    answers real HTTP, embeds texts, refuses bad input with 400, and counts what it served."""

    def __init__(self, convention: str) -> None:
        import json
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

        registry = CollectorRegistry()
        running = Gauge("vllm:num_requests_running", "Requests running.", ["model_name"], registry=registry)
        running.labels("m").set(0)
        observe: Any
        if convention == "vllm":
            e2e = Histogram("vllm:e2e_request_latency_seconds", "E2E latency.", ["model_name"], registry=registry)

            def observe(route: str, status: int, seconds: float) -> None:
                if status == 200:
                    e2e.labels("m").observe(seconds)

        elif convention == "sglang":
            sg = Histogram("sglang:e2e_request_latency_seconds", "E2E latency.", ["model_name"], registry=registry)
            Gauge("sglang:num_running_reqs", "Requests running.", ["model_name"], registry=registry).labels("m").set(0)

            def observe(route: str, status: int, seconds: float) -> None:
                if status == 200:
                    sg.labels("m").observe(seconds)

        elif convention == "fastapi_instrumentator":
            dur = Histogram("http_request_duration_seconds", "Latency.", ["handler", "method"], registry=registry)
            total = Counter("http_requests_total", "Requests.", ["handler", "method", "status"], registry=registry)

            def observe(route: str, status: int, seconds: float) -> None:
                dur.labels(route, "POST").observe(seconds)
                total.labels(route, "POST", f"{status // 100}xx").inc()

        elif convention in ("opentelemetry", "opentelemetry_unitless"):
            name = "http_server_request_duration" + ("_seconds" if convention == "opentelemetry" else "")
            dur = Histogram(
                name,
                "Duration of HTTP server requests.",
                ["http_request_method", "http_route", "http_response_status_code"],
                registry=registry,
            )

            def observe(route: str, status: int, seconds: float) -> None:
                dur.labels("POST", route, str(status)).observe(seconds)

        else:  # no request-latency metric at all: only a gauge

            def observe(route: str, status: int, seconds: float) -> None:
                pass

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self._send(200, generate_latest(registry), "text/plain; version=0.0.4")
                elif self.path == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode())
                else:
                    self._send(404, b'{"error": {"message": "not found", "type": "NotFound", "code": 404}}')

            def do_POST(self) -> None:
                started = time.perf_counter()
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    texts = json.loads(body)["input"]
                    texts = [texts] if isinstance(texts, str) else texts
                    if not texts or not all(isinstance(t, str) for t in texts):
                        raise ValueError("input must be a string or a non-empty list of strings")
                except (ValueError, KeyError, TypeError) as exc:
                    msg = {"object": "error", "message": str(exc), "type": "BadRequestError", "code": 400}
                    observe("/v1/embeddings", 400, time.perf_counter() - started)
                    self._send(400, json.dumps(msg).encode())
                    return
                data = [
                    {"object": "embedding", "index": i, "embedding": [float(len(t) % 7), 1.0, 0.5]}
                    for i, t in enumerate(texts)
                ]
                observe("/v1/embeddings", 200, time.perf_counter() - started)
                self._send(200, json.dumps({"object": "list", "data": data, "model": "m"}).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="third-party-server", daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def run_against(convention: str, params: dict[str, Any] | None = None) -> list[Finding]:
    from mmchaos.targets.openai_http import OpenAITarget

    with _ThirdPartyServer(convention) as url:
        target = OpenAITarget.connect(url, capabilities=["embed_text"])
        try:
            return run(MetricsExposure, target, {"requests_per_modality": 3, **(params or {})})
        finally:
            target.close()


@pytest.mark.parametrize(
    "convention", ["vllm", "sglang", "fastapi_instrumentator", "opentelemetry", "opentelemetry_unitless"]
)
def test_metrics_exposure_passes_a_server_with_another_naming_convention(convention: str) -> None:
    findings = run_against(convention)
    assert findings and all(f.verdict == Verdict.PASS for f in findings), [(f.title, f.message) for f in findings]
    latency = next(f for f in findings if f.title.startswith("latency"))
    assert latency.evidence["conventions"] == [convention.removesuffix("_unitless")]
    assert all(r["after"] and r["after"] > 0 for r in latency.evidence["series"])


def test_metrics_exposure_fails_a_server_without_a_request_latency_metric() -> None:
    findings = run_against("none")
    latency = next(f for f in findings if f.title.startswith("latency"))
    assert latency.verdict == Verdict.FAIL and "request-latency" in latency.title
    assert "vllm:num_requests_running" in latency.evidence["families_seen"]
    assert latency.evidence["conventions"] == []


def test_metrics_exposure_conventions_are_configurable() -> None:
    # only the mmchaos names are accepted: a vLLM server has no request-latency metric of those
    [latency] = [f for f in run_against("vllm", {"conventions": ["mmchaos"]}) if f.title.startswith("latency")]
    assert latency.verdict == Verdict.FAIL
    with pytest.raises(ValueError, match="conventions"):
        MetricsExposure.Params.model_validate({"conventions": ["vllm", "tgi"]})
    with pytest.raises(ValueError, match="conventions"):
        MetricsExposure.Params.model_validate({"conventions": []})
    with pytest.raises(ValueError, match="extra"):
        MetricsExposure.Params.model_validate({"convention": "vllm"})
    bad_regex = {"group": "errors", "name": "x_total", "labels": {"code": "4[0-9"}, "label_match": "regex"}
    with pytest.raises(ValueError, match="not a regular expression"):
        MetricsExposure.Params.model_validate({"expect": [bad_regex]})
