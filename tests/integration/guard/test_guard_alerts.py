"""The guard alert rules (breaker open, drift alarm, model-load mismatch): ``promtool check rules``
accepts the file they share with the burn-rate rules, and ``promtool test rules`` fires each alert on
the series a broken server exports and not on a healthy one's."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from mmchaos.guard import BurnRateSLO, guard_alert_group, serving_rules_yaml
from tests.support.guard_slo import PROMTOOL

pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)"
)

INTERVAL_S = 15


def _values(*runs: tuple[float, int]) -> str:
    """An input series' values from (value, count) runs, one sample per interval."""
    return " ".join(f"{v:g}" for v, n in runs for _ in range(n))


def _series(metric: str, **labels: str) -> str:
    body = ",".join(f'{k}="{v}"' for k, v in {"instance": "a:8000", "job": "mmchaos", **labels}.items())
    return f"{metric}{{{body}}}"


def _expected(alert: str, **labels: str) -> dict[str, Any]:
    """The alert as promtool reports it: the rule's labels, the series' labels and the annotations
    rendered (only ``{{ $labels.x }}`` is used in them)."""
    rule = next(r for r in guard_alert_group()["rules"] if r["alert"] == alert)
    all_labels = {"instance": "a:8000", "job": "mmchaos", **labels, **rule["labels"]}

    def render(text: str) -> str:
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: all_labels.get(m.group(1), ""), text)

    return {
        "exp_labels": all_labels,
        "exp_annotations": {k: render(v) for k, v in rule["annotations"].items()},
    }


def _at(minutes: float) -> str:
    return f"{round(minutes * 60)}s"


def _promtool(tmp_path: Path, input_series: list[dict[str, str]], cases: list[dict[str, Any]]) -> str:
    rules = tmp_path / "rules.yml"
    rules.write_text(serving_rules_yaml([BurnRateSLO(name="server", objective=0.999, registry=CollectorRegistry())]))
    check = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = {
        "rule_files": [rules.name],
        "evaluation_interval": f"{INTERVAL_S}s",
        "tests": [{"interval": f"{INTERVAL_S}s", "input_series": input_series, "alert_rule_test": cases}],
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    result = subprocess.run(
        [PROMTOOL, "test", "rules", "tests.yml"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    return ("" if result.returncode == 0 else "FAILED\n") + result.stdout + result.stderr


def test_the_rules_file_holds_the_guard_alerts_next_to_the_burn_rate_alerts() -> None:
    slo = BurnRateSLO(name="server", objective=0.999, registry=CollectorRegistry())
    groups = yaml.safe_load(serving_rules_yaml([slo]))["groups"]
    assert [g["name"] for g in groups] == ["mmchaos-guards", "mmchaos-slo-server"]
    alerts = {r["alert"] for g in groups for r in g["rules"] if "alert" in r}
    assert alerts == {
        "MMChaosCircuitBreakerOpen",
        "MMChaosDriftAlarm",
        "MMChaosModelLoadMismatch",
        "MMChaosSLOErrorBudgetBurn",
    }


def test_promtool_fires_each_guard_alert_on_a_broken_server_only(tmp_path: Path) -> None:
    # 10 minutes healthy (40 samples), then 10 more minutes (40) with:
    # breaker "model" stuck out of closed, flapping open <-> half_open (it must keep pending, then fire);
    # breaker "fast" open for 30 s only, then closed again (a breaker doing its job: never fires);
    # drift on the image modality from minute 10; text never drifts;
    # instance b:8000 started with a mismatched model (counter 1), a:8000 did not (0).
    flap_open = [(1, 3), (0, 1)] * 10
    flap_half = [(0, 3), (1, 1)] * 10
    state, drift, mismatch_total = "mmchaos_breaker_state", "mmchaos_drift_alarm", "mmchaos_model_load_mismatch_total"
    series = [
        {"series": _series(state, name="model", state="closed"), "values": _values((1, 40), (0, 40))},
        {"series": _series(state, name="model", state="open"), "values": _values((0, 40), *flap_open)},
        {"series": _series(state, name="model", state="half_open"), "values": _values((0, 40), *flap_half)},
        {"series": _series(state, name="fast", state="closed"), "values": _values((1, 40), (0, 2), (1, 38))},
        {"series": _series(state, name="fast", state="open"), "values": _values((0, 40), (1, 2), (0, 38))},
        {"series": _series(drift, name="server", modality="image"), "values": _values((0, 40), (1, 40))},
        {"series": _series(drift, name="server", modality="text"), "values": _values((0, 80))},
        {"series": _series(mismatch_total), "values": _values((0, 80))},
        {"series": _series(mismatch_total, instance="b:8000"), "values": _values((1, 80))},
    ]  # fmt: skip
    breaker = _expected("MMChaosCircuitBreakerOpen", name="model")
    mismatch = _expected("MMChaosModelLoadMismatch", instance="b:8000")
    cases = [
        {"eval_time": _at(9), "alertname": "MMChaosCircuitBreakerOpen", "exp_alerts": []},
        {"eval_time": _at(9), "alertname": "MMChaosDriftAlarm", "exp_alerts": []},
        # pending, not firing: out of closed for only 30 s of its 1 m
        {"eval_time": _at(10.5), "alertname": "MMChaosCircuitBreakerOpen", "exp_alerts": []},
        {"eval_time": _at(11.5), "alertname": "MMChaosCircuitBreakerOpen", "exp_alerts": [breaker]},
        {"eval_time": _at(19), "alertname": "MMChaosCircuitBreakerOpen", "exp_alerts": [breaker]},
        {"eval_time": _at(11), "alertname": "MMChaosDriftAlarm",
         "exp_alerts": [_expected("MMChaosDriftAlarm", name="server", modality="image")]},
        {"eval_time": _at(1), "alertname": "MMChaosModelLoadMismatch", "exp_alerts": [mismatch]},
        {"eval_time": _at(19), "alertname": "MMChaosModelLoadMismatch", "exp_alerts": [mismatch]},
        {"eval_time": _at(19), "alertname": "MMChaosSLOErrorBudgetBurn", "exp_alerts": []},
    ]  # fmt: skip
    out = _promtool(tmp_path, series, cases)
    assert not out.startswith("FAILED"), out


def test_promtool_reports_an_alert_the_series_do_not_fire(tmp_path: Path) -> None:
    """The harness can fail: expecting a breaker alert on a breaker that stayed closed is reported."""
    series = [{"series": _series("mmchaos_breaker_state", name="model", state="closed"), "values": _values((1, 40))}]
    cases = [
        {
            "eval_time": _at(9),
            "alertname": "MMChaosCircuitBreakerOpen",
            "exp_alerts": [_expected("MMChaosCircuitBreakerOpen", name="model")],
        }
    ]
    out = _promtool(tmp_path, series, cases)
    assert out.startswith("FAILED") and "MMChaosCircuitBreakerOpen" in out, out


def test_the_alerts_read_the_series_a_real_server_exports(tmp_path: Path) -> None:
    """The rules' metric names are the ones ``mmchaos serve`` exports: scrapes of a real server that
    started with a model it was not pinned to (instance b:8000) and of a clean one (a:8000), fed to
    promtool, fire the load-mismatch alert for b only and no breaker alert for either."""
    import httpx

    from mmchaos.chaos.promql import Scrape, parse_scrape
    from mmchaos.chaos.promql_probe import promtool_input
    from mmchaos.server import ServerConfig, ServerThread
    from tests.fakes.server_targets import ControlledTarget
    from tests.fakes.targets import HashEmbedTarget

    def scrape(srv: ServerThread, instance: str, n: int) -> list[Scrape]:
        out = []
        with httpx.Client(base_url=srv.url) as c:
            for i in range(n):
                got = parse_scrape(i * INTERVAL_S, c.get("/metrics").text)
                extra = {("instance", instance), ("job", "mmchaos")}
                out.append(Scrape(got.t, {frozenset(k | extra): v for k, v in got.samples.items()}))
        return out

    pinned = ServerConfig(expected_fingerprint={"weights": "some-other-weights"})
    with ServerThread(HashEmbedTarget()) as clean, ServerThread(ControlledTarget(), pinned) as bad:
        with httpx.Client(base_url=clean.url) as c:
            assert c.post("/v1/embeddings", json={"input": "a"}).status_code == 200
        scrapes = [
            Scrape(a.t, {**a.samples, **b.samples})
            for a, b in zip(scrape(clean, "a:8000", 5), scrape(bad, "b:8000", 5), strict=True)
        ]
    series, last_s = promtool_input(scrapes, INTERVAL_S)
    names = {s["series"].split("{")[0] for s in series}
    assert {"mmchaos_breaker_state", "mmchaos_model_load_mismatch_total"} <= names
    mismatch = _expected("MMChaosModelLoadMismatch", instance="b:8000")
    at = f"{round(last_s)}s"
    cases = [
        {"eval_time": at, "alertname": "MMChaosModelLoadMismatch", "exp_alerts": [mismatch]},
        {"eval_time": at, "alertname": "MMChaosCircuitBreakerOpen", "exp_alerts": []},
        {"eval_time": at, "alertname": "MMChaosDriftAlarm", "exp_alerts": []},
    ]
    out = _promtool(tmp_path, series, cases)
    assert not out.startswith("FAILED"), out
