"""A check that asks for logprobs says so when the server gave none, and claims no logprob number
it did not measure (issue 20: "reports do not say when a server ignored logprobs").

Against FAKE OpenAI-compatible chat servers on loopback (tests/fakes/openai_server.py): an
Ollama-style one answers without logprobs, another refuses them (the ``openai:`` target asks
again without), and a vLLM-style one gives them.
"""

from __future__ import annotations

from typing import Any

import pytest

from mmchaos.checks.base import Check
from mmchaos.checks.engine.generation_batch_invariance import GenerationBatchInvariance
from mmchaos.checks.integration.determinism import Determinism
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Finding, Verdict
from mmchaos.targets.openai_http import OpenAITarget
from tests.fakes.openai_server import FakeConfig, fake_openai_server
from tests.support import run_check_class

DATA = make_shapes(8, seed=2)
CHECKS: list[tuple[type[Check[Any, Any]], dict[str, Any]]] = [
    (GenerationBatchInvariance, {"probes": 2, "runs": 1, "batch_size": 2, "max_new_tokens": 4}),
    (Determinism, {"generate_requests": 2, "seeds": [], "max_new_tokens": 4}),
]


def run_all(config: FakeConfig) -> list[Finding]:
    with fake_openai_server(config) as url:
        target = OpenAITarget.connect(url, model="fake-vlm", capabilities=["generate"])
        try:
            return [f for cls, params in CHECKS for f in run_check_class(cls, target, params, data=DATA)]
        finally:
            target.close()


@pytest.mark.parametrize(
    ("config", "how"),
    [
        (FakeConfig(image_forms=(), flavour="ollama"), "the server ignored logprobs"),
        (FakeConfig(image_forms=(), refuse_logprobs=True), "the server refused logprobs"),
    ],
)
def test_a_server_without_logprobs_is_named_and_no_logprob_number_is_claimed(config: FakeConfig, how: str) -> None:
    findings = run_all(config)
    assert {f.check for f in findings} == {"generation_batch_invariance", "determinism"}
    for f in findings:
        assert f.verdict == Verdict.PASS, f.title
        note = f.evidence["logprobs"]
        assert note["given"] == 0 and note["asked"] > 0 and note["note"].startswith(how), note
        assert "gave no logprobs" in f.title and "logprob deviation" not in f.title
        assert not {"max_logprob_deviation", "max_logprob_diff"} & set(f.metrics)


def test_missing_modality_says_its_confidence_was_not_measured_without_logprobs() -> None:
    from mmchaos.checks.robustness.missing_modality import MissingModality

    params = {"questions": 1, "max_new_tokens": 4}
    for config, noted in ((FakeConfig(image_forms=(), flavour="ollama"), True), (FakeConfig(image_forms=()), False)):
        with fake_openai_server(config) as url:
            target = OpenAITarget.connect(url, model="fake-vlm", capabilities=["generate"])
            try:
                findings = run_check_class(MissingModality, target, params, data=DATA)
            finally:
                target.close()
        probed = [f for f in findings if f.evidence.get("call") == "generate" and "answers" in f.evidence]
        assert probed, [f.title for f in findings]
        for f in probed:
            assert ("logprobs" in f.evidence) is noted, f.evidence
            assert ("confident_hallucination_rate" in f.metrics) is not noted


def test_a_server_that_gives_logprobs_gets_its_measurement() -> None:
    findings = run_all(FakeConfig(image_forms=()))
    for f in findings:
        assert f.evidence["logprobs"]["given"] == f.evidence["logprobs"]["asked"] > 0
        assert "note" not in f.evidence["logprobs"] and "gave no logprobs" not in f.title
    [batch] = [f for f in findings if f.check == "generation_batch_invariance"]
    assert "max logprob deviation 0" in batch.title and batch.metrics["max_logprob_deviation"] == 0.0
