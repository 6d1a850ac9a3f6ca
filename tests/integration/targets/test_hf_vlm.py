"""``hf:`` generative VLMs: one tiny random model per family, built from config here (no downloads),
loaded through ``load_target`` and answered through the family's real processor (image-token
expansion), saved chat template and ``generate``."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mmchaos.errors import TargetCallError, TargetLoadError
from mmchaos.targets import load_target
from mmchaos.targets.base import Capability
from mmchaos.targets.generation import GenerationParams, Message
from mmchaos.targets.hf_vlm import HFVisionLanguageTarget
from mmchaos.targets.tiny_vlms import build_tiny_vlm

pytestmark = pytest.mark.integration

RNG = np.random.default_rng(7)
IMG = RNG.integers(0, 255, (40, 50, 3), dtype=np.uint8)
OTHER = RNG.integers(0, 255, (40, 50, 3), dtype=np.uint8)
#: family -> (placeholder in the rendered prompt, image tokens one 40x50 image expands to)
FAMILIES = {
    "llava": ("<image>", 4),  # (28 / 14)^2 patches, CLS dropped
    "qwen2_vl": ("<|image_pad|>", 6),  # resized to 28x42: 2x3 merged 2x2 patches
    "qwen2_5_vl": ("<|image_pad|>", 6),
    "idefics3": ("<image>", 4),  # 56 / 14 = 4x4 patches, pixel-shuffled by 2
}
GREEDY = GenerationParams(max_new_tokens=8)


@pytest.fixture(scope="module", params=list(FAMILIES))
def vlm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HFVisionLanguageTarget]:
    family = request.param
    path = build_tiny_vlm(family, tmp_path_factory.mktemp(family))
    target = load_target(f"hf:{path}")
    assert isinstance(target, HFVisionLanguageTarget)
    target.family = family  # type: ignore[attr-defined]
    yield target
    target.close()


def test_generation_goes_through_the_processor_and_chat_template(vlm: HFVisionLanguageTarget) -> None:
    placeholder, per_image = FAMILIES[vlm.family]  # type: ignore[attr-defined]
    assert vlm.has(Capability.GENERATE, Capability.TORCH_MODULE)
    rendered = vlm.render([Message("user", (IMG, "What colour is it?"))])
    assert rendered.count(placeholder) == 1 and "What colour is it?" in rendered
    inputs = vlm.build_inputs("What colour is it?", [IMG])
    assert vlm.count_image_tokens(inputs) == per_image  # the processor expanded the placeholder

    result = vlm.generate("What colour is it?", [IMG], GREEDY)
    assert result.extra["image_tokens"] == per_image
    assert result.prompt_tokens == inputs["input_ids"].shape[1]
    assert result.finish_reason == "length" and len(result.token_ids or ()) == 8
    assert result.text == vlm.tokenizer.decode(list(result.token_ids or ()), skip_special_tokens=True)
    logprobs = result.logprobs or ()
    assert len(logprobs) == 8 and all(math.isfinite(x) and x <= 0 for x in logprobs)
    # The first logprob is the model's own: one forward pass over the same inputs agrees.
    torch = vlm.torch
    with torch.inference_mode():
        first = vlm.model(**inputs).logits[0, -1].float().log_softmax(-1)[result.token_ids[0]]  # type: ignore[index]
    assert float(first) == pytest.approx(logprobs[0], abs=1e-4)


def test_greedy_is_deterministic_and_the_image_matters(vlm: HFVisionLanguageTarget) -> None:
    a = vlm.generate("Describe.", [IMG], GREEDY)
    b = vlm.generate("Describe.", [IMG], GREEDY)
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    other = vlm.generate("Describe.", [OTHER], GREEDY)
    assert not np.allclose(a.logprobs or (), other.logprobs or ())  # the pixels reach the model
    n3 = vlm.generate("Describe.", [IMG], GenerationParams(max_new_tokens=8, n=3))
    assert [c.token_ids for c in n3.completions] == [a.token_ids] * 3


def test_seeded_sampling_replays_and_seeds_differ(vlm: HFVisionLanguageTarget) -> None:
    params = GenerationParams(max_new_tokens=6, temperature=1.0, seed=11, n=3)
    one = vlm.generate("Describe.", [IMG], params)
    two = vlm.generate("Describe.", [IMG], params)
    assert [c.token_ids for c in one.completions] == [c.token_ids for c in two.completions]
    assert len({c.token_ids for c in one.completions}) > 1  # n samples, not n copies
    other = vlm.generate("Describe.", [IMG], GenerationParams(max_new_tokens=6, temperature=1.0, seed=12, n=3))
    assert [c.token_ids for c in other.completions] != [c.token_ids for c in one.completions]


def test_multi_image_and_multi_turn(vlm: HFVisionLanguageTarget) -> None:
    _, per_image = FAMILIES[vlm.family]  # type: ignore[attr-defined]
    two = vlm.generate("Compare.", [IMG, OTHER], GREEDY)
    assert two.extra["image_tokens"] == 2 * per_image
    chat = [Message("user", (IMG, "What is it?")), Message("assistant", "a circle"), Message("user", (OTHER, "And?"))]
    assert "a circle" in vlm.render(chat)
    result = vlm.generate(chat, params=GREEDY)
    assert result.extra["image_tokens"] == 2 * per_image and len(result.token_ids or ()) == 8
    text_only = vlm.generate("Say hello.", params=GREEDY)
    assert text_only.extra["image_tokens"] == 0 and len(text_only.token_ids or ()) == 8


def test_stop_strings_end_the_completion(vlm: HFVisionLanguageTarget) -> None:
    full = vlm.generate("Describe.", [IMG], GenerationParams(max_new_tokens=16))
    stops = [c for c in full.text[1:] if c.isascii() and c.isprintable() and not c.isspace()]
    assert stops, f"no printable character to stop on in {full.text!r}"
    stop = stops[0]
    cut = vlm.generate("Describe.", [IMG], GenerationParams(max_new_tokens=16, stop=(stop,)))
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.index(stop)]
    assert cut.token_ids == (full.token_ids or ())[: len(cut.token_ids or ())]
    assert len(cut.token_ids or ()) < 16


def test_placeholders_without_images_are_a_typed_refusal(vlm: HFVisionLanguageTarget) -> None:
    placeholder, _ = FAMILIES[vlm.family]  # type: ignore[attr-defined]
    with pytest.raises(TargetCallError) as info:
        vlm.generate(f"{placeholder} two placeholders, one image", [IMG], GREEDY)
    assert info.value.code in ("processor_refused", "generate_failed")
    assert "\n" not in str(info.value)
    with pytest.raises(TargetCallError) as info:  # a stream fails the same way, without hanging
        list(vlm.generate_stream(f"{placeholder} two placeholders, one image", [IMG], GREEDY))
    assert info.value.code in ("processor_refused", "generate_failed")


def test_describe_names_the_architecture(vlm: HFVisionLanguageTarget) -> None:
    described = vlm.describe()
    assert described["model"]["model_type"] == vlm.family  # type: ignore[attr-defined]
    assert "generate" in described["capabilities"] and described["fingerprint"]["weights"]


# -- refusals at load -----------------------------------------------------------------------------


def test_an_unsupported_architecture_is_a_one_line_refusal_naming_it(tmp_path: Path) -> None:
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 10}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(TargetLoadError) as info:
        load_target(f"hf:{tmp_path}")
    message = str(info.value)
    assert info.value.code == "unsupported_architecture"
    assert "LlamaForCausalLM" in message and "\n" not in message and len(message) < 400


def test_a_checkpoint_missing_weights_is_refused(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    path = build_tiny_vlm("llava", tmp_path / "llava")
    weights = load_file(str(path / "model.safetensors"))
    dropped = sorted(k for k in weights if "multi_modal_projector" in k)[0]
    del weights[dropped]
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(TargetLoadError) as info:
        load_target(f"hf:{path}")
    assert info.value.code == "weights_missing" and "\n" not in str(info.value)


def test_a_vlm_without_a_chat_template_is_refused(tmp_path: Path) -> None:
    path = build_tiny_vlm("idefics3", tmp_path / "idefics3")
    for name in ("chat_template.jinja", "chat_template.json"):
        (path / name).unlink(missing_ok=True)
    with pytest.raises(TargetLoadError) as info:
        load_target(f"hf:{path}")
    assert info.value.code == "chat_template_missing"


def test_streamed_deltas_concatenate_to_the_generated_text(vlm: HFVisionLanguageTarget) -> None:
    params = GenerationParams(max_new_tokens=12)
    full = vlm.generate("Describe.", [IMG], params)
    deltas = list(vlm.generate_stream("Describe.", [IMG], params))
    assert "".join(deltas) == full.text
    stops = [c for c in full.text[1:] if c.isascii() and c.isprintable() and not c.isspace()]
    stopped = GenerationParams(max_new_tokens=12, stop=(stops[0],))
    assert "".join(vlm.generate_stream("Describe.", [IMG], stopped)) == vlm.generate("Describe.", [IMG], stopped).text
    sampled = GenerationParams(max_new_tokens=8, temperature=1.0, seed=3)
    assert "".join(vlm.generate_stream("Describe.", [IMG], sampled)) == vlm.generate("Describe.", [IMG], sampled).text


def test_a_model_crash_is_a_typed_error_in_generate_and_in_streams(
    vlm: HFVisionLanguageTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in for a model that crashes mid-generation (a real one would need a real bug).
    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered\n" + "x" * 5000)

    monkeypatch.setattr(vlm.model, "generate", boom)
    for call in (lambda: vlm.generate("hi", [IMG]), lambda: list(vlm.generate_stream("hi", [IMG]))):
        with pytest.raises(TargetCallError) as info:
            call()
        assert info.value.code == "generate_failed" and "\n" not in str(info.value) and len(str(info.value)) < 400


def test_a_left_padded_batch_answers_like_each_request_alone(vlm: HFVisionLanguageTarget) -> None:
    _, per_image = FAMILIES[vlm.family]  # type: ignore[attr-defined]
    requests: list[str | list[Message]] = [
        [Message("user", (IMG, "What colour?"))],
        [Message("user", (IMG, OTHER, "Compare these two pictures in detail, please."))],
        "No image here.",
    ]
    batched = vlm.generate_batch(requests, GREEDY)
    assert [r.extra["image_tokens"] for r in batched] == [per_image, 2 * per_image, 0]
    for request, together in zip(requests, batched):
        alone = vlm.generate(request, params=GREEDY)
        assert together.token_ids == alone.token_ids and together.text == alone.text
        assert together.prompt_tokens == alone.prompt_tokens
        np.testing.assert_allclose(together.logprobs or (), alone.logprobs or (), atol=1e-4)
    sampled = vlm.generate_batch(requests[:2], GenerationParams(max_new_tokens=4, temperature=1.0, seed=1, n=2))
    assert [len(r.completions) for r in sampled] == [2, 2]
    assert vlm.generate_batch([]) == []


def test_right_padding_changes_the_answers_of_the_shorter_requests(vlm: HFVisionLanguageTarget) -> None:
    # The classic batching bug, for the padding checks to find: decoder-only models must pad left.
    requests: list[str | list[Message]] = [[Message("user", (IMG, "Hi"))], "A much longer request without an image."]
    vlm.padding_side = "right"
    try:
        right = vlm.generate_batch(requests, GREEDY)
    finally:
        vlm.padding_side = "left"
    alone = vlm.generate(requests[0], params=GREEDY)
    assert right[0].token_ids != alone.token_ids
