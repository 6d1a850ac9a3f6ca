"""``mmchaos serve`` answers a VLM request by whose fault its failure is: a request the processor
refuses (more placeholders than images) is 422, the processor or model failing on a request it
should take is 500, never a 4xx that blames the client (a tiny LLaVA built from config, its
processor then broken as OneVision's was when a rebuilt processor lost a key)."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from mmchaos.errors import TargetCallError
from mmchaos.server import ServerConfig, ServerThread
from mmchaos.targets import load_target
from mmchaos.targets.hf_vlm import HFVisionLanguageTarget

pytestmark = pytest.mark.integration

IMG = np.random.default_rng(5).integers(0, 255, (40, 50, 3), dtype=np.uint8)


def _png_url(image: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _chat(text: str) -> dict[str, Any]:
    parts = [{"type": "image_url", "image_url": {"url": _png_url(IMG)}}, {"type": "text", "text": text}]
    return {"model": "tiny", "max_tokens": 2, "temperature": 0, "messages": [{"role": "user", "content": parts}]}


@pytest.fixture()
def vlm(tiny_vlm_dirs: Any) -> Iterator[HFVisionLanguageTarget]:
    target = load_target(f"hf:{tiny_vlm_dirs('llava')}")
    assert isinstance(target, HFVisionLanguageTarget)
    yield target
    target.close()


def test_a_request_fault_is_422_and_a_processor_fault_is_500(vlm: HFVisionLanguageTarget) -> None:
    with ServerThread(vlm, ServerConfig(model_name="tiny")) as srv:
        url = f"{srv.url}/v1/chat/completions"
        assert httpx.post(url, json=_chat("What is it?"), timeout=60).status_code == 200
        typed = httpx.post(url, json=_chat("<image> and <image>?"), timeout=60)
        assert typed.status_code == 422 and typed.json()["error"]["code"] == "processor_refused"

        vlm.processor.num_additional_image_tokens = None  # the processor now fails on every image
        with pytest.raises(TargetCallError) as info:
            vlm.build_inputs("What is it?", [IMG])
        assert info.value.code == "processor_failed" and "TypeError" in info.value.message
        broken = httpx.post(url, json=_chat("What is it?"), timeout=60)
        assert broken.status_code == 500, broken.text
        assert broken.json()["error"]["code"] == "processor_failed"
