"""Prometheus metric families shared per registry, and OpenTelemetry spans when it is installed.

Registry choice: a guard built without ``registry`` gets a private ``CollectorRegistry`` of its
own (``guard.registry``), so building guards has no global side effect and tests never collide.
A server passes one registry (its own, or ``prometheus_client.REGISTRY``) to every guard and
serves it on ``/metrics``. Guards of one kind share metric families in a registry and tell their
series apart by the ``name`` label; a newer guard of one kind and name takes over the series of an
older one. Hot-path guards (breaker, SLO) keep plain integer counts under the lock they already
hold and are read by a collector at scrape time, so a call pays no metric lock.

Tracing: ``tracer=None`` means "OpenTelemetry's global tracer if ``opentelemetry-api`` is
importable, else nothing"; ``tracer=False`` turns tracing off; any other value is used as the
tracer. opentelemetry is imported on first use only.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from types import ModuleType
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mmchaos.errors import ConfigError

__all__ = [
    "FamilySpec",
    "add_event",
    "family",
    "fire",
    "join_collector",
    "recording",
    "resolve_registry",
    "resolve_tracer",
    "span",
]

log = logging.getLogger("mmchaos.guard")

M = TypeVar("M", Counter, Gauge, Histogram)

_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, Counter | Gauge | Histogram]] = (
    weakref.WeakKeyDictionary()
)
_FAMILIES_LOCK = threading.Lock()


def resolve_registry(registry: CollectorRegistry | None) -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True) if registry is None else registry


def family(
    registry: CollectorRegistry,
    cls: type[M],
    name: str,
    documentation: str,
    labelnames: Sequence[str],
    **kwargs: Any,
) -> M:
    """The metric family ``name`` in ``registry``, created on first use and shared after."""
    with _FAMILIES_LOCK:
        families = _FAMILIES.setdefault(registry, {})
        existing = families.get(name)
        if existing is not None:
            if type(existing) is not cls or tuple(existing._labelnames) != tuple(labelnames):
                raise ConfigError(f"metric {name} already exists in this registry with another shape")
            return existing
        try:
            metric = cls(name, documentation, labelnames, registry=registry, **kwargs)
        except ValueError as exc:  # registered there by code other than mmchaos.guard
            raise ConfigError(f"cannot register metric {name}: {exc}") from exc
        families[name] = metric
        return metric


class FamilySpec:
    """One metric family a guard kind exposes through :func:`join_collector`."""

    __slots__ = ("documentation", "kind", "labels", "name")

    def __init__(self, name: str, documentation: str, kind: str, labels: Sequence[str]) -> None:
        self.name, self.documentation, self.kind, self.labels = name, documentation, kind, tuple(labels)

    def empty(self) -> CounterMetricFamily | GaugeMetricFamily:
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labels)


class _GuardCollector(Collector):
    """Reads every live guard of one kind at scrape time; guards supply ``metric_samples()``."""

    def __init__(self, specs: Sequence[FamilySpec]) -> None:
        self.specs = tuple(specs)
        self.members: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()

    def describe(self) -> list[Metric]:
        return [spec.empty() for spec in self.specs]

    def collect(self) -> list[Metric]:
        families = {spec.name: spec.empty() for spec in self.specs}
        for guard in list(self.members.values()):
            for name, labels, value in guard.metric_samples():
                families[name].add_metric(labels, value)
        return list(families.values())


_COLLECTORS: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, _GuardCollector]] = weakref.WeakKeyDictionary()


def join_collector(registry: CollectorRegistry, kind: str, specs: Sequence[FamilySpec], guard: Any) -> None:
    """Expose ``guard.metric_samples()`` in ``registry`` under the families of its ``kind``."""
    with _FAMILIES_LOCK:
        collectors = _COLLECTORS.setdefault(registry, {})
        collector = collectors.get(kind)
        if collector is None:
            collector = _GuardCollector(specs)
            try:
                registry.register(collector)
            except ValueError as exc:  # a family name registered there by other code
                raise ConfigError(f"cannot register the {kind} metrics: {exc}") from exc
            collectors[kind] = collector
        collector.members[guard.name] = guard


@functools.cache
def _trace_api() -> ModuleType | None:
    try:
        return importlib.import_module("opentelemetry.trace")
    except ImportError:
        return None


def resolve_tracer(tracer: object = None) -> Any:
    """The tracer to use, or None when tracing is off or opentelemetry-api is not installed."""
    if tracer is False:
        return None
    if tracer is None or tracer is True:
        api = _trace_api()
        return None if api is None else api.get_tracer("mmchaos.guard")
    return tracer


def span(tracer: Any, name: str, attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[Any]:
    """A span made current for the block, or a no-op context when ``tracer`` is None."""
    if tracer is None:
        return nullcontext(None)
    ctx: AbstractContextManager[Any] = tracer.start_as_current_span(name, attributes=attributes)
    return ctx


def recording() -> bool:
    """Whether the current OpenTelemetry span records (a traced request is in progress)."""
    api = _trace_api()
    return api is not None and bool(api.get_current_span().is_recording())


def add_event(name: str, attributes: Mapping[str, Any]) -> None:
    """Add an event to the current span, if any span is recording."""
    api = _trace_api()
    if api is not None:
        current = api.get_current_span()
        if current.is_recording():
            current.add_event(name, attributes=dict(attributes))


def fire(callbacks: Sequence[Callable[[Any], object]], event: object) -> None:
    """Call each callback with ``event``; a failing callback is logged, never raised."""
    for callback in callbacks:
        try:
            callback(event)
        except Exception:
            log.exception("mmchaos guard callback %r failed on %r", callback, event)
