"""Step 6 on loopback: the serving suite end to end, and each serving check failing a broken deployment.

Every test starts real servers (the reference server, the fault proxy) on 127.0.0.1 with small
budgets and checks afterwards that nothing is left listening and no mmchaos thread is left running.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest

from mmchaos.chaos.budget import BudgetExhausted, RequestLedger, is_typed_error
from mmchaos.chaos.deployment import Deployment, port_open
from mmchaos.chaos.spec import BudgetSpec
from mmchaos.checks.base import Check, CheckContext
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Finding, Verdict
from mmchaos.targets.base import Target
from tests.fakes.targets import HashEmbedTarget
from tests.support import run_check_class
from tests.support.serving import FAST, ROOMY

pytestmark = pytest.mark.integration

DATA = make_shapes(16, seed=3)


def mmchaos_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("mmchaos-") and t.is_alive()}


@pytest.fixture(autouse=True)
def nothing_left_running() -> Iterator[None]:
    before = mmchaos_threads()
    yield
    deadline = time.monotonic() + 5
    while mmchaos_threads() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not mmchaos_threads() - before, f"threads left running: {mmchaos_threads() - before}"


def run(
    check_cls: type[Check],
    target: Target,
    params: dict[str, Any],
    gate: dict[str, Any] | None = None,
) -> list[Finding]:
    return run_check_class(check_cls, target, params, gate, data=DATA)


def experiment(findings: list[Finding]) -> Finding:
    [f] = [f for f in findings if "journal" in f.evidence]
    return f


def assert_torn_down(f: Finding) -> dict[str, Any]:
    """The experiment's budget held, and what it started is closed: ports and threads."""
    journal = f.evidence["journal"]
    assert journal["budget"]["respected"], journal["budget"]
    assert journal["budget"]["sent"] <= journal["budget"]["declared"]["max_requests"]
    assert journal["budget"]["max_rate_observed"] <= journal["budget"]["declared"]["max_rate"]
    assert journal["teardown"]["clean"], journal["teardown"]
    for url in (journal["experiment"]["deployment"]["url"], journal["experiment"]["deployment"]["service"]):
        parts = urlsplit(url)
        if journal["experiment"]["deployment"]["in_process"] or url == journal["experiment"]["deployment"]["url"]:
            assert not port_open(parts.hostname or "", parts.port or 0), f"{url} still listens"
    return dict(journal)


# --- deliberately broken targets ----------------------------------------------------------------------


class DegradingTarget(HashEmbedTarget):
    """Correct, ``seconds`` a model call, until ``degrade`` is set; then every call takes ``degraded_s``
    (a GC storm, a thermal cliff)."""

    def __init__(self, seconds: float = 0.0, degraded_s: float = 0.4) -> None:
        super().__init__()
        self.seconds, self.degraded_s = seconds, degraded_s
        self.degrade = threading.Event()

    def _wait(self) -> None:
        wait = self.degraded_s if self.degrade.is_set() else self.seconds
        if wait:
            time.sleep(wait)

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        self._wait()
        return super().embed_images(images)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        self._wait()
        return super().embed_texts(texts)


class EngineDiesOnLargeImages(HashEmbedTarget):
    """One large image corrupts the engine (an illegal memory access): every later call fails too."""

    def __init__(self) -> None:
        super().__init__()
        self.dead = False

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        if self.dead or any(max(i.shape[:2]) > 1024 for i in images):
            self.dead = True
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().embed_images(images)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        if self.dead:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().embed_texts(texts)


# --- the budget and typed errors, without a network ------------------------------------------------


def test_the_ledger_never_exceeds_the_declared_budget() -> None:
    ledger = RequestLedger(BudgetSpec.model_validate({"max_requests": 30, "max_rate": 100, "max_duration_s": 10}))
    for _ in range(30):
        ledger.reserve()
    with pytest.raises(BudgetExhausted, match="budget is spent"):
        ledger.reserve()
    summary = ledger.summary()
    assert summary["sent"] == 30 and summary["max_rate_observed"] <= 100 and summary["respected"]
    gaps = np.diff(ledger.starts)
    assert gaps.min() >= 1 / 100, "requests are spaced by at least 1 / max_rate"
    ledger.check_host("127.0.0.1")
    ledger.check_host("localhost")
    with pytest.raises(BudgetExhausted, match="not a loopback"):
        ledger.check_host("192.0.2.7")
    assert ledger.summary()["refused_remote"] == 1 and not ledger.summary()["respected"]


def test_typed_errors_are_openai_json_and_nothing_else() -> None:
    assert is_typed_error(b'{"error": {"message": "x", "type": "invalid_request_error", "code": "bad_image"}}') == (
        True,
        "bad_image",
    )
    assert is_typed_error(b'{"object": "error", "message": "x", "type": "BadRequestError", "code": 400}') == (
        True,
        "400",
    )
    for body in (b"<html>502 Bad Gateway</html>", b"", b'{"detail": "Not Found"}', b"\xff\xfe", b'["error"]'):
        assert is_typed_error(body) == (False, None)


def test_an_experiment_builds_one_tls_context_however_many_load_phases(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each load phase used to build a new httpx transport and with it a new SSL context (certifi's CA
    bundle parsed again: tens of ms of CPU a phase, ~50 phases a serving_faults run). The spy counts
    the stdlib's context constructor; the phases themselves run for real against the server."""
    import ssl

    from mmchaos.chaos.experiment import Experiment
    from mmchaos.chaos.spec import ServingParams

    made: list[int] = []
    real = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(1)
        return real(*args, **kwargs)

    params = ServingParams.model_validate({**FAST, "warmup_requests": 0})
    ctx = CheckContext(target=HashEmbedTarget(), dataset=DATA, seed=0, check_id="tls")
    with Experiment(ctx, params, title="tls", description="phases share one TLS context", proxy=False) as ex:
        monkeypatch.setattr(ssl, "create_default_context", counting)
        phases = [ex.phase(f"load{i}", seconds=0.3, guarded=False) for i in range(3)]
    assert all(ph.result is not None and ph.result.ok > 0 for ph in phases)
    assert len(made) <= 1, f"{len(made)} SSL contexts for {len(phases)} phases"
    assert ex.finish()["teardown"]["clean"]


# --- end to end --------------------------------------------------------------------------------------


@pytest.mark.check_contract("serving_faults", "clean")
@pytest.mark.check_contract("serving_overload", "clean")
@pytest.mark.check_contract("serving_poison", "clean")
@pytest.mark.check_contract("serving_resilience", "clean")
def test_the_serving_suite_end_to_end_on_loopback(tmp_path: Path) -> None:
    """The four serving experiments and two step-7 checks in one run of a correct service all pass and
    tear down. The SLO is ROOMY: each check's failing side is a broken target further down, and with
    FAST's 1 s p99 a CI run failed `latency/moderate` on one stalled request out of ~12."""
    from mmchaos.runner import RunConfig, run_suite
    from mmchaos.store import RunStore
    from mmchaos.suites import SuiteSpec, load_suite

    load_suite("serving")  # the built-in suite validates
    target = "builtin:tiny-clip"
    breaker = {
        "failure_rate_threshold": 50,
        "sliding_window_size": 10,
        "minimum_number_of_calls": 5,
        "wait_duration_in_open_state": 0.3,
        "permitted_number_of_calls_in_half_open_state": 2,
    }
    suite = SuiteSpec.model_validate(
        {
            "name": "serving-small",
            "checks": [
                {
                    "check": "serving_faults",
                    "params": {**FAST, **ROOMY, "faults": ["latency", "reset_peer", "http_503"], "fault_s": 0.4},
                },
                {"check": "serving_poison", "params": {**FAST, **ROOMY, "poison_s": 1.2, "huge_side": 1024}},
                {
                    "check": "serving_overload",
                    "params": {
                        **FAST,
                        **ROOMY,
                        "concurrency_steps": [1, 4],
                        "step_s": 0.5,
                        "budget": {**FAST["budget"], "max_rate": 1000},
                    },
                },
                {
                    "check": "serving_resilience",
                    "params": {
                        **FAST,
                        **ROOMY,
                        "failure_s": 0.6,
                        "retry_calls": 6,
                        "max_recovery_s": 3.0,
                        "server": {"breaker": breaker},
                    },
                },
                {
                    "check": "drift_detection",
                    "params": {
                        "perturbations": ["gaussian_noise", "keyboard_typo"],
                        "severities": [5],
                        "samples": 32,
                        "clean_requests": 1000,
                        "clean_stream": "resample",
                    },
                },
                {"check": "metrics_exposure", "params": {"requests_per_modality": 2}},
            ],
        }
    )
    started = time.monotonic()
    with RunStore(tmp_path / "runs.db") as store:
        result = run_suite(RunConfig(target=target, suite=suite, data="builtin:shapes?n=16"), store)
    wall = time.monotonic() - started
    bad = [f"{f.check}: {f.verdict.value}: {f.title}" for f in result.findings if f.verdict != Verdict.PASS]
    assert not bad, bad
    checks = {f.check for f in result.findings}
    assert checks == {
        "serving_faults",
        "serving_poison",
        "serving_overload",
        "serving_resilience",
        "drift_detection",
        "metrics_exposure",
    }
    journals = [f for f in result.findings if "journal" in f.evidence]
    assert len(journals) == 4
    for f in journals:
        journal = assert_torn_down(f)
        assert journal["status"] == "completed" and not journal["deviated"] and f.evidence["aborted"] is False
        assert journal["steady_states"]["before"] is None or journal["steady_states"]["before"]["steady_state_met"]
        assert {"type", "name"} <= set(journal["run"][0]["activity"]) and journal["rollbacks"]
    faults = [f for f in result.findings if f.check == "serving_faults" and "fault" in f.evidence]
    assert len(faults) == 6 and all(f.metrics["recovery_s"] >= 0 for f in faults)
    assert wall < 300, f"the small serving suite took {wall:.0f} s: something waited on a timeout"


# --- each check fails a broken deployment -------------------------------------------------------------


@pytest.mark.check_contract("serving_faults", "broken")
def test_faults_flag_error_pages_that_are_not_openai_json() -> None:
    from mmchaos.checks.serving.faults import ServingFaults

    gateway = {
        "type": "http_status",
        "toxicity": 0.3,
        "attributes": {"status": 502, "body": "<html>502 Bad Gateway</html>", "content_type": "text/html"},
    }
    findings = run(
        ServingFaults,
        HashEmbedTarget(),
        {
            **FAST,
            "faults": ["http_503"],
            "levels": ["heavy"],
            "fault_s": 0.4,
            "custom": [{"name": "html-gateway", "toxic": gateway}],
        },
    )
    by = {f.evidence.get("fault"): f for f in findings if "fault" in f.evidence}
    assert by["http_503"].verdict == Verdict.PASS, by["http_503"].title  # the proxy's 503s are typed
    html = by["html-gateway"]
    assert html.verdict == Verdict.FAIL and html.metrics["untyped_errors"] > 0
    sample = html.evidence["during"]["http_errors"]["untyped_samples"][0]
    assert sample["status"] == 502 and "Bad Gateway" in sample["body"]
    assert "gateway" in html.suggestion
    assert_torn_down(experiment(findings))


def test_a_service_that_degrades_mid_run_is_aborted_with_every_fault_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    from mmchaos.checks.serving.faults import ServingFaults

    # 2 s a call once degraded, against FAST's 1 s p99: every window of the fault phase holds a request
    # stalled past the p99, while a baseline on a hogged machine stays within it (with 0.4 s calls the
    # p99 had to be 300 ms, and one run under load ended failed but not aborted).
    target = DegradingTarget(degraded_s=2.0)
    add = Deployment.add_toxic

    def add_and_degrade(self: Deployment, toxic: Any) -> str:
        name = add(self, toxic)
        target.degrade.set()  # the service degrades while the first fault is in
        return name

    monkeypatch.setattr(Deployment, "add_toxic", add_and_degrade)
    params = {
        **FAST,
        "faults": ["latency", "reset_peer"],
        "levels": ["moderate"],
        "fault_s": 5.0,
        "abort_after_windows": 2,
    }
    started = time.monotonic()
    findings = run(ServingFaults, target, params)
    took = time.monotonic() - started
    exp = experiment(findings)
    assert exp.verdict == Verdict.FAIL and exp.evidence["aborted"] is True, [f.title for f in findings]
    assert exp.evidence["reason"].startswith("safeguard") and "latency/moderate" in exp.evidence["reason"]
    journal = assert_torn_down(exp)
    assert journal["status"] == "aborted" and journal["aborted"] == exp.evidence["reason"]
    assert exp.evidence["not_run"] == ["reset_peer/moderate"]
    [abort] = [a for a in journal["run"] if a["activity"]["name"] == "safeguard_abort"]
    assert abort["output"]["faults_removed"] == ["latency-moderate"] and abort["output"]["phase"] == "latency/moderate"
    assert journal["teardown"]["toxics_removed"] == [], "nothing was left for the rollback to remove"
    [fault] = [f for f in findings if f.evidence.get("fault") == "latency"]
    assert fault.verdict == Verdict.FAIL and fault.evidence["aborted"] is True
    assert fault.evidence["during"]["seconds"] < 4.0, "the abort cut the 5 s fault phase short"
    assert took < 20 and journal["budget"]["sent"] < 1000


def _latency_fault_on(target: DegradingTarget, monkeypatch: pytest.MonkeyPatch) -> Finding:
    add, clear = Deployment.add_toxic, Deployment.clear_toxics

    def add_and_degrade(self: Deployment, toxic: Any) -> str:
        target.degrade.set()  # slower while the fault is in (the steady states around it are not)
        return add(self, toxic)

    def clear_and_restore(self: Deployment) -> list[str]:
        target.degrade.clear()
        return clear(self)

    monkeypatch.setattr(Deployment, "add_toxic", add_and_degrade)
    monkeypatch.setattr(Deployment, "clear_toxics", clear_and_restore)
    params = {**FAST, "faults": ["latency"], "levels": ["moderate"], "fault_s": 0.4, "warmup_requests": 2,
              "concurrency": 1, "max_recovery_s": 5.0,
              "slo": {"window_s": 1.0, "p99_ms": 2000, "min_window_requests": 2}}  # fmt: skip
    from mmchaos.checks.serving.faults import ServingFaults

    [fault] = [f for f in run(ServingFaults, target, params) if f.evidence.get("fault") == "latency"]
    return fault


def test_a_fault_phase_shorter_than_a_request_is_judged_on_its_answers_not_cut_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 0.4 s phase of 0.6 s requests (a 2 s p99 objective): cut at its deadline, the request in flight
    timed out there as an error or was cancelled unmeasured, and the correct service failed
    ``latency/moderate`` (how CI failed the serving suite when its machine stalled). The phase now
    lets it finish, up to the p99 bound."""
    fault = _latency_fault_on(DegradingTarget(0.05, 0.6), monkeypatch)
    assert fault.verdict == Verdict.PASS, fault.title
    during = fault.evidence["during"]
    assert during["ok"] >= 1 and during["unanswered_past_p99"] == 0 and during["errors"] == {}
    assert during["p99_ms"] >= 600


@pytest.mark.check_contract("serving_faults", "broken")
def test_a_request_past_the_p99_bound_fails_the_phase_though_no_latency_of_it_was_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same phase when the fault makes each request take 2.6 s: none answers within the 2 s bound
    (the phase's 0.4 s and the drain's 2 s), so none has a latency among the measured ones; the phase
    is outside the SLO all the same."""
    fault = _latency_fault_on(DegradingTarget(0.05, 2.6), monkeypatch)
    assert fault.verdict == Verdict.FAIL and "outside the SLO" in fault.title, fault.title
    during = fault.evidence["during"]
    assert during["ok"] == 0 and during["slo_met"] is False


@pytest.mark.check_contract("serving_poison", "broken")
def test_poison_isolation_fails_when_one_image_kills_the_engine() -> None:
    from mmchaos.checks.serving.poison import ServingPoison

    # A p99 objective no loaded machine misses: both verdicts are about failures, not speed.
    params = {**FAST, "poisons": ["huge_image", "invalid_json"], "huge_side": 1536, "poison_s": 1.0,
              "slo": {**FAST["slo"], "p99_ms": 20_000}}  # fmt: skip
    good = run(ServingPoison, HashEmbedTarget(), params)
    assert all(f.verdict == Verdict.PASS for f in good), [f.title for f in good if f.verdict != Verdict.PASS]
    findings = run(ServingPoison, EngineDiesOnLargeImages(), params)
    [iso] = [f for f in findings if f.title.startswith("isolation")]
    assert iso.verdict == Verdict.FAIL and iso.metrics["good_success_rate"] < 1.0
    assert any(k.startswith("http_5xx") for k in iso.evidence["good_failures"]), iso.evidence["good_failures"]
    [huge] = [f for f in findings if f.evidence.get("poison") == "huge_image"]
    assert huge.verdict == Verdict.FAIL and huge.metrics["answers_5xx"] >= 1 and huge.artifacts
    exp = experiment(findings)
    assert exp.verdict == Verdict.FAIL  # aborted by the safeguard, or deviated after
    assert_torn_down(exp)


class QuarterSecondModel(HashEmbedTarget):
    """Correct, 250 ms per input, one call at a time: alone a request takes ~250 ms, four at once
    wait ~1 s. The delay dominates the harness's own overhead, so the knee holds on a loaded machine
    (with 40 ms calls and a 120 ms SLO, concurrency 1 broke the SLO at load ~15). Per input, not per
    call: with 250 ms a call the server's batches of two or three put four clients' p99 at 770 ms,
    10% over the 700 ms SLO, and one run in nine met it."""

    def __init__(self) -> None:
        super().__init__()
        self._one_at_a_time = threading.Lock()

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        with self._one_at_a_time:
            time.sleep(0.25 * len(images))
            return super().embed_images(images)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        with self._one_at_a_time:
            time.sleep(0.25 * len(texts))
            return super().embed_texts(texts)


@pytest.mark.check_contract("serving_overload", "broken")
def test_overload_fails_when_the_knee_is_below_the_required_concurrency() -> None:
    from mmchaos.checks.serving.overload import ServingOverload

    params = {
        **FAST,
        "concurrency_steps": [1, 4],
        "step_s": 2.5,
        "slo": {"window_s": 1.0, "p99_ms": 700, "min_window_requests": 2},
        "budget": {**FAST["budget"], "max_rate": 1000},
    }
    findings = run(ServingOverload, QuarterSecondModel(), params, {"min_knee_concurrency": 4})
    [knee] = [f for f in findings if f.title.startswith("knee")]
    assert knee.verdict == Verdict.FAIL and knee.metrics["knee_concurrency"] == 1
    assert knee.metrics["breaking_concurrency"] == 4
    rows = knee.evidence["steps"]["rows"]
    assert [r[0] for r in rows] == [1, 4] and rows[0][7] is True and rows[1][7] is False
    assert_torn_down(experiment(findings))


class BrokenAfterTenCalls(HashEmbedTarget):
    """Correct for ten model calls, then 0.5 s a call for good: it never comes back after the ramp."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def _maybe_stall(self) -> None:
        self.calls += 1
        if self.calls > 10:
            time.sleep(0.5)

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        self._maybe_stall()
        return super().embed_images(images)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        self._maybe_stall()
        return super().embed_texts(texts)


class LoadedMachineModel(HashEmbedTarget):
    """Correct, 80 ms an input: the same service as a fast one, on a machine busy with other work.
    Per input, not per call, so the server's batching cannot clear a queue faster than that: a ramp
    to 16 clients always leaves more than the step's drain can answer (80 ms a call, a batch of 16
    took as long as a batch of one, and the backlog left over was 2-8 requests in ten runs here and
    none in the CI run it failed)."""

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        time.sleep(0.08 * len(images))
        return super().embed_images(images)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        time.sleep(0.08 * len(texts))
        return super().embed_texts(texts)


def _overload_recovery(findings: list[Finding]) -> Finding:
    [f] = [f for f in findings if f.title.startswith("overload:")]
    return f


def test_overload_fails_a_service_that_does_not_recover_after_the_ramp() -> None:
    from mmchaos.checks.serving.overload import ServingOverload

    params = {
        **FAST,
        "concurrency_steps": [1, 2],
        "step_s": 0.5,
        "max_recovery_s": 1.0,
        "slo": {**FAST["slo"], "p99_ms": 300},
        "budget": {**FAST["budget"], "max_rate": 1000},
    }
    findings = run(ServingOverload, BrokenAfterTenCalls(), params, {"min_knee_concurrency": 0})
    recovery = _overload_recovery(findings)
    assert recovery.verdict == Verdict.FAIL and "did not recover within" in recovery.title
    assert "recovery_s" not in recovery.metrics, "not recovered: no recovery time, not a -1 placeholder"
    # the drain it was granted is bounded, measured and in the evidence
    allowance = recovery.evidence["recovery_allowance"]
    assert 0.0 <= allowance["drain_s"] <= allowance["drain_cap_s"] == 4.0
    assert experiment(findings).verdict == Verdict.FAIL
    journal = assert_torn_down(experiment(findings))
    # the journal says where the service was when it did not come back: alive, but slow
    [diag] = [a["output"] for a in journal["run"] if a["activity"]["name"] == "diagnose"]
    assert diag["after"] == "after_ramp:recovery" and diag["server"]["breaker"] == "closed"
    assert diag["healthz_service"]["status"] == 200 and "connections_active" in diag["proxy"]


def test_overload_recovery_is_judged_after_the_backlog_drains_at_the_measured_rate() -> None:
    """The flaky verdict: on a loaded machine every call is slower, so the ramp's backlog takes longer
    to clear, and a correct service missed a recovery time that holds on an idle one. Here the
    model is 80 ms a call and max_recovery_s fits a fast one (50 ms): the service recovers once its
    backlog is drained at the rate it showed, and passes; ``test_overload_fails_a_service_that_does
    _not_recover_after_the_ramp`` keeps a service that stays broken failing."""
    from mmchaos.checks.serving.overload import ServingOverload

    # 16 clients of an 80 ms model: the last step ends with more queued than its 0.5 s drain (the p99
    # bound) can answer, so a backlog is left for the recovery to wait out (8 clients no longer do).
    params = {
        **FAST,
        "concurrency_steps": [1, 4, 16],
        "step_s": 0.5,
        "max_recovery_s": 0.05,
        "slo": {"window_s": 0.5, "p99_ms": 500, "min_window_requests": 2},
        "budget": {**FAST["budget"], "max_rate": 1000},
    }
    # The collapse gate at its default: a FIFO service answers at its full rate past the knee, however
    # many of those answers a hogged machine pushes past the SLO's latency (judged on answers within
    # the SLO, the goodput of the knee halved there, 9.3 vs 18.8 req/s, and this service failed).
    findings = run(ServingOverload, LoadedMachineModel(), params, {"min_knee_concurrency": 1})
    recovery = _overload_recovery(findings)
    assert recovery.verdict == Verdict.PASS, recovery.title
    assert recovery.metrics["answer_rate_ratio_past_knee"] >= 0.5
    allowance = recovery.evidence["recovery_allowance"]
    assert allowance["backlog"] >= 1 and allowance["drain_rate_rps"] > 0
    assert allowance["answer_s"] >= 0.08  # the first recovery request's own answer is granted
    whole = min(allowance["drain_cap_s"], allowance["drain_s"] + allowance["answer_s"])
    assert abs(allowance["allowance_s"] - whole) < 2e-3
    assert 0.05 < recovery.metrics["recovery_s"] <= 0.05 + allowance["allowance_s"]
    assert "granted 0.05 s + " in recovery.title
    assert experiment(findings).verdict == Verdict.PASS
    assert_torn_down(experiment(findings))


class ThrashingModel(HashEmbedTarget):
    """An engine whose fast path is a batch of one (its one optimised shape profile, say), 20 ms; the
    inputs of a bigger batch take its slow path, 250 ms each. A lone client is fast; among 16 clients
    two requests soon meet in one batch, the others queue behind it, and from then on every batch the
    server forms is big: it answers 4 requests a second where the knee gave dozens. Its throughput
    collapses past the knee. (At 5 ms alone, two requests under a CPU hog never met in one batch.)"""

    def _run(self, n: int) -> None:
        time.sleep(0.02 if n == 1 else 0.25 * n)

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        self._run(len(images))
        return super().embed_images(images)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        self._run(len(texts))
        return super().embed_texts(texts)


@pytest.mark.check_contract("serving_overload", "broken")
def test_overload_fails_a_service_whose_answer_rate_collapses_past_the_knee() -> None:
    from mmchaos.checks.serving.overload import ServingOverload

    params = {
        **FAST,
        "concurrency_steps": [1, 16],
        "step_s": 1.0,
        "slo": {"window_s": 0.5, "p99_ms": 250, "min_window_requests": 2},
        "budget": {**FAST["budget"], "max_rate": 1000},
    }
    findings = run(ServingOverload, ThrashingModel(), params, {"min_knee_concurrency": 1})
    recovery = _overload_recovery(findings)
    assert recovery.verdict == Verdict.FAIL
    assert "throughput collapsed where the SLO broke (concurrency 16" in recovery.title
    assert recovery.metrics["answer_rate_ratio_past_knee"] < 0.5
    assert_torn_down(experiment(findings))


def test_a_failure_window_shorter_than_the_breakers_minimum_calls_is_extended_not_failed() -> None:
    """The budget's rate cap (150/s) lets at most 45 requests fail in 0.3 s, fewer than the 100 this
    breaker needs before it may open: the model keeps failing until they have, so the verdict is on
    the breaker, not on how many requests the machine sent (it failed the suite on a busy CI run)."""
    from mmchaos.checks.serving.resilience import ServingResilience

    breaker = {"minimum_number_of_calls": 100, "sliding_window_size": 100, "wait_duration_in_open_state": 0.3}
    params = {**FAST, "failure_s": 0.3, "retries": False, "server": {"breaker": breaker}}
    findings = run(ServingResilience, HashEmbedTarget(), params, {"max_failures_to_open": 150})
    by = {f.title.split(":")[0]: f for f in findings}
    assert by["breaker"].verdict == Verdict.PASS, by["breaker"].title
    # it opened only past what 0.3 s at 150/s can hold (its window of 100 also holds the baseline's
    # successes, so half of it failing opens it: about 50 failures)
    assert by["breaker"].metrics["failures_to_open"] > 45


@pytest.mark.check_contract("serving_resilience", "broken")
def test_resilience_fails_a_breaker_that_never_opens_and_a_client_that_never_retries() -> None:
    from mmchaos.checks.serving.resilience import ServingResilience

    never = {"minimum_number_of_calls": 100_000, "sliding_window_size": 100_000}
    params = {**FAST, "failure_s": 0.6, "retry_calls": 8, "client_max_retries": 0, "server": {"breaker": never}}
    findings = run(ServingResilience, HashEmbedTarget(), params)
    by = {f.title.split(":")[0]: f for f in findings}
    assert by["breaker"].verdict == Verdict.FAIL and "never opened" in by["breaker"].title
    assert by["breaker"].metrics["model_calls_while_failing"] > 5
    assert "failures_to_open" not in by["breaker"].metrics  # it never opened: not measured, no -1 placeholder
    assert by["client retries"].verdict == Verdict.FAIL
    assert "0 retries get only 50% of calls through" in by["client retries"].title
    assert_torn_down(experiment(findings))


def test_serving_checks_run_against_an_openai_endpoint() -> None:
    from mmchaos.checks.serving.faults import ServingFaults
    from mmchaos.checks.serving.resilience import ServingResilience
    from mmchaos.server import ServerConfig, ServerThread
    from mmchaos.targets.openai_http import OpenAITarget

    with ServerThread(HashEmbedTarget(), ServerConfig()) as srv:
        target = OpenAITarget.connect(srv.base_url)
        try:
            res = run(ServingResilience, target, {**FAST, "retry_calls": 6})
            faults = run(ServingFaults, target, {**FAST, "faults": ["http_429"], "levels": ["heavy"], "fault_s": 0.4})
        finally:
            target.close()
        port = srv.port
    assert not port_open("127.0.0.1", port)
    by = {f.title.split(":")[0]: f for f in res}
    assert by["breaker"].verdict == Verdict.SKIPPED and "openai" in by["breaker"].message
    assert by["client retries"].verdict == Verdict.PASS, by["client retries"].title
    assert all(f.verdict == Verdict.PASS for f in faults), [f.title for f in faults]
    for f in (experiment(res), experiment(faults)):
        journal = assert_torn_down(f)
        assert journal["experiment"]["deployment"]["in_process"] is False
        assert journal["experiment"]["deployment"]["service"] == f"http://127.0.0.1:{port}"


def test_bad_parameters_are_refused_at_the_boundary() -> None:
    from mmchaos.errors import ConfigError
    from mmchaos.suites import SuiteSpec, build_checks

    for check, params, needle in (
        ("serving_faults", {"faults": ["latencyy"]}, "did you mean latency"),
        ("serving_faults", {"custom": [{"name": "x", "toxic": {"type": "nope"}}]}, "unknown toxic type"),
        ("serving_poison", {"poisons": ["bomb"]}, "unknown poison"),
        ("serving_overload", {"concurrency_steps": [4, 2]}, "increasing"),
        ("serving_faults", {"budget": {"max_rate": 0}}, "budget.max_rate"),
        ("drift_detection", {"perturbations": ["caption_mismatch"]}, "image or text"),
        ("drift_detection", {"clean_requests": 10}, "clean_requests"),
    ):
        suite = SuiteSpec.model_validate({"name": "t", "checks": [{"check": check, "params": params}]})
        with pytest.raises(ConfigError, match=needle):
            build_checks(suite)
