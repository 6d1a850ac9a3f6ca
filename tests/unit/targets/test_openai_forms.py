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
    assert IMAGE_FORMS == ("messages", "input", "data_url")  # the probe's order
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
    assert [embeddings_form(f).batched for f in IMAGE_FORMS] == [False, True, True]
    assert embeddings_form("data_url").describe()["image_form"] == "data_url"


def test_a_body_the_form_cannot_carry_and_an_unknown_form_are_refused() -> None:
    with pytest.raises(ValueError, match="one image per request"):
        embeddings_form("messages").body("m", [URL, URL])
    with pytest.raises(ValueError, match="at least one image"):
        embeddings_form("input").body("m", [])
    with pytest.raises(ValueError, match=r"unknown image form 'parts' \(known: messages, input, data_url\)"):
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
