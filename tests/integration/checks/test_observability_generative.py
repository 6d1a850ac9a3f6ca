"""Steps 7 and 4 on a generative target: ``metrics_exposure`` and ``generation_drift`` against ``mmchaos serve``
over ``builtin:tiny-vlm`` (the real server on loopback, the real tiny model), read through the
``openai:`` target, and in-process (the check starts the reference server itself). Issue 20: both
steps were skipped on every generative target. And ``image_context_boundary`` over ``openai:`` reads
the context limit the server states in ``/v1/models`` (it skipped: the target stated none)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mmchaos.checks.engine.image_context_boundary import ImageContextBoundary
from mmchaos.checks.observability.metrics_exposure import MetricsExposure
from mmchaos.data import load_dataset
from mmchaos.findings import Finding, Verdict
from mmchaos.server import ServerConfig, ServerThread
from mmchaos.targets import load_target
from mmchaos.targets.base import Target
from mmchaos.targets.openai_http import OpenAITarget
from tests.support import run_check_class

pytestmark = pytest.mark.integration

DATA = load_dataset("builtin:vqa")


@pytest.fixture(scope="module")
def tiny_vlm() -> Iterator[Target]:
    pytest.importorskip("transformers")
    target = load_target("builtin:tiny-vlm")
    yield target
    target.close()


@pytest.fixture(scope="module")
def served(tiny_vlm: Target) -> Iterator[OpenAITarget]:
    with ServerThread(tiny_vlm, ServerConfig(model_name="tiny-vlm")) as srv:
        client = OpenAITarget.connect(srv.base_url, model="tiny-vlm")
        yield client
        client.close()


def _metrics(target: Target) -> list[Finding]:
    return run_check_class(MetricsExposure, target, {"requests_per_modality": 2}, data=DATA)


def _judged(findings: list[Finding]) -> dict[str, Any]:
    assert findings and all(f.verdict == Verdict.PASS for f in findings), [(f.title, f.message) for f in findings]
    return {f.title.split(" ")[0]: f for f in findings}


@pytest.mark.check_contract("metrics_exposure", "clean")
def test_metrics_exposure_passes_mmchaos_serve_on_tiny_vlm_over_openai(served: OpenAITarget) -> None:
    assert served.capabilities == {"generate"}
    groups = _judged(_metrics(served))
    assert {"latency", "traffic", "errors", "guards", "queue", "tokens"} <= set(groups)
    tokens = groups["tokens"]
    assert tokens.evidence["traffic_kind"] == "chat" and set(tokens.evidence["conventions"]) == {"mmchaos", "vllm"}
    assert tokens.evidence["image_form"] == "chat"  # the chats carried images
    amounts = tokens.evidence["amounts"]
    assert amounts["answered"] == 4 and amounts["streamed"] == 2 and amounts["without_usage"] == 0
    grew = {r["series"].split("{")[0]: r["after"] - (r["before"] or 0) for r in tokens.evidence["series"]}
    # the server counts what it answered: streamed usage included (image tokens and all)
    assert grew["vllm:prompt_tokens_total"] == amounts["prompt_tokens"]
    assert grew["vllm:generation_tokens_total"] == amounts["completion_tokens"]
    assert groups["errors"].evidence["answers"]["malformed:400"] == 2


@pytest.mark.check_contract("metrics_exposure", "clean")
def test_metrics_exposure_passes_tiny_vlm_in_process(tiny_vlm: Target) -> None:
    groups = _judged(_metrics(tiny_vlm))
    assert {"latency", "queue", "tokens"} <= set(groups)
    assert groups["latency"].evidence["teardown"]["clean"]


STEP7 = {
    "name": "step7-chat",
    "seed": 0,
    "checks": [
        {"check": "metrics_exposure", "params": {"requests_per_modality": 2}},
        {"check": "generation_drift", "params": {"samples": 8, "max_tokens": 6, "perturbations": ["low_light"]}},
    ],
}


def test_validate_runs_step_7_against_the_served_vlm(served: OpenAITarget, run_cli: Any, tmp_path: Path) -> None:
    # what a user runs: the runner's capability filter used to skip metrics_exposure on a chat endpoint
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump(STEP7))
    code, _, err = run_cli(
        "validate", "--target", f"openai:{served.base_url}", "--model", "tiny-vlm", "--suite", str(suite),
        "--data", "builtin:vqa?n=8", "--out", str(tmp_path / "out"), "--store", str(tmp_path / "runs.db"),
    )  # fmt: skip
    assert code in (0, 1), err
    findings = json.loads((tmp_path / "out" / "results.json").read_text())["findings"]
    verdicts = {(f["check"], f["verdict"]) for f in findings}
    assert {check for check, _ in verdicts} == {"metrics_exposure", "generation_drift"}
    assert not [f["title"] for f in findings if f["verdict"] == "skipped"]
    assert ("metrics_exposure", "pass") in verdicts and ("metrics_exposure", "fail") not in verdicts
    drift = [f for f in findings if f["check"] == "generation_drift"]
    assert any("clean traffic" in f["title"] for f in drift)  # a drift check ran on the generated answers


def test_image_context_boundary_runs_over_openai_at_the_limit_the_server_states(
    served: OpenAITarget, tiny_vlm: Target
) -> None:
    assert served.context_tokens == getattr(tiny_vlm, "context_tokens", None) == 256
    [finding] = run_check_class(ImageContextBoundary, served, {}, data=DATA)
    assert finding.verdict == Verdict.PASS and "256-token limit" in finding.title
    assert finding.metrics["refused_over_limit"] > 0  # the served model refuses what does not fit, typed
