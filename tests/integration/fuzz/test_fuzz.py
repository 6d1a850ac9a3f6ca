"""The contract_fuzz check in worker processes: planted decode bugs are found within the default
budget and their saved reproducers replay; a correct target gets no finding; an HTTP target is
fuzzed through a real loopback server, schema phase included."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from mmchaos.checks.base import CheckContext
from mmchaos.checks.contract.fuzz import ContractFuzz, ContractFuzzParams
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Finding, Verdict
from mmchaos.fuzz.replay import replay_input
from mmchaos.runner import TimedTarget
from tests.fakes import broken_targets as bt
from tests.fakes import fuzz_targets as ft

pytestmark = pytest.mark.integration

DATA = make_shapes(4, seed=1)
DEFAULTS = ContractFuzzParams()


def _run(target: Any, **params: Any) -> list[Finding]:
    ctx = CheckContext(target=TimedTarget(target), dataset=DATA, seed=0, check_id="contract_fuzz")
    return list(ContractFuzz(ContractFuzzParams(**params)).run(ctx))


def _replay_cli(finding: Finding, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run the finding's own replay command (``mmchaos fuzz-replay ...``) from a report directory."""
    from mmchaos.cli import main

    (tmp_path / "evidence").mkdir(exist_ok=True)
    for artifact in finding.artifacts:
        (tmp_path / "evidence" / artifact.name).write_bytes(artifact.data)
    argv = shlex.split(finding.evidence["replay"])
    assert argv[:2] == ["mmchaos", "fuzz-replay"]
    argv[2] = str(tmp_path / argv[2])
    with pytest.raises(SystemExit) as exc:
        main(argv[1:])
    return int(exc.value.code or 0), capsys.readouterr().out


@pytest.mark.check_contract("contract_fuzz", "broken")
def test_a_planted_exif_orientation_bug_is_found_within_the_default_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    findings = _run(ft.OrientationTableTarget(), stop_after_failures=1)
    [fail] = [f for f in findings if f.verdict == Verdict.FAIL]
    summary = findings[-1]
    ev = fail.evidence
    assert ev["signature"].startswith("image_bytes:crashed:IndexError@fuzz_targets.py:decode_image")
    assert ev["found_after_cases"] <= DEFAULTS.max_cases and ev["found_after_s"] <= DEFAULTS.max_seconds
    assert summary.metrics["cases"] <= DEFAULTS.max_cases and summary.metrics["distinct_failures"] == 1
    assert summary.metrics["time_to_first_failure_s"] == pytest.approx(ev["found_after_s"], abs=1e-3)
    assert ev["minimised_bytes"] <= ev["original_bytes"]
    minimal = fail.artifacts[0].data
    again = replay_input(ft.OrientationTableTarget.uri, minimal, "image_bytes")
    assert again.signature == ev["signature"], "the minimised reproducer fails the same way"
    assert replay_input(bt.ContractSafeTarget.uri, minimal, "image_bytes").failed is False
    code, out = _replay_cli(fail, tmp_path, capsys)
    assert code == 1 and "reproduced" in out and "IndexError" in out


def test_a_planted_png_chunk_segfault_is_found_minimised_and_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    findings = _run(ft.SpltCrashTarget(), stop_after_failures=1, minimise_seconds=8.0)
    [fail] = [f for f in findings if f.verdict == Verdict.FAIL]
    ev = fail.evidence
    assert ev["signature"] == "image_bytes:crashed:SIGSEGV@__init__.py:string_at"
    assert "Segmentation fault" in ev["worker_stderr"] and fail.severity.value == "critical"
    minimal = fail.artifacts[0].data
    assert b"sPLT" in minimal and ev["minimised_bytes"] < ev["original_bytes"]
    assert findings[-1].metrics["worker_replacements"] >= 1
    code, out = _replay_cli(fail, tmp_path, capsys)
    assert code == 1 and "SIGSEGV" in out


def test_silent_garbage_is_found_deduplicated_and_minimised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    findings = _run(ft.ZeroForNoWordsTarget(), kinds=["text_bytes"], stop_after_failures=1)
    [fail] = [f for f in findings if f.verdict == Verdict.FAIL]
    ev = fail.evidence
    assert ev["signature"] == "text_bytes:garbage:all_zero" and fail.severity.value == "high"
    assert ev["minimised_bytes"] <= 3 and fail.artifacts[0].name.endswith(".txt")
    assert ev["hits"] >= 1 and findings[-1].metrics["n_garbage"] == ev["hits"]
    code, out = _replay_cli(fail, tmp_path, capsys)
    assert code == 1 and "all-zero embedding" in out


@pytest.mark.check_contract("contract_fuzz", "clean")
def test_a_correct_target_survives_the_fuzzer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    findings = _run(bt.ContractSafeTarget(), max_cases=400)
    assert [f.verdict for f in findings] == [Verdict.PASS], [f.title for f in findings]
    m = findings[0].metrics
    assert m["cases"] == 400 and m["distinct_failures"] == 0 and "time_to_first_failure_s" not in m
    assert m["n_rejected"] > 0 and m["n_ok"] > 0, "mutations both break inputs and keep them decodable"
    assert m["novel_features"] > 20 and m["queue"] > m["seeds"], "novelty keeps inputs in the queue"


def test_an_http_target_is_fuzzed_through_a_real_server_within_its_request_budget() -> None:
    from mmchaos.server import ServerConfig, ServerThread
    from mmchaos.targets.openai_http import OpenAITarget

    budget = {"max_requests": 400, "max_rate": 1000, "max_duration_s": 60}
    with ServerThread(ft.OrientationTableTarget(), ServerConfig(guards=False)) as srv:
        target = OpenAITarget.connect(srv.base_url)
        try:
            findings = _run(target, budget=budget, openapi_requests=120, workers=2, minimise_tests=60)
        finally:
            target.close()
    fails = [f for f in findings if f.verdict == Verdict.FAIL]
    summary = next(f for f in findings if f.verdict == Verdict.PASS)
    sigs = [f.evidence["signature"] for f in fails]
    assert any("EndpointError[model_error]" in s and "IndexError" in s for s in sigs), sigs
    assert summary.metrics["http_requests"] <= budget["max_requests"]
    assert summary.evidence["openapi"]["found"] and summary.metrics["openapi_requests"] > 20
    assert summary.metrics["openapi_operations"] >= 2
    assert summary.evidence["openapi"]["statuses"].get("200", 0) > 0, "the schema phase found a body the server takes"
    assert not [s for s in sigs if s.startswith("http:")], "the reference server answers every broken body 4xx"


class Caption(BaseModel):
    model: str
    text: str
    n: int = 1


def _fragile_app() -> Any:
    """A real FastAPI app with one unguarded handler: a text without words makes it 500."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/v1/captions")
    def captions(body: Caption) -> dict[str, Any]:
        words = body.text.split()
        return {"model": body.model, "first": words[0], "longest": max(len(w) for w in words), "n": body.n}

    return app


def test_the_schema_phase_finds_a_5xx_and_its_saved_request_replays() -> None:
    import base64
    import json

    import numpy as np

    from mmchaos.chaos.budget import RequestLedger
    from mmchaos.chaos.spec import BudgetSpec
    from mmchaos.fuzz.openapi import replay_request, schema_phase
    from mmchaos.server import ServerThread

    ledger = RequestLedger(BudgetSpec(max_requests=300, max_rate=1000, max_duration_s=60))
    with ServerThread(_fragile_app()) as srv:
        outcome = schema_phase(srv.base_url, ledger, np.random.default_rng(0), model="m")
        assert outcome.found and outcome.operations == 1 and outcome.requests == ledger.sent - 1 < 300
        failure = outcome.failures["http:POST /v1/captions:500:untyped"]
        for f in outcome.failures.values():  # a 500, or the connection dropped: only text without words
            assert json.loads(base64.b64decode(json.loads(f.to_json())["body_b64"]))["text"].strip() == ""
        record = json.loads(failure.to_json())
        status, detail = replay_request(srv.base_url, record)
        assert status == 500, detail
    assert outcome.status_counts.get("422", 0) > 10, "wrong types get the framework's 422"


def test_a_resumed_campaign_reads_its_rounds_back_and_finds_the_same(caplog: pytest.LogCaptureFixture) -> None:
    """Every fuzzed input is a journaled unit: a resumed run replays the seeded rounds from the store
    (the segfaulting inputs do not run, or crash a worker, again) and reports the same findings."""
    import logging

    from tests.fakes.journal import DictJournal

    journal = DictJournal()
    params = ContractFuzzParams(stop_after_failures=1, minimise_tests=6, max_seconds=600, minimise_seconds=600)

    def run() -> list[Finding]:
        ctx = CheckContext(target=TimedTarget(ft.SpltCrashTarget()), dataset=DATA, seed=0, check_id="contract_fuzz",
                           journal=journal)  # fmt: skip
        return list(ContractFuzz(params).run(ctx))

    first = run()
    assert first[-1].metrics["worker_replacements"] >= 1 and len(journal.units) == first[-1].metrics["cases"] + 6
    with caplog.at_level(logging.INFO, logger="mmchaos.executors.isolated"):
        again = run()
    assert "resume: 32 of 32 contract_fuzz jobs read back" in caplog.text
    assert again[-1].metrics["worker_replacements"] == 0, "no input ran again"
    [fail], [fail_again] = ([f for f in fs if f.verdict == Verdict.FAIL] for fs in (first, again))
    assert (
        fail_again.evidence["signature"]
        == fail.evidence["signature"]
        == "image_bytes:crashed:SIGSEGV@__init__.py:string_at"
    )
    assert fail_again.artifacts == fail.artifacts and fail_again.evidence["hits"] == fail.evidence["hits"]
