"""The PromQL subset mmchaos evaluates without promtool, on scrapes built by hand: each operator the
docs list, the probes a clean server passes and a broken one fails, and clear refusals outside it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mmchaos.chaos.promql import PromQLError, Scrape, evaluate, holds, parse_scrape
from mmchaos.chaos.promql_probe import evaluate_probes, promtool_input
from mmchaos.chaos.spec import PromQLSpec, ServingParams

BREAKER_CLOSED = 'sum without (state) (mmchaos_breaker_state{state="closed"}) == 1'
REQUESTS_MOVE = "sum(increase(mmchaos_server_requests_total[3s])) > 0"


def text(requests: float, state: str) -> str:
    states = "\n".join(
        f'mmchaos_breaker_state{{name="model",state="{s}"}} {1.0 if s == state else 0.0}'
        for s in ("closed", "open", "half_open")
    )
    return (
        "# TYPE mmchaos_server_requests counter\n"
        f'mmchaos_server_requests_total{{endpoint="/v1/embeddings",status="200"}} {requests}\n'
        f'mmchaos_server_requests_total{{endpoint="/v1/embeddings",status="503"}} 1.0\n'
        "# TYPE mmchaos_breaker_state gauge\n" + states + "\n"
    )


def scrapes(requests: list[float], states: list[str]) -> list[Scrape]:
    return [parse_scrape(float(i), text(r, s)) for i, (r, s) in enumerate(zip(requests, states, strict=True))]


CLEAN = scrapes([0, 10, 20, 30, 40], ["closed"] * 5)
STUCK_OPEN = scrapes([0, 10, 20, 30, 40], ["closed", "open", "half_open", "open", "open"])
FROZEN = scrapes([0, 10, 10, 10, 10], ["closed"] * 5)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("sum(rate(mmchaos_server_requests_total[10s]))", 10.0),  # (40 - 0) / 4 s; the 503 series is flat
        ('rate(mmchaos_server_requests_total{status="200"}[2500ms])', 10.0),
        ("sum(increase(mmchaos_server_requests_total[10s])) / 2", 20.0),
        ('sum by (status) (mmchaos_server_requests_total{status=~"5.."})', 1.0),
        ('count(mmchaos_breaker_state{name="model"})', 3.0),
        ('max without (state) (mmchaos_breaker_state{state!="closed"})', 0.0),
        ('min_over_time(mmchaos_breaker_state{state="closed"}[10s])', 1.0),
        ('changes(mmchaos_server_requests_total{status="200"}[10s])', 4.0),
        ("-sum(mmchaos_server_requests_total) + 1", -40.0),
        ("2 * 3 + 1 > bool 6", 1.0),
    ],
)
def test_the_subset_computes_what_prometheus_would(expr: str, expected: float) -> None:
    value = evaluate(expr, CLEAN)
    got = value if isinstance(value, float) else next(iter(value.values()))
    assert got == pytest.approx(expected)


def test_counter_resets_and_comparisons_filter_and_set_operators() -> None:
    reset = scrapes([5, 8, 2, 4], ["closed"] * 4)
    assert evaluate('increase(mmchaos_server_requests_total{status="200"}[10s])', reset) == {
        frozenset({("endpoint", "/v1/embeddings"), ("status", "200")}): 3.0 + 2.0 + 2.0
    }
    assert evaluate('mmchaos_breaker_state{state="open"} == 1', CLEAN) == {}
    both = evaluate('mmchaos_breaker_state{state="closed"} == 1 and mmchaos_breaker_state{state="closed"}', CLEAN)
    assert len(both) == 1  # type: ignore[arg-type]
    assert evaluate("absent(mmchaos_nothing)", CLEAN) == {frozenset(): 1.0}
    assert not holds(evaluate("absent(mmchaos_breaker_state)", CLEAN))


def test_a_clean_server_passes_the_probes() -> None:
    assert holds(evaluate(BREAKER_CLOSED, CLEAN)) and holds(evaluate(REQUESTS_MOVE, CLEAN))


def test_a_stuck_breaker_and_a_frozen_counter_fail_the_probes() -> None:
    assert not holds(evaluate(BREAKER_CLOSED, STUCK_OPEN))
    assert holds(evaluate(REQUESTS_MOVE, STUCK_OPEN))
    assert not holds(evaluate(REQUESTS_MOVE, FROZEN)), "no request counted in the last 3 s"
    assert holds(evaluate(BREAKER_CLOSED, FROZEN))


def test_evaluate_probes_names_the_engine_and_what_failed() -> None:
    spec = PromQLSpec.model_validate(
        {"engine": "python", "probes": [{"expr": BREAKER_CLOSED, "name": "breaker closed"}, {"expr": REQUESTS_MOVE}]}
    )
    results = evaluate_probes(spec, STUCK_OPEN, "after")
    assert [(r["name"], r["holds"], r["engine"]) for r in results] == [
        ("breaker closed", False, "python"),
        (REQUESTS_MOVE, True, "python"),
    ]
    assert evaluate_probes(spec, [], "after")[0]["error"] == "no scrape of /metrics succeeded"
    only_after = PromQLSpec.model_validate({"engine": "python", "probes": [{"expr": "up", "phases": ["after"]}]})
    assert evaluate_probes(only_after, CLEAN, "during") == []


@pytest.mark.parametrize(
    "expr",
    [
        "rate(mmchaos_server_requests_total)",  # an instant vector into rate()
        "topk(3, mmchaos_server_requests_total)",  # outside the subset
        "a + on(job) b",
        "mmchaos_server_requests_total[5s]",
        "sum(",
        "{}",
        "1 > 0",
    ],
)
def test_expressions_outside_the_subset_are_refused_clearly(expr: str) -> None:
    with pytest.raises(PromQLError):
        evaluate(expr, CLEAN)


def test_a_python_engine_spec_refuses_an_expression_it_cannot_evaluate_up_front() -> None:
    with pytest.raises(ValidationError, match="outside the subset"):
        ServingParams.model_validate({"promql": {"engine": "python", "probes": [{"expr": "topk(1, x)"}]}})
    # promtool takes all of PromQL: judged when it runs
    ServingParams.model_validate({"promql": {"engine": "promtool", "probes": [{"expr": "topk(1, x)"}]}})
    assert ServingParams.model_validate({}).promql.probes == ()


def test_scrapes_become_promtool_input_on_a_grid_with_stale_markers() -> None:
    a = frozenset({("__name__", "x"), ("l", 'q"v')})
    got = [Scrape(0.0, {a: 1.0}), Scrape(0.26, {a: 2.0}), Scrape(0.74, {}), Scrape(1.01, {a: float("inf")})]
    series, last = promtool_input(got, 0.25)
    assert series == [{"series": 'x{l="q\\"v"}', "values": "1.0 2.0 _ stale Inf"}]
    assert last == pytest.approx(1.0)


def test_label_values_unescape_as_go_strings_do() -> None:
    s = [Scrape(0.0, {frozenset({("__name__", "x"), ("path", "/v1/é"), ("code", "503")}): 1.0})]
    assert evaluate('x{path="/v1/é"}', s)
    assert evaluate('x{code=~"\\\\d+"}', s), "a regex backslash is written \\\\ inside the string"
    with pytest.raises(PromQLError, match="unknown escape"):
        evaluate('x{code=~"\\d+"}', s)
