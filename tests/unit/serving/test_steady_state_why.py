"""Why a steady state did not hold: status and error codes of the failed good requests, and whether
the service refused the harness's own traffic (a harness or configuration problem) or failed.

The load runs through the experiments' real budgeted transport and error inspector, over an
``httpx.MockTransport`` playing the server (no sockets)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx

from mmchaos.chaos.budget import ErrorInspector, RequestLedger, budgeted_transports
from mmchaos.chaos.load import LoadDriver, LoadRequest, MixEntry, PayloadMix
from mmchaos.chaos.spec import BudgetSpec, SLOSpec
from mmchaos.chaos.steady import explain_unmet, is_refusal
from mmchaos.chaos.windows import Phase

SLO = SLOSpec(min_success_rate=0.99, p99_ms=1000.0)
OK = {"object": "list", "data": [{"index": 0, "embedding": [0.1, 0.2]}]}


def error(status: int, code: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": "no", "type": "invalid_request_error", "code": code}})


def probe(handler: Callable[[httpx.Request], httpx.Response]) -> Phase:
    """24 good requests (half images, half texts) against ``handler``: the phase as the experiment has it."""
    inspector = ErrorInspector(phase="steady_state_before")
    ledger = RequestLedger(BudgetSpec(max_rate=10_000))
    async_cls, _ = budgeted_transports()

    def request(kind: str, body: dict[str, object]) -> MixEntry:
        content = json.dumps(body).encode()
        return MixEntry(lambda rng: LoadRequest(kind, "/v1/embeddings", content=content))

    mix = PayloadMix(
        [request("image_small", {"model": "m", "messages": []}), request("text_short", {"model": "m", "input": "a"})]
    )

    async def go() -> Phase:
        transport = async_cls(httpx.MockTransport(handler), ledger, inspector)
        async with httpx.AsyncClient(base_url="http://127.0.0.1:9", transport=transport) as client:
            cfg = {"base_url": "http://127.0.0.1:9", "concurrency": 2, "max_requests": 24, "max_duration": 10}
            result = await LoadDriver(cfg, mix, client=client).run()
        return Phase("steady_state_before", True, result, [], inspector.for_phase(inspector.phase), 0.0, 1.0)

    return asyncio.run(go())


def refuse_images(request: httpx.Request) -> httpx.Response:
    return error(400, "bad_request") if "messages" in json.loads(request.content) else httpx.Response(200, json=OK)


def test_refused_good_traffic_before_any_fault_is_a_harness_problem_with_its_codes() -> None:
    ph = probe(refuse_images)
    assert not ph.met(SLO)
    out = explain_unmet(ph, SLO, before=True)
    failed = out["failed_good_requests"]
    n = failed["count"]
    assert n > 0 and failed["status_codes"] == {"400": n} and failed["error_codes"] == {"400:bad_request": n}
    assert failed["kinds"] == {"image_small": n} and failed["transport"] == {}
    assert out["harness_problem"] is True
    assert f"{n} x HTTP 400 bad_request" in out["why"] and "success rate" in out["why"]
    assert "harness or configuration problem" in out["why"] and "image_small" in out["why"]
    # After the method, the same refusals are the service's deviation, not the harness's traffic.
    after = explain_unmet(ph, SLO, before=False)
    assert after["harness_problem"] is False and "harness" not in after["why"]


def test_a_service_failing_its_good_traffic_is_not_called_a_harness_problem() -> None:
    def crash_images(request: httpx.Request) -> httpx.Response:
        if "messages" in json.loads(request.content):
            return error(500, "internal_error")
        return httpx.Response(200, json=OK)

    out = explain_unmet(probe(crash_images), SLO, before=True)
    assert out["harness_problem"] is False and "harness" not in out["why"]
    assert "x HTTP 500 internal_error" in out["why"]


def test_refusals_next_to_real_failures_are_named_but_the_verdict_stays_the_services() -> None:
    calls = [0]

    def mixed(request: httpx.Request) -> httpx.Response:
        calls[0] += 1
        if "messages" in json.loads(request.content):
            return error(400, "bad_request")
        if calls[0] % 4 == 0:
            raise httpx.ReadTimeout("slow", request=request)
        return httpx.Response(200, json=OK)

    out = explain_unmet(probe(mixed), SLO, before=True)
    assert out["failed_good_requests"]["transport"].get("timeout", 0) > 0
    assert out["harness_problem"] is False
    assert "harness or configuration problem" in out["why"] and "x timeout" in out["why"]


def test_which_statuses_are_refusals() -> None:
    assert [is_refusal(s) for s in (400, 401, 404, 413, 422)] == [True] * 5
    assert [is_refusal(s) for s in (None, 200, 408, 429, 500, 503)] == [False] * 6
