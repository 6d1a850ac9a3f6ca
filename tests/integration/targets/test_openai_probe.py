"""The ``openai:`` target against a FAKE OpenAI-compatible server on loopback (vLLM, LiteLLM and
infinity-style servers cannot run here; see tests/fakes/openai_server.py): the image probe tries
every known form and records which one works, an untested modality is a visible warning, and chat
generation speaks ``/v1/chat/completions`` with image parts, n, max_tokens, seed, stop, logprobs
and SSE streaming."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mmchaos.checks.base import CheckContext
from mmchaos.checks.integration.modality_coverage import ModalityCoverage
from mmchaos.data import load_dataset
from mmchaos.errors import TargetCallError
from mmchaos.findings import Verdict
from mmchaos.targets import load_target
from mmchaos.targets.base import Capability
from mmchaos.targets.generation import GenerationParams, Message
from mmchaos.targets.openai_http import OpenAITarget
from tests.fakes.openai_server import FakeConfig, fake_openai_server, image_vector

pytestmark = pytest.mark.integration

RED = np.zeros((16, 16, 3), np.uint8)
RED[..., 0] = 200
BLUE = np.zeros((16, 16, 3), np.uint8)
BLUE[..., 2] = 200


def run_coverage(target: OpenAITarget) -> list[Verdict]:
    ctx = CheckContext(target=target, dataset=load_dataset("builtin:shapes"), seed=0, check_id="modality_coverage")
    return [f.verdict for f in ModalityCoverage().run(ctx)]


# -- the image probe (issue 11: "the openai: image probe only knows vLLM's messages form") ----------


def test_images_as_data_urls_in_input_are_detected_like_litellm_and_infinity_take_them() -> None:
    config = FakeConfig(image_forms=("data_url",), chat=False)
    with fake_openai_server(config) as url:
        target = load_target(f"openai:{url}")
        try:
            assert isinstance(target, OpenAITarget)
            assert Capability.EMBED_IMAGE in target.capabilities
            assert target.image_input == "data_url"
            probe = target.describe()["endpoint"]["probe"]["image"]
            assert [p["form"] for p in probe] == ["messages", "input", "data_url"]
            assert [p["ok"] for p in probe] == [False, False, True]
            assert "HTTP 400" in probe[0]["outcome"]
            np.testing.assert_allclose(target.embed_images([RED])[0], image_vector_of(RED), atol=1e-6)
            assert target.untested_modalities() == {}
            assert run_coverage(target) == [Verdict.PASS]
        finally:
            target.close()


def test_infinitys_modality_form_is_probed_recorded_and_used() -> None:
    # infinity embeds a data-URL string as text unless the body says "modality": "image" (issue 20)
    config = FakeConfig(image_forms=("modality",), chat=False)
    with fake_openai_server(config) as url:
        target = load_target(f"openai:{url}")
        try:
            assert isinstance(target, OpenAITarget)
            assert Capability.EMBED_IMAGE in target.capabilities and target.image_input == "modality"
            probe = target.describe()["endpoint"]["probe"]["image"]
            assert [p["form"] for p in probe] == ["messages", "input", "data_url", "modality"]
            assert [p["ok"] for p in probe] == [False, False, False, True]
            assert "read as text" in probe[2]["outcome"]  # the plain data URL: embedded as a string
            config.requests.clear()
            np.testing.assert_allclose(
                target.embed_images([RED, BLUE]), [image_vector_of(RED), image_vector_of(BLUE)], atol=1e-6
            )
            [sent] = config.requests
            assert sent["body"]["modality"] == "image" and len(sent["body"]["input"]) == 2  # batched
            assert target.untested_modalities() == {}
            assert run_coverage(target) == [Verdict.PASS]
        finally:
            target.close()


def image_vector_of(image: np.ndarray) -> list[float]:
    from mmchaos.targets.openai_http import data_url, png_bytes

    return image_vector(data_url(png_bytes(image)))


def test_the_vllm_and_mmchaos_forms_are_still_found() -> None:
    for form, expected in (("messages", "messages"), ("input_parts", "input")):
        with fake_openai_server(FakeConfig(image_forms=(form,), chat=False)) as url:
            target = load_target(f"openai:{url}")
            assert target.image_input == expected and Capability.EMBED_IMAGE in target.capabilities  # type: ignore[attr-defined]
            target.close()


def test_a_server_that_takes_no_images_is_text_only_and_the_run_says_so() -> None:
    # A text-only server embeds a data URL string as text: the probe must not call that an image.
    config = FakeConfig(image_forms=(), chat=False)
    with fake_openai_server(config) as url:
        target = load_target(f"openai:{url}")
        try:
            assert target.capabilities == {Capability.EMBED_TEXT}
            gaps = target.untested_modalities()
            assert set(gaps) == {"image embeddings"}
            assert "data_url" in gaps["image embeddings"] and "encodings" in gaps["image embeddings"]
            assert run_coverage(target) == [Verdict.WARN]  # type: ignore[arg-type]
        finally:
            target.close()


def test_strict_turns_the_untested_modality_warning_into_exit_1(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    suite = tmp_path / "coverage.yaml"
    suite.write_text("name: coverage\nchecks:\n  - check: modality_coverage\n")
    with fake_openai_server(FakeConfig(image_forms=(), chat=False)) as url:
        common = ["validate", "--target", f"openai:{url}", "--suite", str(suite), "--store", str(tmp_path / "s.db")]
        code, _, _ = run_cli(*common, "--out", str(tmp_path / "a"))
        assert code == 0
        code, _, _ = run_cli(*common, "--out", str(tmp_path / "b"), "--strict")
        assert code == 1


# -- chat generation ----------------------------------------------------------------------------------


@pytest.fixture()
def chat_server() -> object:
    config = FakeConfig(image_forms=("data_url",), chat=True, chat_images=True)
    with fake_openai_server(config) as url:
        yield url, config


def test_chat_generation_capability_is_probed_with_an_image(chat_server: tuple[str, FakeConfig]) -> None:
    url, _ = chat_server
    target = load_target(f"openai:{url}")
    assert Capability.GENERATE in target.capabilities
    probe = target.describe()["endpoint"]["probe"]
    assert probe["chat_image"]["ok"] is True
    assert target.untested_modalities() == {}
    target.close()


def test_chat_generation_sends_image_parts_and_params(chat_server: tuple[str, FakeConfig]) -> None:
    url, config = chat_server
    target = load_target(f"openai:{url}")
    result = target.generate("what colour", [RED, BLUE], GenerationParams(max_new_tokens=3))
    assert result.text == "red blue what" and result.finish_reason == "length"
    assert result.logprobs == pytest.approx((-0.1, -0.2, -0.3)) and result.prompt_tokens == 7
    body = config.requests[-1]["body"]
    parts = body["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["image_url", "image_url", "text"]
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert body["max_tokens"] == 3 and body["temperature"] == 0.0 and body["n"] == 1 and body["logprobs"] is True
    assert "seed" not in body and "stop" not in body

    sampled = GenerationParams(max_new_tokens=8, temperature=1.0, seed=5, n=3, stop=("zzz",))
    one = target.generate("a b c d e", [RED], sampled)
    two = target.generate("a b c d e", [RED], sampled)
    assert len(one.completions) == 3 and [c.text for c in one.completions] == [c.text for c in two.completions]
    assert config.requests[-1]["body"]["seed"] == 5 and config.requests[-1]["body"]["stop"] == ["zzz"]
    assert all(c.finish_reason == "stop" for c in one.completions)
    target.close()


def test_batches_are_concurrent_requests_answered_in_order(chat_server: tuple[str, FakeConfig]) -> None:
    url, _ = chat_server
    target = load_target(f"openai:{url}")
    requests = [[Message("user", (RED, "one"))], [Message("user", (BLUE, "two"))], "three", "four five"]
    results = target.generate_batch(requests, GenerationParams(max_new_tokens=8))
    assert [r.text for r in results] == ["red one", "blue two", "three", "four five"]
    target.close()


def test_chat_multi_turn_and_stop(chat_server: tuple[str, FakeConfig]) -> None:
    url, config = chat_server
    target = load_target(f"openai:{url}")
    chat = [Message("system", "be brief"), Message("user", (BLUE, "first")), Message("assistant", "blue"),
            Message("user", (RED, "and this one"))]  # fmt: skip
    result = target.generate(chat, params=GenerationParams(max_new_tokens=16, stop=(" this",)))
    assert result.text == "blue red and" and result.finish_reason == "stop"
    roles = [m["role"] for m in config.requests[-1]["body"]["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    assert config.requests[-1]["body"]["messages"][2]["content"] == "blue"
    target.close()


def test_streaming_deltas_concatenate_to_the_text(chat_server: tuple[str, FakeConfig]) -> None:
    url, config = chat_server
    target = load_target(f"openai:{url}")
    params = GenerationParams(max_new_tokens=4)
    deltas = list(target.generate_stream("one two three four five", [RED], params))
    assert config.requests[-1]["body"]["stream"] is True
    assert len(deltas) == 4 and "".join(deltas) == target.generate("one two three four five", [RED], params).text
    with pytest.raises(TargetCallError):
        list(target.generate_stream("x", params=GenerationParams(n=2)))
    target.close()


def test_a_chat_server_that_refuses_images_is_a_visible_gap() -> None:
    with fake_openai_server(FakeConfig(image_forms=(), chat=True, chat_images=False)) as url:
        target = load_target(f"openai:{url}")
        assert Capability.GENERATE in target.capabilities
        assert set(target.untested_modalities()) == {"image embeddings", "image chat"}
        with pytest.raises(TargetCallError) as info:
            target.generate("what colour", [RED])
        assert info.value.code == "bad_request"
        assert target.generate("hello there").text == "hello there"
        target.close()


@pytest.mark.parametrize(("fault", "code"), [("truncate", "stream_truncated"), ("error", "stream_error")])
def test_a_broken_stream_is_an_endpoint_error(fault: str, code: str) -> None:
    from mmchaos.targets.openai_http import EndpointError

    with fake_openai_server(FakeConfig(stream_fault=fault)) as url:
        target = load_target(f"openai:{url}")
        with pytest.raises(EndpointError) as info:
            list(target.generate_stream("one two three four", [RED], GenerationParams(max_new_tokens=8)))
        assert info.value.code == code
        target.close()


def test_a_stream_that_ends_with_its_finish_reason_and_no_done_is_complete() -> None:
    """transformers serve's shape: the finish_reason chunk, then the connection closes."""
    with fake_openai_server(FakeConfig(stream_fault="no_done")) as url:
        target = load_target(f"openai:{url}")
        params = GenerationParams(max_new_tokens=8)
        streamed = "".join(target.generate_stream("one two three four", [RED], params))
        assert streamed == target.generate("one two three four", [RED], params).text == "red one two three four"
        target.close()


def test_servers_that_ignore_n_or_refuse_logprobs_still_give_n_seeded_completions() -> None:
    config = FakeConfig(ignore_n=True, refuse_logprobs=True)
    with fake_openai_server(config) as url:
        target = load_target(f"openai:{url}")
        params = GenerationParams(max_new_tokens=8, temperature=1.0, seed=5, n=3)
        one = target.generate("a b c d e f", [RED], params)
        assert len(one.completions) == 3 and one.extra["n_emulated_requests"] == 2
        assert len({c.text for c in one.completions}) > 1  # different seeds, different samples
        assert [c.text for c in target.generate("a b c d e f", [RED], params).completions] == [
            c.text for c in one.completions
        ]
        assert all(c.logprobs is None for c in one.completions) and target.chat_logprobs is False
        seeds = [r["body"].get("seed") for r in config.requests[-3:]]
        assert seeds == [5, 6, 7] and not any("logprobs" in r["body"] for r in config.requests[-3:])
        target.close()
