"""The serving suite's image traffic speaks the image form the ``openai:`` probe found.

Against FAKES of correct OpenAI-compatible embeddings servers on loopback (tests/fakes/openai_server.py;
vLLM, LiteLLM and infinity cannot run here), one per form: vLLM's ``messages``, ``input`` content
parts, data-URL strings in ``input`` (LiteLLM-style; it answers the ``messages`` form with a typed
400 ``bad_request``), and the same strings with ``"modality": "image"`` (infinity's form). Before
the builders, every serving experiment sent images in the ``messages`` form, and a correct data-URL
server failed ``serving_poison``'s steady state on mmchaos's own requests.
"""

from __future__ import annotations

from typing import Any

import pytest

from mmchaos.checks.serving.faults import ServingFaults
from mmchaos.checks.serving.overload import ServingOverload
from mmchaos.checks.serving.poison import ServingPoison
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Finding, Verdict
from mmchaos.targets.base import Capability
from mmchaos.targets.openai_http import OpenAITarget
from tests.fakes.openai_server import FakeConfig, fake_openai_server
from tests.support import run_check_class
from tests.support.serving import FAST

pytestmark = pytest.mark.integration

DATA = make_shapes(8, seed=3)
IMAGE_POISONS = ["malformed_base64", "garbage_image", "truncated_png", "declared_huge", "huge_image"]
POISON: dict[str, Any] = {**FAST, "poisons": [*IMAGE_POISONS, "invalid_json"], "huge_side": 1536, "poison_s": 3.0}
# The fake's name for each form, and the probe's.
FORMS = {"messages": "messages", "input_parts": "input", "data_url": "data_url", "modality": "modality"}


def journal(findings: list[Finding]) -> dict[str, Any]:
    [f] = [f for f in findings if "journal" in f.evidence]
    return dict(f.evidence["journal"])


def image_requests(config: FakeConfig) -> list[dict[str, Any]]:
    """The embeddings bodies the fake received that carried an image, in any form."""
    out = []
    for r in config.requests:
        body = r["body"]
        items = body.get("input") if isinstance(body.get("input"), list) else [body.get("input")]
        if r["path"] == "/v1/embeddings" and (
            "messages" in body or any(isinstance(i, dict) or str(i).startswith("data:") for i in items)
        ):
            out.append(body)
    return out


def form_of(body: dict[str, Any]) -> str:
    if "messages" in body:
        return "messages"
    if body.get("modality") == "image":
        return "modality"
    return "input_parts" if isinstance(body["input"][0], dict) else "data_url"


@pytest.mark.check_contract("serving_poison", "clean")
@pytest.mark.check_contract("serving_faults", "clean")
@pytest.mark.check_contract("serving_overload", "clean")
@pytest.mark.parametrize("fake_form", list(FORMS))
def test_a_correct_server_of_each_image_form_passes_the_serving_image_traffic(fake_form: str) -> None:
    config = FakeConfig(image_forms=(fake_form,), chat=False)
    with fake_openai_server(config) as url:
        target = OpenAITarget.connect(url)
        try:
            assert target.image_input == FORMS[fake_form] and Capability.EMBED_IMAGE in target.capabilities
            config.requests.clear()  # what the probe sent is not the experiments' traffic
            poison = run_check_class(ServingPoison, target, POISON, data=DATA)
            faults = run_check_class(
                ServingFaults,
                target,
                {**FAST, "faults": ["latency"], "levels": ["moderate"], "fault_s": 0.4},
                data=DATA,
            )
            ramp = {**FAST, "concurrency_steps": [1, 2], "step_s": 0.5, "budget": {**FAST["budget"], "max_rate": 400}}
            overload = run_check_class(ServingOverload, target, ramp, {"min_knee_concurrency": 1}, data=DATA)
        finally:
            target.close()
    for findings in (poison, faults, overload):
        bad = [f"{f.check}: {f.title}" for f in findings if f.verdict != Verdict.PASS]
        assert not bad, bad
        traffic = journal(findings)["experiment"]["traffic"]
        assert traffic["image_form"] == FORMS[fake_form] and traffic["images"] is True
        assert "probed" in traffic["image_form_source"]
    sent = image_requests(config)
    assert len(sent) > 20, "the experiments sent image traffic"
    assert {form_of(b) for b in sent} == {fake_form}, "every image request, good or poison, in the probed form"
    by = {f.evidence.get("poison"): f for f in poison if "poison" in f.evidence}
    assert set(IMAGE_POISONS) <= set(by)
    for kind in ("malformed_base64", "garbage_image", "truncated_png", "declared_huge"):
        assert by[kind].evidence["outcomes"] and all(k.startswith("400:") for k in by[kind].evidence["outcomes"])


@pytest.mark.check_contract("serving_poison", "broken")
def test_a_data_url_server_whose_engine_dies_on_a_large_image_still_fails_poison_isolation() -> None:
    config = FakeConfig(image_forms=("data_url",), chat=False, dies_on_side=1024)
    with fake_openai_server(config) as url:
        target = OpenAITarget.connect(url)
        try:
            assert target.image_input == "data_url"
            findings = run_check_class(
                ServingPoison, target, {**POISON, "poisons": ["huge_image", "invalid_json"]}, data=DATA
            )
        finally:
            target.close()
    [iso] = [f for f in findings if f.title.startswith("isolation")]
    assert iso.verdict == Verdict.FAIL and iso.metrics["good_success_rate"] < 1.0
    assert any(k.startswith("http_5xx") for k in iso.evidence["good_failures"]), iso.evidence["good_failures"]
    [huge] = [f for f in findings if f.evidence.get("poison") == "huge_image"]
    assert huge.verdict == Verdict.FAIL and huge.metrics["answers_5xx"] >= 1
    [exp] = [f for f in findings if "journal" in f.evidence]
    assert exp.verdict == Verdict.FAIL, exp.title  # the service broke: a failure, not a harness error
    assert journal(findings)["steady_states"]["before"]["steady_state_met"]


def test_good_traffic_the_endpoint_refuses_is_named_a_harness_problem_not_a_resilience_failure() -> None:
    """The defect as a user met it: images sent in vLLM's form to a server that takes data-URL strings
    (here by declaring the wrong form, as the experiments used to send it whatever the probe found)."""
    config = FakeConfig(image_forms=("data_url",), chat=False)
    with fake_openai_server(config) as url:
        target = OpenAITarget(
            url, model="fake-vlm", capabilities=[Capability.EMBED_IMAGE, Capability.EMBED_TEXT], image_input="messages"
        )
        try:
            findings = run_check_class(ServingPoison, target, {**POISON, "poisons": ["invalid_json"]}, data=DATA)
        finally:
            target.close()
    [exp] = findings
    assert exp.verdict == Verdict.ERROR, exp.title
    assert "steady state did not hold before any fault" in exp.title
    assert "x HTTP 400 bad_request" in exp.title and "harness or configuration problem" in exp.title
    before = journal(findings)["steady_states"]["before"]
    assert before["harness_problem"] is True
    failed = before["failed_good_requests"]
    assert set(failed["status_codes"]) == {"400"} and set(failed["error_codes"]) == {"400:bad_request"}
    assert failed["count"] == failed["status_codes"]["400"] > 0
    traffic = journal(findings)["experiment"]["traffic"]
    assert traffic["image_form"] == "messages" and "declared" in traffic["image_form_source"]
