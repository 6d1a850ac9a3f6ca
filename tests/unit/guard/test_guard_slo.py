"""BurnRateSLO: each workbook alert fires when its long window has burned enough (and not before),
stops soon after the burning does, memory stays fixed; the Prometheus rules parse, and promtool
(when installed) accepts them and fires the same alerts on the same traffic."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from mmchaos.errors import ConfigError, UsageError
from mmchaos.guard import SRE_WORKBOOK_ALERTS, BurnRateEvent, BurnRateSLO, SLOConfig, prometheus_rules_yaml
from tests.support.guard_slo import MINUTE, PROMTOOL, Clock, Traffic, firing

HOUR = 3600.0

DAY = 86400.0


def make(**kw: Any) -> tuple[BurnRateSLO, Clock, Traffic]:
    clock = Clock()
    slo = BurnRateSLO(name="embeddings", objective=0.999, clock=clock, registry=CollectorRegistry(), **kw)
    return slo, clock, Traffic(slo, clock)


# With a 20x burn (2% errors against a 0.1% budget) after days of clean traffic, the long window
# of an alert with factor f and length L crosses f after f / 20 * L.
@pytest.mark.parametrize("alert", SRE_WORKBOOK_ALERTS, ids=lambda a: f"{a.severity}-{a.long_window:g}s")
def test_each_alert_fires_when_its_long_window_has_burned_enough(alert: Any) -> None:
    slo, clock, traffic = make()
    traffic.run(3 * DAY / MINUTE)
    assert firing(slo) == set()
    due = alert.burn_rate / 20.0 * alert.long_window / MINUTE
    traffic.run(0.93 * due, error_ratio=0.02)
    assert (alert.severity, alert.long_window) not in firing(slo)
    traffic.run(0.14 * due, error_ratio=0.02)
    assert (alert.severity, alert.long_window) in firing(slo)


def test_fast_burn_pages_within_minutes_and_stops_soon_after_the_burning_does() -> None:
    events: list[BurnRateEvent] = []
    slo, clock, traffic = make(on_alert=events.append)
    traffic.run(2 * HOUR / MINUTE)
    traffic.run(4, error_ratio=0.5)  # burn 500: the 1h window passes 14.4x within 2 minutes
    assert ("page", HOUR) in firing(slo)
    assert slo.burn_rate(300.0) > 14.4 and slo.burn_rate(HOUR) > 14.4
    traffic.run(4)
    assert ("page", HOUR) in firing(slo), "still inside the 5 m short window"
    traffic.run(3)
    assert ("page", HOUR) not in firing(slo), "the 5 m window has cleared although the 1 h one still burns"
    assert slo.burn_rate(HOUR) > 14.4
    page = [(e.status.long_window, e.firing) for e in events if e.status.severity == "page"]
    assert page[:2] == [(HOUR, True), (6 * HOUR, True)] and (HOUR, False) in page


def test_latency_slo_counts_slow_and_failed_events_as_bad() -> None:
    slo, clock, _ = make(latency_threshold=0.3)
    slo.record(True, 0.1)
    slo.record(True, 0.5)
    slo.record(False, 0.1)
    clock.now += 1
    assert slo.burn_rate(300.0) == pytest.approx((2 / 3) / 0.001)
    with pytest.raises(UsageError):
        slo.record(True)
    with slo.track():
        pass
    with pytest.raises(RuntimeError), slo.track():
        raise RuntimeError("boom")
    assert slo.registry.get_sample_value("mmchaos_slo_requests_total", {"slo": "embeddings"}) == 5
    assert slo.registry.get_sample_value("mmchaos_slo_errors_total", {"slo": "embeddings"}) == 3


def test_memory_is_fixed_in_the_number_of_events() -> None:
    slo, clock, traffic = make()
    buckets = len(slo._b_total)
    assert buckets == 3 * DAY / 10  # 10 s buckets over the 3 day window
    for _ in range(2000):
        clock.now += 0.5
        slo.record(True)
    traffic.run(10 * DAY / MINUTE / 10)
    assert len(slo._b_total) == buckets
    clock.now += 10 * DAY  # a gap longer than every window resets the counts
    assert slo.burn_rates() == [0.0] * 7


def test_burn_rate_gauges_and_config_errors() -> None:
    slo, clock, traffic = make()
    traffic.run(10, error_ratio=0.1)
    get = slo.registry.get_sample_value
    assert get("mmchaos_slo_burn_rate", {"slo": "embeddings", "window": "5m"}) == pytest.approx(100.0)
    labels = {"slo": "embeddings", "severity": "page", "long_window": "1h", "short_window": "5m"}
    assert get("mmchaos_slo_alert_firing", labels) == 1.0
    assert get("mmchaos_slo_objective", {"slo": "embeddings"}) == 0.999
    for bad in ({"objective": 1.0}, {"objective": 0.99, "name": "bad name"}, {"objective": 0.99, "alerts": []}):
        with pytest.raises(ConfigError):
            BurnRateSLO(**{"name": "x", **bad})
    with pytest.raises(ConfigError):
        SLOConfig.from_yaml(
            "name: x\nobjective: 0.99\nalerts:\n- {severity: page, long_window: 60, short_window: 600, burn_rate: 2}\n"
        )


def rules_for(name: str = "embeddings", **kw: Any) -> dict[str, Any]:
    slo = BurnRateSLO(name=name, objective=0.999, registry=CollectorRegistry(), **kw)
    loaded: dict[str, Any] = yaml.safe_load(slo.prometheus_rules_yaml())
    return loaded


def test_rules_yaml_has_the_recording_rules_and_workbook_alerts() -> None:
    doc = rules_for()
    (group,) = doc["groups"]
    records = {r["record"]: r for r in group["rules"] if "record" in r}
    windows = ["5m", "30m", "1h", "2h", "6h", "1d", "3d"]
    assert list(records) == [f"mmchaos_slo:error_ratio:rate{w}" for w in windows]
    assert records["mmchaos_slo:error_ratio:rate5m"]["expr"] == (
        '(sum(rate(mmchaos_slo_errors_total{slo="embeddings"}[5m])))'
        ' / (sum(rate(mmchaos_slo_requests_total{slo="embeddings"}[5m])))'
    )
    alerts = {r["labels"]["severity"]: r for r in group["rules"] if "alert" in r}
    page, ticket = alerts["page"]["expr"], alerts["ticket"]["expr"]
    assert (
        'mmchaos_slo:error_ratio:rate1h{slo="embeddings"} > (14.4 * 0.001) and '
        'mmchaos_slo:error_ratio:rate5m{slo="embeddings"} > (14.4 * 0.001)'
    ) in page
    assert 'rate6h{slo="embeddings"} > (6 * 0.001) and mmchaos_slo:error_ratio:rate30m' in page
    assert 'rate1d{slo="embeddings"} > (3 * 0.001) and mmchaos_slo:error_ratio:rate2h' in ticket
    assert 'rate3d{slo="embeddings"} > (1 * 0.001) and mmchaos_slo:error_ratio:rate6h' in ticket
    assert page.count("(") == page.count(")") and " or " in page


def test_rules_can_read_other_metrics_and_combine_slos() -> None:
    slo = BurnRateSLO(name="chat", objective=0.99, registry=CollectorRegistry())
    group = slo.prometheus_rule_group(
        errors_expr='sum(rate(http_requests_total{code=~"5.."}[{window}]))',
        total_expr="sum(rate(http_requests_total[{window}]))",
    )
    assert group["rules"][0]["expr"] == (
        '(sum(rate(http_requests_total{code=~"5.."}[5m]))) / (sum(rate(http_requests_total[5m])))'
    )
    other = BurnRateSLO(name="embeddings", objective=0.999, registry=CollectorRegistry())
    doc = yaml.safe_load(prometheus_rules_yaml([slo, other]))
    assert [g["name"] for g in doc["groups"]] == ["mmchaos-slo-chat", "mmchaos-slo-embeddings"]


def test_prometheus_rules_is_a_file_prometheus_loads(tmp_path: Path) -> None:
    """What prometheus_rules() returns, dumped as YAML, is a rules file (promtool refuses a bare group)."""
    slo = BurnRateSLO(name="embeddings", objective=0.999, registry=CollectorRegistry())
    doc = slo.prometheus_rules(total_expr="sum(rate(http_requests_total[{window}]))")
    assert list(doc) == ["groups"]
    [group] = doc["groups"]
    assert group == slo.prometheus_rule_group(total_expr="sum(rate(http_requests_total[{window}]))")
    assert yaml.safe_load(slo.prometheus_rules_yaml()) == slo.prometheus_rules()
    if PROMTOOL is None:
        return
    loadable, bare = tmp_path / "rules.yml", tmp_path / "bare.yml"
    loadable.write_text(yaml.safe_dump(doc))
    bare.write_text(yaml.safe_dump(group))
    check = subprocess.run([PROMTOOL, "check", "rules", str(loadable)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    refused = subprocess.run([PROMTOOL, "check", "rules", str(bare)], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0, "a bare group is not a rules file"


@pytest.mark.parametrize(
    ("count", "latency"),
    [(-95, 0.1), (1.5, 0.1), (True, 0.1), (1, float("nan")), (1, float("inf")), (1, -0.2), (1, "fast")],
)
def test_impossible_events_are_refused_and_leave_the_burn_rate_alone(count: Any, latency: Any) -> None:
    """A negative count pushed the burn rate from 1,000 to 20,000 (and another sequence below zero); a
    NaN latency counted as good, since ``nan > threshold`` is false."""
    slo, clock, _ = make(latency_threshold=0.3)
    slo.record(False, 0.1)
    slo.record(True, 0.1)
    clock.now += 1
    before = slo.burn_rate(300.0)
    with pytest.raises(ConfigError) as caught:
        slo.record(True, latency, count=count)
    assert caught.value.code == "bad_event"
    assert slo.burn_rate(300.0) == before == pytest.approx(0.5 / 0.001)


def test_a_zero_count_and_an_integral_latency_are_events_it_takes() -> None:
    slo, clock, _ = make(latency_threshold=1)
    slo.record(True, 0, count=0)
    slo.record(False, 2, count=3)
    clock.now += 1
    assert slo.burn_rate(300.0) == pytest.approx(1 / 0.001)
