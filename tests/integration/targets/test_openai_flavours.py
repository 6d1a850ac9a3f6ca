"""Capability discovery and chat against FAKES of the response shapes of real servers (SGLang and
older vLLM, TGI, Ollama, LiteLLM; none can run here, see tests/fakes/openai_server.py): their error
bodies, finish reasons, model listings and image part forms must not break the ``openai:`` target."""

from __future__ import annotations

import numpy as np
import pytest

from mmchaos.errors import TargetCallError
from mmchaos.targets import TargetOptions, load_target
from mmchaos.targets.base import Capability
from mmchaos.targets.generation import GenerationParams, Message
from mmchaos.targets.openai_http import OpenAITarget
from tests.fakes.openai_server import FakeConfig, fake_openai_server

pytestmark = pytest.mark.integration

RED = np.zeros((16, 16, 3), np.uint8)
RED[..., 0] = 200
FLAVOURS = ("openai", "sglang", "tgi", "ollama", "litellm")


def _target(url: str, model: str | None = None) -> OpenAITarget:
    target = load_target(f"openai:{url}", TargetOptions(model=model))
    assert isinstance(target, OpenAITarget)
    return target


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_chat_with_images_is_discovered_on_every_server_family(flavour: str) -> None:
    config = FakeConfig(image_forms=(), flavour=flavour)
    with fake_openai_server(config) as url:
        target = _target(url, "fake-vlm" if flavour == "ollama" else None)
        try:
            assert Capability.GENERATE in target.capabilities and "image chat" not in target.untested_modalities()
            result = target.generate([Message("user", (RED, "name it"))], params=GenerationParams(max_new_tokens=4))
            assert result.text == "red name it" and result.finish_reason == "stop"  # TGI's eos_token is a stop
            assert result.prompt_tokens == 6
        finally:
            target.close()


@pytest.mark.parametrize("flavour", ["sglang", "tgi", "ollama", "litellm"])
def test_a_refusal_keeps_the_servers_message_whatever_the_error_shape(flavour: str) -> None:
    config = FakeConfig(image_forms=(), flavour=flavour, chat_images=False)
    with fake_openai_server(config) as url:
        target = _target(url, "fake-vlm" if flavour == "ollama" else None)
        try:
            assert "image chat" in target.untested_modalities()
            with pytest.raises(TargetCallError) as info:
                target.generate([Message("user", (RED, "name it"))])
            assert "this model does not take images" in info.value.message
            assert info.value.code == ("validation" if flavour == "tgi" else "http_400")
        finally:
            target.close()


@pytest.mark.parametrize("flavour", ["sglang", "tgi", "litellm"])
def test_a_server_refusing_logprobs_is_asked_again_without_whatever_the_error_shape(flavour: str) -> None:
    config = FakeConfig(image_forms=(), flavour=flavour, refuse_logprobs=True)
    with fake_openai_server(config) as url:
        target = _target(url)
        try:
            result = target.generate("a b c", params=GenerationParams(max_new_tokens=3))
            assert result.text == "a b c" and result.completions[0].logprobs is None
            assert target.chat_logprobs is False
        finally:
            target.close()


def test_sglang_token_ids_in_logprobs_become_the_completions_token_ids() -> None:
    with fake_openai_server(FakeConfig(image_forms=(), flavour="sglang")) as url:
        target = _target(url)
        try:
            result = target.generate("ab cd", params=GenerationParams(max_new_tokens=4))
            assert result.token_ids == (ord("a") + ord("b"), ord("c") + ord("d"))
            assert result.logprobs == pytest.approx((-0.1, -0.2))
        finally:
            target.close()


def test_ollama_takes_a_model_name_without_its_tag_and_gives_no_logprobs() -> None:
    config = FakeConfig(image_forms=(), flavour="ollama")
    with fake_openai_server(config) as url:
        target = _target(url, "fake-vlm")
        try:
            assert target.model == "fake-vlm:latest"
            sampled = target.generate("a b c d", params=GenerationParams(temperature=1.0, seed=3, n=2))
            assert len(sampled.completions) == 2 and sampled.extra["n_emulated_requests"] == 1
            assert all(c.logprobs is None for c in sampled.completions)
        finally:
            target.close()
        with pytest.raises(Exception, match="serves several models"):
            _target(url)
