"""The ``generate`` capability's types and defaults: parameters validated at the boundary, prompt and
chat normalisation, the base class's refusal, and the delegating wrapper passing calls through."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from mmchaos.errors import CapabilityError, TargetCallError
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import (
    Completion,
    GenerationParams,
    GenerationResult,
    Message,
    as_messages,
    cut_at_stop,
)
from mmchaos.targets.hf_vlm import is_generative_config
from mmchaos.targets.wrappers import DelegatingTarget

IMG = np.zeros((8, 8, 3), np.uint8)


class EchoGenerator(Target):
    """Answers with the number of images and the last text part: a target with just ``generate``."""

    uri = "test:echo"
    capabilities = frozenset({Capability.GENERATE})

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[np.ndarray] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        messages = as_messages(prompt, images)
        n = sum(len(m.images()) for m in messages)
        last = [p for p in messages[-1].parts() if isinstance(p, str)][-1]
        return GenerationResult((Completion(f"{n}:{last}", "stop"),))


def test_the_base_target_refuses_generation_with_a_capability_error() -> None:
    target = Target()
    target.uri = "test:none"
    with pytest.raises(CapabilityError) as info:
        target.generate("hello")
    assert info.value.code == "capability_missing" and "cannot generate" in str(info.value)
    with pytest.raises(CapabilityError):
        list(target.generate_stream("hello"))
    assert Capability("generate") is Capability.GENERATE


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_new_tokens": 0},
        {"temperature": -1.0},
        {"temperature": float("nan")},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"n": 0},
        {"stop": "x"},  # a bare string would be iterated character by character
        {"stop": ("",)},
    ],
)
def test_bad_generation_params_are_typed_refusals(kwargs: dict[str, object]) -> None:
    with pytest.raises(TargetCallError) as info:
        GenerationParams(**kwargs)  # type: ignore[arg-type]
    assert info.value.code == "bad_generation_params"


def test_defaults_are_greedy_with_logprobs() -> None:
    params = GenerationParams()
    assert params.greedy and params.n == 1 and params.logprobs
    assert not GenerationParams(temperature=0.7, seed=1).greedy


def test_a_prompt_with_images_is_one_user_message_images_first() -> None:
    (message,) = as_messages("what is it?", [IMG, IMG])
    assert message.role == "user"
    assert len(message.images()) == 2 and message.parts()[-1] == "what is it?"
    assert as_messages("plain")[0].content == "plain"


def test_bad_chats_are_typed_refusals() -> None:
    with pytest.raises(TargetCallError, match="not both") as info:
        as_messages([Message("user", "x")], [IMG])
    assert info.value.code == "bad_messages"
    for bad in ([], [Message("robot", "x")], ["not a message"]):  # type: ignore[arg-type, list-item]
        with pytest.raises(TargetCallError) as info:
            as_messages(bad)  # type: ignore[arg-type]
        assert info.value.code == "bad_messages"
    with pytest.raises(TargetCallError) as info:
        as_messages([Message("user", (np.zeros((4, 4), np.uint8), "grey?"))])
    assert info.value.code == "image_bad_shape"
    with pytest.raises(TargetCallError) as info:
        as_messages([Message("user", (b"png bytes", "?"))])  # type: ignore[arg-type]
    assert info.value.code == "bad_content_part"


def test_cut_at_stop_takes_the_earliest_stop() -> None:
    assert cut_at_stop("a red circle. Next", (".", "circle")) == ("a red ", True)
    assert cut_at_stop("no stop here", ("!",)) == ("no stop here", False)


def test_multi_turn_multi_image_reach_the_target_in_order() -> None:
    chat = [Message("user", (IMG, "first?")), Message("assistant", "one"), Message("user", (IMG, IMG, "second?"))]
    result = EchoGenerator().generate(chat)
    assert result.text == "3:second?" and result.finish_reason == "stop"
    assert result.token_ids is None and result.logprobs is None


def test_the_delegating_wrapper_passes_generate_through_its_call_hook() -> None:
    calls: list[str] = []

    class Counting(DelegatingTarget):
        def call(self, fn, *args):  # type: ignore[no-untyped-def]
            calls.append(fn.__name__)
            return fn(*args)

    wrapped = Counting(EchoGenerator())
    assert wrapped.has(Capability.GENERATE)
    assert wrapped.generate("hi", [IMG]).text == "1:hi"
    assert calls == ["generate"]
    assert "".join(wrapped.generate_stream("hi")) == "0:hi"  # the base default: one delta, the whole text
    with pytest.raises(TargetCallError):
        list(wrapped.generate_stream("hi", params=GenerationParams(n=2)))


@pytest.mark.parametrize(
    ("config", "generative"),
    [
        ({"architectures": ["CLIPModel"], "model_type": "clip"}, False),
        ({"architectures": ["BlipForImageTextRetrieval"], "model_type": "blip"}, False),
        ({"architectures": ["SiglipModel"], "model_type": "siglip"}, False),
        ({"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava"}, True),
        ({"architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl"}, True),
        ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, True),  # refused by the VLM loader
        ({"model_type": "idefics3", "text_config": {}, "vision_config": {}}, True),
        ({"model_type": "clip", "text_config": {}, "vision_config": {}}, False),
    ],
)
def test_hf_dispatch_sends_generation_heads_to_the_vlm_loader(config: dict[str, object], generative: bool) -> None:
    assert is_generative_config(config) is generative


def test_oversized_images_are_refused_from_their_shape_before_any_copy() -> None:
    giant = np.broadcast_to(np.zeros((1, 1, 3), np.uint8), (20000, 20000, 3))  # 1.2 GB if materialised
    for call in (lambda: as_messages("what?", [giant], max_pixels=89_478_485),
                 lambda: as_messages([Message("user", ("a", IMG, giant))], max_pixels=89_478_485)):  # fmt: skip
        with pytest.raises(TargetCallError) as info:
            call()
        assert info.value.code == "image_too_large" and "image" in str(info.value)


def test_generate_batch_defaults_to_one_request_at_a_time_through_wrappers() -> None:
    calls: list[str] = []

    class Counting(DelegatingTarget):
        def call(self, fn, *args):  # type: ignore[no-untyped-def]
            calls.append(fn.__name__)
            return fn(*args)

    results = Counting(EchoGenerator()).generate_batch(["a", [Message("user", (IMG, IMG, "b"))]])
    assert [r.text for r in results] == ["0:a", "2:b"] and calls == ["generate_batch"]
