"""One request builder per image form: the bodies the openai: target and the serving traffic send."""

from __future__ import annotations

import pytest

from mmchaos.targets.openai_forms import (
    IMAGE_FORMS,
    chat_body,
    chat_image_content,
    embeddings_form,
    image_part,
    text_body,
)

URL = "data:image/png;base64,iVBORw0KGgo="
PART = {"type": "image_url", "image_url": {"url": URL}}


def test_each_form_puts_the_images_where_its_servers_read_them() -> None:
    assert IMAGE_FORMS == ("messages", "input", "data_url", "modality")  # the probe's order
    assert embeddings_form("messages").body("m", [URL]) == {
        "model": "m",
        "messages": [{"role": "user", "content": [PART]}],
        "encoding_format": "float",
    }
    assert embeddings_form("input").body("m", [URL, URL], "base64") == {
        "model": "m",
        "input": [PART, PART],
        "encoding_format": "base64",
    }
    assert embeddings_form("data_url").body("m", [URL]) == {"model": "m", "input": [URL], "encoding_format": "float"}
    # infinity reads a data-URL string as an image only when the body says so
    assert embeddings_form("modality").body("m", [URL]) == {
        "model": "m",
        "input": [URL],
        "encoding_format": "float",
        "modality": "image",
    }
    assert [embeddings_form(f).batched for f in IMAGE_FORMS] == [False, True, True, True]
    assert embeddings_form("data_url").describe()["image_form"] == "data_url"


def test_a_body_the_form_cannot_carry_and_an_unknown_form_are_refused() -> None:
    with pytest.raises(ValueError, match="one image per request"):
        embeddings_form("messages").body("m", [URL, URL])
    with pytest.raises(ValueError, match="at least one image"):
        embeddings_form("input").body("m", [])
    with pytest.raises(ValueError, match=r"unknown image form 'parts' \(known: messages, input, data_url, modality\)"):
        embeddings_form("parts")


def test_texts_and_chat_bodies() -> None:
    assert text_body("m", "a photo") == {"model": "m", "input": "a photo", "encoding_format": "float"}
    assert text_body("m", ("a", "b"))["input"] == ["a", "b"]
    assert image_part(URL) == PART
    assert chat_image_content([URL], "what?") == [PART, {"type": "text", "text": "what?"}]
    assert chat_image_content([], "hi") == [{"type": "text", "text": "hi"}]
    assert chat_body("m", "hi", max_tokens=4, stream=True) == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
    }


def _event(delta: str | None = None, finish: str | None = None) -> str:
    import json

    choice: dict[str, object] = {"index": 0, "delta": {} if delta is None else {"content": delta}}
    if finish:
        choice["finish_reason"] = finish
    return "data: " + json.dumps({"object": "chat.completion.chunk", "choices": [choice]})


def test_a_stream_is_complete_at_done_or_at_its_finish_reason() -> None:
    from mmchaos.targets.openai_wire import sse_deltas

    body = [_event("red"), "", _event(" one"), ""]
    assert list(sse_deltas([*body, _event(finish="stop"), "", "data: [DONE]"], "/p")) == ["red", " one"]
    # transformers serve and the openai SDK: the finish_reason chunk, then the connection closes
    assert list(sse_deltas([*body, _event(finish="length"), ""], "/p")) == ["red", " one"]
    assert list(sse_deltas([_event("x", finish="stop")], "/p")) == ["x"]


def test_a_stream_cut_before_its_finish_reason_is_still_truncated() -> None:
    from mmchaos.targets.openai_wire import EndpointError, sse_deltas

    role = 'data: {"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}'
    other = 'data: {"choices":[{"index":1,"delta":{},"finish_reason":"stop"}]}'  # not choice 0's end
    for lines in ([role, _event("red")], [_event("red"), other], []):
        with pytest.raises(EndpointError) as info:
            list(sse_deltas(lines, "/p"))
        assert info.value.code == "stream_truncated"
