"""The mmchaos.guard surface: pinned exports, no torch/transformers, lazy and fast import, metrics
registries that never collide, OpenTelemetry spans when the SDK is installed."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

import mmchaos.guard as guard
from mmchaos.errors import ConfigError, MMChaosError

EXPECTED_ALL = [
    "PREFLIGHT_CODES",
    "SRE_WORKBOOK_ALERTS",
    "BreakerConfig",
    "BreakerState",
    "BurnRateAlert",
    "BurnRateEvent",
    "BurnRateSLO",
    "BurnRateStatus",
    "CallNotPermitted",
    "CheckedImage",
    "CircuitBreaker",
    "CompatibilityError",
    "Difference",
    "DriftAlarm",
    "DriftConfig",
    "DriftMonitor",
    "DriftWindow",
    "InputContract",
    "InputTooLargeError",
    "MalformedInputError",
    "Permit",
    "Preflight",
    "PreflightError",
    "PreflightResult",
    "SLOConfig",
    "SlidingWindowType",
    "StateTransition",
    "UnprocessableInputError",
    "UnsupportedInputError",
    "check_compatible",
    "check_consistency",
    "compare_processors",
    "consistency_issues",
    "fingerprint",
    "guard_alert_group",
    "prometheus_rules_yaml",
    "serving_rules",
    "serving_rules_yaml",
]


def test_public_surface_is_pinned() -> None:
    assert guard.__all__ == EXPECTED_ALL
    for name in EXPECTED_ALL:
        assert getattr(guard, name) is not None
    assert set(EXPECTED_ALL) <= set(dir(guard))
    with pytest.raises(AttributeError):
        guard.NoSuchGuard  # noqa: B018
    assert callable(guard.fingerprint)


def test_error_types_hang_off_the_one_root_with_stable_codes() -> None:
    for cls, code in [
        (guard.PreflightError, "preflight_rejected"),
        (guard.MalformedInputError, "malformed_input"),
        (guard.InputTooLargeError, "input_too_large"),
        (guard.UnsupportedInputError, "unsupported_input"),
        (guard.UnprocessableInputError, "unprocessable_input"),
        (guard.CallNotPermitted, "call_not_permitted"),
        (guard.CompatibilityError, "fingerprint_mismatch"),
    ]:
        assert issubclass(cls, MMChaosError) and cls.code == code


def test_default_registries_are_private_and_shared_ones_do_not_collide() -> None:
    a, b = guard.CircuitBreaker("model"), guard.CircuitBreaker("model")
    assert a.registry is not b.registry  # no global side effect by default
    shared = CollectorRegistry()
    guards = [
        guard.CircuitBreaker("model", registry=shared),
        guard.CircuitBreaker("reranker", registry=shared),
        guard.Preflight(name="api", registry=shared, tracer=False),
        guard.DriftMonitor(name="drift", registry=shared),
        guard.BurnRateSLO(name="avail", objective=0.999, registry=shared),
        guard.BurnRateSLO(name="latency", objective=0.99, latency_threshold=0.5, registry=shared),
    ]
    again = guard.CircuitBreaker("model", registry=shared)  # same name: shares its series
    again.call(len, "x")
    text = generate_latest(shared).decode()
    assert 'mmchaos_breaker_calls_total{kind="successful",name="model"} 1.0' in text
    assert 'mmchaos_breaker_state{name="reranker",state="closed"} 1.0' in text
    assert 'mmchaos_slo_burn_rate{slo="latency",window="5m"} 0.0' in text
    assert len(guards) == 6


def test_series_of_a_collected_guard_leave_the_registry_unless_taken_over() -> None:
    registry = CollectorRegistry()
    first = guard.CircuitBreaker("model", registry=registry)
    guard.CircuitBreaker("tmp", registry=registry)  # dropped at once
    gc.collect()
    text = generate_latest(registry).decode()
    assert 'mmchaos_breaker_state{name="tmp"' not in text
    second = guard.CircuitBreaker("model", registry=registry)
    second.transition_to_open()
    del first
    gc.collect()  # the older guard's finaliser must not remove the newer guard's series
    assert registry.get_sample_value("mmchaos_breaker_state", {"name": "model", "state": "open"}) == 1.0


def test_a_foreign_metric_with_our_name_is_a_config_error() -> None:
    registry = CollectorRegistry()
    Counter("mmchaos_breaker_calls", "someone else's", registry=registry)
    with pytest.raises(ConfigError):
        guard.CircuitBreaker("model", registry=registry)


@pytest.fixture()
def spans() -> Any:
    sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
    export = pytest.importorskip("opentelemetry.sdk.trace.export")
    memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    exporter = memory.InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def test_opentelemetry_spans_when_installed(spans: Any) -> None:
    tracer, exporter = spans
    pf = guard.Preflight(registry=CollectorRegistry(), tracer=tracer)
    breaker = guard.CircuitBreaker("model", registry=CollectorRegistry(), tracer=tracer)
    pf.text("untraced")  # no recording parent span: untraced traffic pays for no span
    breaker.call(len, "untraced")
    assert exporter.get_finished_spans() == ()
    with tracer.start_as_current_span("request"):
        pf.text("hello")
        with pytest.raises(guard.PreflightError):
            pf.text(b"\xff")
        breaker.call(len, "traced")
    finished = {s.name: s for s in exporter.get_finished_spans()}
    assert {"mmchaos.preflight.text", "mmchaos.breaker.call", "request"} <= set(finished)
    names = [s.name for s in exporter.get_finished_spans()]
    assert names.count("mmchaos.breaker.call") == 1 and names.count("mmchaos.preflight.text") == 2
    rejected = [s for s in exporter.get_finished_spans() if s.attributes.get("mmchaos.preflight.code")]
    assert rejected[0].attributes["mmchaos.preflight.code"] == "bad_utf8"
    call = finished["mmchaos.breaker.call"]
    assert call.parent is not None and call.parent.span_id == finished["request"].context.span_id


def test_tracing_can_be_turned_off(spans: Any) -> None:
    tracer, exporter = spans
    pf = guard.Preflight(registry=CollectorRegistry(), tracer=False)
    with tracer.start_as_current_span("request"):
        pf.text("hello")
    assert [s.name for s in exporter.get_finished_spans()] == ["request"]
