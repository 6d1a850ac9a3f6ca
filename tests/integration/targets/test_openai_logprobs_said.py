"""A chat endpoint that ignores ``logprobs`` (transformers serve, Ollama) is named so in the report,
and no check claims a logprob measurement it did not make; one that gives them is not flagged."""

from __future__ import annotations

import pytest

from mmchaos.checks.engine.generation_batch_invariance import GenerationBatchInvariance
from mmchaos.checks.integration.modality_coverage import ModalityCoverage
from mmchaos.data.shapes import make_shapes
from mmchaos.targets import load_target
from tests.fakes.openai_server import FakeConfig, fake_openai_server
from tests.support import run_check_class

pytestmark = pytest.mark.integration

DATA = make_shapes(6, seed=2)


@pytest.mark.parametrize(
    ("flavour", "refuse", "said"),
    [("ollama", False, "ignored"), ("openai", True, "refused"), ("openai", False, "given")],
)
def test_what_the_endpoint_does_with_logprobs_is_said(flavour: str, refuse: bool, said: str) -> None:
    with fake_openai_server(FakeConfig(flavour=flavour, refuse_logprobs=refuse)) as url:
        target = load_target(f"openai:{url}", {"model": "fake-vlm" if flavour == "ollama" else None})
        try:
            assert target.describe()["endpoint"]["logprobs"] == said
            (coverage,) = run_check_class(ModalityCoverage, target, {}, data=DATA)
            (invariance,) = run_check_class(GenerationBatchInvariance, target, {"probes": 1, "runs": 1}, data=DATA)
        finally:
            target.close()
    assert coverage.verdict.value == "pass"
    assert (f"{said[:-1]}s logprobs" in coverage.title) is (said != "given")  # ignores / refuses
    assert ("max_logprob_deviation" in invariance.metrics) is (said == "given")
    assert ("no logprobs" in invariance.title) is (said != "given")
