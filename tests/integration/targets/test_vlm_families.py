"""The family matrix: every generative VLM family ``mmchaos.targets.tiny_vlms`` builds (tiny random
weights from config, no downloads) loads through ``hf:``, runs the checks that exercise its quirks
with no harness error, and answers one served chat request, plain and streamed.

The checks are the few that reach each family's quirk: image-token consistency (text-only and
mismatched requests through the family's processor), fingerprint_match (its processor rebuilt and
compared with the directory, text-only and one-image prompt counts), missing_modality (no image,
image only) and a two-perturbation robustness sweep on four samples (batched generation through the
processor). The supported-families table in docs/vlm.md is the one this matrix holds: its rows are
parsed here, so the table cannot drift from what loads.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import numpy as np
import pytest
from PIL import Image

from mmchaos.checks import REGISTRY
from mmchaos.data import load_dataset
from mmchaos.findings import Finding, Verdict
from mmchaos.targets import load_target
from mmchaos.targets.generation import GenerationParams
from mmchaos.targets.hf_vlm import HFVisionLanguageTarget
from mmchaos.targets.tiny_vlms import FAMILIES
from tests.paths import DOCS
from tests.support import run_check_class

pytestmark = pytest.mark.integration

DOC = DOCS / "vlm.md"
DATA = load_dataset("builtin:vqa?n=4&seed=0")
IMG = np.random.default_rng(3).integers(0, 255, (40, 50, 3), dtype=np.uint8)

#: The matrix's checks: few samples, the fewest that still reach each family's quirk.
CHECKS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("image_token_consistency", {"max_new_tokens": 2}),
    ("fingerprint_match", {"samples": 8}),
    ("missing_modality", {"questions": 1, "image_size": 32, "max_new_tokens": 4}),
    ("robustness", {"samples": 4, "severities": [3], "perturbations": ["gaussian_noise", "keyboard_typo"]}),
)


class Row(NamedTuple):
    architecture: str
    processor: str
    quirk: str


def doc_table() -> dict[str, Row]:
    """The rows of docs/vlm.md's supported-families table (between its two marker comments)."""
    text = DOC.read_text(encoding="utf-8")
    body = text.split("<!-- families:start -->", 1)[1].split("<!-- families:end -->", 1)[0]
    rows: dict[str, Row] = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        rows[cells[0].strip("`")] = Row(cells[1].strip("`"), cells[2].strip("`"), cells[3])
    return rows


def test_the_docs_table_lists_exactly_the_families_built() -> None:
    table = doc_table()
    assert sorted(table) == sorted(FAMILIES), "docs/vlm.md's families table and tiny_vlms.FAMILIES differ"
    assert all(row.quirk for row in table.values())


def _png_url(image: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _served(target: HFVisionLanguageTarget) -> tuple[dict[str, Any], str]:
    """One chat request with an image, answered plain and streamed by a real server on loopback."""
    from mmchaos.server import ServerConfig, ServerThread

    body = {"model": "tiny", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _png_url(IMG)}},
                                                      {"type": "text", "text": "What colour is it?"}]}]}  # fmt: skip
    with ServerThread(target, ServerConfig(model_name="tiny")) as srv:
        plain = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=120)
        assert plain.status_code == 200, plain.text
        pieces = []
        with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    for choice in json.loads(line[6:]).get("choices", []):
                        pieces.append(choice.get("delta", {}).get("content") or "")
    return plain.json(), "".join(pieces)


def _no_harness_errors(findings: list[Finding]) -> None:
    errors = [f"{f.check}: {f.title}" for f in findings if f.verdict == Verdict.ERROR]
    assert not errors, errors
    unexplained = [f.check for f in findings if f.verdict == Verdict.SKIPPED and len(f.title.split()) < 3]
    assert not unexplained, f"skipped without a reason: {unexplained}"
    texts = json.dumps([f.evidence for f in findings], default=str) + " ".join(f.title for f in findings)
    assert "Traceback" not in texts


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_loads_checks_and_serves(family: str, tiny_vlm_dirs: Any) -> None:
    row = doc_table()[family]
    path: Path = tiny_vlm_dirs(family)
    target = load_target(f"hf:{path}")
    try:
        assert isinstance(target, HFVisionLanguageTarget)
        described = target.describe()["model"]
        assert (described["architecture"], described["processor"]) == (row.architecture, row.processor)
        findings: list[Finding] = []
        for name, params in CHECKS:
            findings += run_check_class(REGISTRY.get(name), target, params, data=DATA)
        _no_harness_errors(findings)
        assert {f.check for f in findings} == {name for name, _ in CHECKS}
        answer, streamed = _served(target)
        text = answer["choices"][0]["message"]["content"]
        assert streamed == text  # the streamed pieces join to the plain answer
        assert text == target.generate("What colour is it?", [IMG], GenerationParams(max_new_tokens=4)).text
    finally:
        target.close()


def test_gemma3_counts_the_soft_tokens_each_image_becomes_not_its_marker(tiny_vlm_dirs: Any) -> None:
    """Gemma 3's processor names the start-of-image marker as its image token (one per image); the
    model replaces ``mm_tokens_per_image`` soft tokens with features: those are the image tokens."""
    target = load_target(f"hf:{tiny_vlm_dirs('gemma3')}")
    try:
        assert isinstance(target, HFVisionLanguageTarget)
        per_image = target.model.config.mm_tokens_per_image
        one = target.generate("What is it?", [IMG], GenerationParams(max_new_tokens=1))
        two = target.generate("Compare them.", [IMG, IMG], GenerationParams(max_new_tokens=1))
        assert (one.extra["image_tokens"], two.extra["image_tokens"]) == (per_image, 2 * per_image)
    finally:
        target.close()
