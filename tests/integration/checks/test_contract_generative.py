"""Step 1 on generative targets: the hostile corpus goes to ``generate`` in-process and to
``/v1/chat/completions`` over ``openai:``. A correct chat server (typed 400 for what it cannot
decode) passes; one that answers an undecodable image with 200 and empty content, and one whose
engine answers 500, fail on exactly the undecodable images."""

from __future__ import annotations

from typing import Any

import pytest

from mmchaos.checks.base import CheckContext
from mmchaos.checks.contract.contract import Contract, ContractParams
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Finding, Verdict
from mmchaos.targets import load_target
from tests.fakes.openai_server import FakeConfig, fake_openai_server

pytestmark = pytest.mark.integration

DATA = make_shapes(4, seed=1)
#: The undecodable images, the seed incident's int32 headers, a valid odd-mode one and hostile text
CASES = ["truncated_png", "random_bytes", "html_error_page", "int32_png_46341x46341", "mode_P", "text_empty",
         "text_invalid_*"]  # fmt: skip
UNDECODABLE = {"truncated_png", "random_bytes", "html_error_page", "int32_png_46341x46341"}


def run_contract(target: Any, **params: Any) -> list[Finding]:
    ctx = CheckContext(target=target, dataset=DATA, seed=0, check_id="contract")
    return list(Contract(ContractParams(**{"isolation": "inprocess", "cases": CASES, **params})).run(ctx))


def over_chat(bad_image: str) -> list[Finding]:
    config = FakeConfig(image_forms=(), chat_bad_image=bad_image)  # a chat-only VLM endpoint
    with fake_openai_server(config) as url:
        target = load_target(f"openai:{url}")
        try:
            found = run_contract(target)
        finally:
            target.close()
    assert any(r["path"] == "/v1/chat/completions" and isinstance(r["body"]["messages"][0]["content"], list)
               for r in config.requests)  # fmt: skip
    return found


@pytest.mark.check_contract("contract", "clean")
def test_a_chat_endpoint_that_refuses_undecodable_images_passes() -> None:
    *failures, summary = over_chat("")
    assert not failures, [(f.title, f.message) for f in failures]
    assert summary.verdict == Verdict.PASS and summary.metrics["n_cases"] >= len(CASES)
    assert summary.metrics["n_rejected"] >= len(UNDECODABLE) and summary.metrics["int32_cases_rejected"] == 1


@pytest.mark.check_contract("contract", "broken")
@pytest.mark.parametrize(("bad_image", "outcome", "words"), [
    ("empty", "garbage", "200 with empty content"), ("crash", "crashed", "500")])  # fmt: skip
def test_a_chat_endpoint_that_answers_or_crashes_on_undecodable_images_fails(
    bad_image: str, outcome: str, words: str
) -> None:
    found = over_chat(bad_image)
    failed = {f.evidence["case"]: f for f in found if f.verdict == Verdict.FAIL}
    assert set(failed) == UNDECODABLE, sorted(failed)
    assert all(f.evidence["outcome"] == outcome and words in f.evidence["detail"] for f in failed.values())


def test_the_reference_vlm_in_process_gets_the_corpus_and_rejects_the_int32_page() -> None:
    target = load_target("builtin:tiny-vlm")
    try:
        *failures, summary = run_contract(target, cases=[*CASES, "int32_*", "size_*"])
    finally:
        target.close()
    assert not failures, [(f.title, f.message) for f in failures]
    assert summary.metrics["int32_cases_rejected"] == summary.metrics["int32_cases"] >= 2
    assert summary.metrics["n_handled"] >= 2  # the valid ones were answered, not all refused


def fuzz_over_chat(bad_image: str) -> list[Finding]:
    from mmchaos.checks.contract.fuzz import ContractFuzz, ContractFuzzParams

    config = FakeConfig(image_forms=(), chat_bad_image=bad_image)
    with fake_openai_server(config) as url:
        target = load_target(f"openai:{url}")
        try:
            ctx = CheckContext(target=target, dataset=DATA, seed=0, check_id="contract_fuzz")
            params = ContractFuzzParams(isolation="inprocess", max_cases=80, max_seconds=30.0, openapi=False,
                                        minimise_tests=20)  # fmt: skip
            return list(ContractFuzz(params).run(ctx))
        finally:
            target.close()


@pytest.mark.check_contract("contract_fuzz", "broken")
def test_the_fuzzer_finds_a_chat_endpoint_answering_broken_images_with_empty_content() -> None:
    found = fuzz_over_chat("empty")
    sigs = {f.evidence.get("signature", "") for f in found if f.verdict == Verdict.FAIL}
    assert "image_bytes:garbage:empty_answer" in sigs, [(f.title, f.message) for f in found]


@pytest.mark.check_contract("contract_fuzz", "clean")
def test_the_fuzzer_passes_a_chat_endpoint_that_refuses_broken_images() -> None:
    found = fuzz_over_chat("")
    assert not [f for f in found if f.verdict == Verdict.FAIL], [(f.title, f.message) for f in found]
    assert any(f.verdict == Verdict.PASS for f in found)
