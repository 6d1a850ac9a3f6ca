"""reference_parity of generative deployments against the real checkpoint (``builtin:tiny-vlm`` as
``hf:`` loads it). Each deployment is a copy of the checkpoint directory with one real bug, as a
serving image or an export ships it (``tests/fakes/shipped_vlms.py``): it fails with the cause named;
an fp16-downcast copy passes with its logprob deviation reported; the checkpoint served by
``mmchaos serve``'s server over ``openai:`` passes."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from mmchaos.checks.base import CheckContext
from mmchaos.checks.integration.reference_parity import ReferenceParity
from mmchaos.data import load_dataset
from mmchaos.findings import Finding, Verdict
from mmchaos.server import ServerThread
from mmchaos.targets import TargetOptions, load_target
from mmchaos.targets.base import Target
from mmchaos.targets.generation import GenerationParams, Message
from mmchaos.targets.openai_wire import chat_content, completion_of
from mmchaos.tasks.parity import compare_tokens
from tests.fakes.shipped_vlms import ShippedVLMs

pytestmark = pytest.mark.integration

DATA = load_dataset("builtin:vqa?n=16&seed=3")
ALL = ("vqa:", "greedy", "batched")
"""The findings on a VLM: the VQA task score, greedy answers alone, the same prompts batched."""


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShippedVLMs]:
    loaded = ShippedVLMs(tmp_path_factory.mktemp)
    yield loaded
    loaded.close()


def _run(target: Target, reference: Target) -> dict[str, Finding]:
    """The findings by the title's first word (:data:`ALL`)."""
    ctx = CheckContext(target=target, dataset=DATA, seed=0, check_id="reference_parity", reference=reference)
    return {f.title.split(" ")[0]: f for f in ReferenceParity().run(ctx)}


@pytest.mark.check_contract("reference_parity", "broken")
def test_a_generation_config_naming_the_wrong_eos_fails_naming_stop_tokens(shipped: ShippedVLMs) -> None:
    found = _run(shipped("wrong_eos"), shipped("none"))
    greedy = found["greedy"]
    assert greedy.verdict is Verdict.FAIL and "stop/EOS tokens differ" in greedy.title, greedy.title
    assert greedy.metrics["deployment_length_share"] == 1.0 and greedy.metrics["reference_length_share"] == 0.0
    vqa = found["vqa:"]  # the task score names what the generation findings found
    assert vqa.verdict is Verdict.FAIL and vqa.metrics["deployment"] == 0.0 and "stop/EOS tokens differ" in vqa.title
    assert "eos_token_id" in (greedy.suggestion or "")


@pytest.mark.check_contract("reference_parity", "broken")
def test_right_padded_batching_fails_naming_the_padding_side(shipped: ShippedVLMs) -> None:
    found = _run(shipped("right_padding"), shipped("none"))
    assert found["greedy"].verdict is Verdict.PASS  # alone, the right-padded copy is the checkpoint
    batched = found["batched"]
    assert batched.verdict is Verdict.FAIL and batched.title.endswith(
        "right padding (the deployment pads batches on the right; decoder-only generation needs left)"
    ), batched.title
    assert batched.metrics["batched_greedy_match"] < 0.9 <= batched.metrics["alone_greedy_match"]
    assert "padding_side 'left'" in (batched.suggestion or "")
    assert found["vqa:"].verdict is Verdict.FAIL and found["vqa:"].evidence["cause"] == batched.evidence["cause"]


@pytest.mark.check_contract("reference_parity", "broken")
def test_a_served_chat_template_that_differs_fails_naming_the_template(shipped: ShippedVLMs) -> None:
    greedy = _run(shipped("chat_template"), shipped("none"))["greedy"]
    assert greedy.verdict is Verdict.FAIL
    assert "the chat template differs (a text-only prompt is" in greedy.title, greedy.title
    tokens = greedy.evidence["text_only_prompt_tokens"]
    assert tokens["deployment"] != tokens["reference"]


def test_an_fp16_downcast_copy_passes_with_its_deviation_reported(shipped: ShippedVLMs) -> None:
    found = _run(shipped("fp16"), shipped("none"))
    assert {k: f.verdict for k, f in found.items()} == dict.fromkeys(ALL, Verdict.PASS)
    greedy = found["greedy"]
    assert 0 < greedy.metrics["max_logprob_deviation"] < ReferenceParity.Gate().max_logprob_deviation
    assert "chosen-token logprobs differ by" in greedy.title


@pytest.mark.check_contract("reference_parity", "clean")
def test_the_checkpoint_served_over_openai_passes(shipped: ShippedVLMs) -> None:
    reference = shipped("none")
    with ServerThread(load_target("builtin:tiny-vlm")) as srv:
        served = load_target(f"openai:{srv.base_url}", TargetOptions())
        try:
            found = _run(served, reference)
        finally:
            served.close()
    assert {k: f.verdict for k, f in found.items()} == dict.fromkeys(ALL, Verdict.PASS), [
        f.title for f in found.values()
    ]
    assert found["greedy"].metrics["max_prompt_token_diff"] == 0


def test_the_server_gives_top_logprobs_that_parity_can_judge_by(shipped: ShippedVLMs) -> None:
    """mmchaos serve answers ``top_logprobs`` (vLLM's ``token_id:N`` form on request): what
    ``check_logprobs_close`` needs over HTTP, the same numbers the checkpoint gives in process."""
    checkpoint = shipped("none")
    sample = DATA[0]
    local = checkpoint.generate(sample.question or "", [sample.load_image()],
                                GenerationParams(max_new_tokens=8, top_logprobs=3)).completions[0]  # fmt: skip
    content = chat_content(Message("user", (sample.load_image(), sample.question or "")))
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0,
            "logprobs": True, "top_logprobs": 3, "return_tokens_as_token_ids": True}  # fmt: skip
    with ServerThread(checkpoint) as srv:
        answer = httpx.post(f"{srv.base_url}/chat/completions", json=body, timeout=60)
        refused = httpx.post(f"{srv.base_url}/chat/completions", json={**body, "logprobs": False}, timeout=60)
    assert answer.status_code == 200, answer.text
    served = completion_of(answer.json()["choices"][0])
    assert served.token_ids == local.token_ids and served.top_logprobs is not None
    assert all(len(step) == 3 and chosen in step for step, chosen in zip(served.top_logprobs, served.token_ids or ()))
    assert compare_tokens(served, local).equal
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "bad_generation_params"
