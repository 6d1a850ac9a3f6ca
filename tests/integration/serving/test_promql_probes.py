"""PromQL steady-state probes in a real serving experiment (the reference server on loopback, the
fault proxy, a latency fault): the clean server passes them; a server whose breaker gauge is stuck
at ``open`` while it serves fine (its SLO holds, its telemetry lies) deviates after the method.
The same scrapes give the same verdict through promtool's engine and the Python subset.

The stuck gauge is made with a monkeypatch of the breaker's scrape-time samples: the breaker itself
keeps working, only what ``/metrics`` says about it is wrong, which no real server here can be made
to do otherwise.
"""

from __future__ import annotations

from typing import Any

import pytest

from mmchaos.chaos.promql import Scrape, evaluate, holds, parse_scrape
from mmchaos.chaos.promql_probe import evaluate_probes, promtool_path
from mmchaos.chaos.spec import PromQLSpec
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Finding, Verdict
from mmchaos.guard.breaker import CircuitBreaker
from tests.fakes.targets import HashEmbedTarget
from tests.support import run_check_class
from tests.support.serving import FAST

pytestmark = pytest.mark.integration

DATA = make_shapes(16, seed=3)
BREAKER_CLOSED = 'sum without (state) (mmchaos_breaker_state{name="model",state="closed"}) == 1'
REQUESTS_MOVE = 'sum(increase(mmchaos_server_requests_total{endpoint="/v1/embeddings"}[30s])) > 0'
PROBES = [
    {"expr": BREAKER_CLOSED, "name": "breaker closed"},
    {"expr": REQUESTS_MOVE, "name": "requests counted", "phases": ["during", "after"]},
]


def faults(engine: str) -> tuple[Finding, dict[str, Any]]:
    from mmchaos.checks.serving.faults import ServingFaults

    params = {
        **FAST,
        "faults": ["latency"],
        "levels": ["moderate"],
        "fault_s": 0.4,
        "promql": {"engine": engine, "scrape_interval_s": 0.1, "probes": PROBES},
    }
    findings = run_check_class(ServingFaults, HashEmbedTarget(), params, data=DATA)
    [f] = [f for f in findings if "journal" in f.evidence]
    return f, f.evidence["journal"]


def engines() -> list[str]:
    return ["python", "promtool"] if promtool_path() is not None else ["python"]


@pytest.mark.check_contract("serving_faults", "clean")
@pytest.mark.parametrize("engine", engines())
def test_a_clean_server_holds_its_promql_probes_before_during_and_after(engine: str) -> None:
    f, journal = faults(engine)
    assert f.verdict == Verdict.PASS, f.title
    states = journal["steady_states"]
    results = [*states["before"]["promql"], *states["during"][0]["promql"], *states["after"]["promql"]]
    names = ["breaker closed", "breaker closed", "requests counted", "breaker closed", "requests counted"]
    assert [r["name"] for r in results] == names
    assert all(r["holds"] and r["engine"] == engine for r in results), results
    assert journal["experiment"]["promql"]["scrapes"] >= 3


@pytest.mark.check_contract("serving_faults", "broken")
@pytest.mark.parametrize("engine", engines())
def test_a_breaker_gauge_stuck_open_fails_the_probe_though_the_slo_holds(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = CircuitBreaker.metric_samples

    def stuck_open(self: CircuitBreaker) -> list[tuple[str, list[str], float]]:
        out = []
        for fam, labels, value in real(self):
            if fam == "mmchaos_breaker_state":
                value = 1.0 if labels[-1] == "open" else 0.0
            out.append((fam, labels, value))
        return out

    monkeypatch.setattr(CircuitBreaker, "metric_samples", stuck_open)
    f, journal = faults(engine)
    after = journal["steady_states"]["after"]
    assert f.verdict == Verdict.FAIL, f.title
    assert [p["tolerance_met"] for p in after["probes"]] == [True, True], "the SLO itself held"
    assert not after["steady_state_met"] and "PromQL probes did not hold: breaker closed" in after["why"]
    assert journal["deviated"]
    held = {r["name"]: r["holds"] for r in after["promql"]}
    assert held == {"breaker closed": False, "requests counted": True}


def _frozen_and_moving() -> tuple[list[Scrape], list[Scrape]]:
    def text(n: float) -> str:
        return (
            "# TYPE mmchaos_server_requests counter\n"
            f'mmchaos_server_requests_total{{endpoint="/v1/embeddings",status="200"}} {n}\n'
            "# TYPE mmchaos_breaker_state gauge\n"
            'mmchaos_breaker_state{name="model",state="closed"} 1.0\n'
            'mmchaos_breaker_state{name="model",state="open"} 0.0\n'
        )

    moving = [parse_scrape(i * 0.25, text(5.0 * i)) for i in range(12)]
    frozen = [parse_scrape(i * 0.25, text(5.0 if i else 0.0)) for i in range(12)]
    return moving, frozen


@pytest.mark.skipif(promtool_path() is None, reason="promtool is not installed (Debian: apt-get install prometheus)")
def test_promtool_and_the_subset_agree_on_the_same_scrapes() -> None:
    moving, frozen = _frozen_and_moving()
    exprs = [
        REQUESTS_MOVE.replace("30s", "1s"),
        BREAKER_CLOSED,
        "sum(rate(mmchaos_server_requests_total[2s])) > 10",
        'mmchaos_breaker_state{state="open"} == 1',
        "absent(mmchaos_nothing_total)",
    ]
    for expr in exprs:
        for name, got in (("moving", moving), ("frozen", frozen)):
            spec = PromQLSpec.model_validate(
                {"engine": "promtool", "scrape_interval_s": 0.25, "probes": [{"expr": expr}]}
            )
            [r] = evaluate_probes(spec, got, "after")
            assert r["error"] is None, r
            assert r["holds"] == holds(evaluate(expr, got)), (expr, name)
    spec = PromQLSpec.model_validate({"engine": "promtool", "probes": [{"expr": "sum(rate(x[1s]) offset"}]})
    [r] = evaluate_probes(spec, moving, "after")
    assert not r["holds"] and "promtool refused" in r["error"]
