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
import importlib.util
import io
import json
from collections.abc import Callable, Iterator
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
from mmchaos.targets.generation import GenerationParams, Message
from mmchaos.targets.hf_vlm import HFVisionLanguageTarget
from mmchaos.targets.tiny_vlms import FAMILIES
from tests.fakes import broken_models as bm
from tests.fakes import broken_targets as bt
from tests.paths import DOCS
from tests.support import run_check_class
from tests.support.vlms import loaded_vlms

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


#: Contrastive families: the builders of the fakes (tiny random models from config), as ``hf:`` loads them.
CONTRASTIVE: dict[str, Callable[[Path], Path]] = {
    "clip": lambda out: bt.build_tiny_clip(out),
    "siglip2": lambda out: bm.build_siglip2(out),
    "altclip": lambda out: bm.build_altclip(out),
    "blip_retrieval": lambda out: bm.build_blip_retrieval(out),
    "siglip": lambda out: bm.build_siglip(out),
    "metaclip2": lambda out: bm.build_metaclip2(out),
    "chinese_clip": lambda out: bm.build_chinese_clip(out),
    "align": lambda out: bm.build_align(out),
}
SHAPES = load_dataset("builtin:shapes?n=8&seed=0")
CONTRASTIVE_CHECKS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("semantic_margin", {"samples": 4}),
    ("adversarial_whitebox", {"samples": 2, "eps": [8], "steps": 1, "masking_queries": 4}),
)


@pytest.fixture(scope="module")
def vlm(tiny_vlm_dirs: Any) -> Iterator[Callable[[str], HFVisionLanguageTarget]]:
    """``family -> loaded hf: target``, loaded once for this module (the checks leave a model as it was)."""
    yield from loaded_vlms(tiny_vlm_dirs)


#: The families whose processor places the image itself, before the prompt: one image a request.
ONE_IMAGE = frozenset({"blip2", "instructblip", "kosmos2", "florence2"})


class Row(NamedTuple):
    architecture: str
    processor: str
    quirk: str


def doc_table(name: str = "families") -> dict[str, Row]:
    """The rows of one of docs/vlm.md's families tables (between its two marker comments)."""
    text = DOC.read_text(encoding="utf-8")
    body = text.split(f"<!-- {name}:start -->", 1)[1].split(f"<!-- {name}:end -->", 1)[0]
    rows: dict[str, Row] = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        rows[cells[0].strip("`")] = Row(cells[1].strip("`"), cells[2].strip("`"), cells[3])
    return rows


def test_the_docs_tables_list_exactly_the_families_built() -> None:
    table = doc_table()
    assert sorted(table) == sorted(FAMILIES), "docs/vlm.md's families table and tiny_vlms.FAMILIES differ"
    contrastive = doc_table("contrastive")
    assert sorted(contrastive) == sorted(CONTRASTIVE), "docs/vlm.md's contrastive table and CONTRASTIVE differ"
    assert all(row.quirk for row in [*table.values(), *contrastive.values()])


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
def test_family_loads_checks_and_serves(family: str, vlm: Any) -> None:
    if family == "smolvlm2":  # the torch extra installs it; an older environment may lack it
        pytest.importorskip("num2words", reason="SmolVLM2's processor needs num2words (pip install num2words)")
    row = doc_table()[family]
    target = vlm(family)
    assert isinstance(target, HFVisionLanguageTarget)
    described = target.describe()["model"]
    assert (described["architecture"], described["processor"]) == (row.architecture, row.processor)
    assert described["images_per_request"] == (1 if family in ONE_IMAGE else None)
    findings: list[Finding] = []
    for name, params in CHECKS:
        findings += run_check_class(REGISTRY.get(name), target, params, data=DATA)
    _no_harness_errors(findings)
    assert {f.check for f in findings} == {name for name, _ in CHECKS}
    answer, streamed = _served(target)
    text = answer["choices"][0]["message"]["content"]
    assert streamed == text  # the streamed pieces join to the plain answer
    assert text == target.generate("What colour is it?", [IMG], GenerationParams(max_new_tokens=4)).text


def test_gemma3_counts_the_soft_tokens_each_image_becomes_not_its_marker(vlm: Any) -> None:
    """Gemma 3's processor names the start-of-image marker as its image token (one per image); the
    model replaces ``mm_tokens_per_image`` soft tokens with features: those are the image tokens."""
    target = vlm("gemma3")
    assert isinstance(target, HFVisionLanguageTarget)
    per_image = target.model.config.mm_tokens_per_image
    one = target.generate("What is it?", [IMG], GenerationParams(max_new_tokens=1))
    two = target.generate("Compare them.", [IMG, IMG], GenerationParams(max_new_tokens=1))
    assert (one.extra["image_tokens"], two.extra["image_tokens"]) == (per_image, 2 * per_image)


@pytest.mark.parametrize("family", sorted(CONTRASTIVE))
def test_contrastive_family_loads_checks_and_serves(family: str, tmp_path: Path) -> None:
    from mmchaos.server import ServerConfig, ServerThread
    from mmchaos.targets.hf import HFContrastiveTarget

    row = doc_table("contrastive")[family]
    target = load_target(f"hf:{CONTRASTIVE[family](tmp_path / family)}")
    try:
        assert isinstance(target, HFContrastiveTarget)
        assert (target.load_report["loaded_as"], type(target.image_processor).__name__) == (
            row.architecture,
            row.processor,
        )
        findings: list[Finding] = []
        for name, params in CONTRASTIVE_CHECKS:
            findings += run_check_class(REGISTRY.get(name), target, params, data=SHAPES)
        _no_harness_errors(findings)
        body = {"model": "tiny", "input": ["a red circle", {"type": "image_url", "image_url": {"url": _png_url(IMG)}}]}
        with ServerThread(target, ServerConfig(model_name="tiny")) as srv:
            resp = httpx.post(f"{srv.url}/v1/embeddings", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        got = np.array([d["embedding"] for d in resp.json()["data"]], dtype=np.float32)
        np.testing.assert_allclose(got[0], target.embed_texts(["a red circle"])[0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[1], target.embed_images([IMG])[0], rtol=1e-4, atol=1e-5)
    finally:
        target.close()


@pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is not None, reason="torchvision is installed: transformers builds it"
)
def test_a_family_whose_image_processor_needs_torchvision_is_refused_in_one_line(tmp_path: Path) -> None:
    """LFM2-VL's image processor exists only in transformers' torchvision backend (Mistral 3's
    Pixtral too where its PIL version is missing): without torchvision, one line saying so."""
    from mmchaos.errors import TargetLoadError
    from mmchaos.targets.tiny_vlms import byte_tokenizer
    from mmchaos.targets.vlm_processor import load_processor

    byte_tokenizer(["<image>"], bos="<s>", eos="</s>", pad="<pad>").save_pretrained(tmp_path)
    saved = {"image_processor_type": "Lfm2VlImageProcessor", "processor_class": "Lfm2VlProcessor"}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(saved), encoding="utf-8")
    (tmp_path / "processor_config.json").write_text(json.dumps({"processor_class": "Lfm2VlProcessor"}))
    with pytest.raises(TargetLoadError) as err:
        load_processor(tmp_path)
    assert err.value.code == "missing_dependency" and "needs torchvision" in str(err.value)
    assert "\n" not in str(err.value) and len(str(err.value)) < 400


@pytest.mark.parametrize("family", ["blip2", "instructblip", "kosmos2", "florence2"])
def test_a_family_whose_processor_places_the_image_itself_refuses_a_second_image(family: str, vlm: Any) -> None:
    """These processors put the image (query tokens, embedding slots) before the prompt once, with
    no placeholder: a second image was dropped silently (BLIP-2: 4 image tokens for 1 or 2 images)
    or crashed the model (InstructBLIP, Kosmos-2: ``generate_failed``, a 500 for the client's request)."""
    from mmchaos.errors import TargetCallError

    target = vlm(family)
    assert isinstance(target, HFVisionLanguageTarget)
    assert target.describe()["model"]["images_per_request"] == 1
    with pytest.raises(TargetCallError) as err:
        target.generate("What is it?", [IMG, IMG], GenerationParams(max_new_tokens=1))
    assert err.value.code == "processor_refused" and "one image" in err.value.message
    with pytest.raises(TargetCallError) as err:
        target.generate_batch([[Message("user", (IMG, "a"))], [Message("user", (IMG, IMG, "b"))]])
    assert err.value.code == "processor_refused" and err.value.message.startswith("request 1 of 2")


def test_an_encoder_decoder_family_answers_what_plain_generate_answers(vlm: Any) -> None:
    """Florence-2 is a BART encoder-decoder: ``generate`` returns the decoder's tokens (a start token
    and the answer), not the prompt followed by the answer. Cutting the prompt's length off them
    gave an empty answer every time."""
    target = vlm("florence2")
    assert isinstance(target, HFVisionLanguageTarget)
    inputs = target.build_inputs("What colour is it?", [IMG])
    plain = target.model.generate(**inputs, max_new_tokens=6, do_sample=False)
    expected = target.tokenizer.decode(plain[0], skip_special_tokens=True)
    result = target.generate("What colour is it?", [IMG], GenerationParams(max_new_tokens=6, logprobs=True))
    assert expected and result.text == expected
    assert len(result.token_ids or ()) == len(result.logprobs or ()) == plain.shape[1] - 1
    streamed = target.generate_stream("What colour is it?", [IMG], GenerationParams(max_new_tokens=6))
    assert "".join(streamed) == expected
    stop = next(c for c in expected[1:] if not c.isspace())
    cut = target.generate("What colour is it?", [IMG], GenerationParams(max_new_tokens=6, stop=(stop,)))
    assert cut.text == expected[: expected.index(stop)] and cut.finish_reason == "stop"


def _expansion(target: Any) -> Finding:
    findings = run_check_class(REGISTRY.get("image_token_consistency"), target, {"max_new_tokens": 1}, data=DATA)
    return next(f for f in findings if f.evidence.get("part") == "expansion")


@pytest.mark.check_contract("image_token_consistency", "clean")
@pytest.mark.parametrize("family", ["blip2", "kosmos2"])
def test_image_token_consistency_passes_a_one_image_family_that_refuses_two(family: str, vlm: Any) -> None:
    target = vlm(family)
    finding = _expansion(target)
    assert finding.verdict == Verdict.PASS, finding.title
    assert finding.evidence["two_images"]["refused"] == "processor_refused"
    # Kosmos-2 has no image token id: its count is the prompt's
    assert finding.evidence["basis"] == ("image tokens" if family == "blip2" else "prompt tokens")


@pytest.mark.check_contract("image_token_consistency", "broken")
def test_image_token_consistency_fails_a_one_image_target_that_answers_without_the_image(vlm: Any) -> None:
    from tests.fakes.broken_vlms import OneImageBlindVLM

    target = vlm("llava")
    finding = _expansion(OneImageBlindVLM(target))
    assert finding.verdict == Verdict.FAIL, finding.title
    assert finding.metrics["image_tokens_a"] == 0 and "two_images" in finding.evidence


@pytest.mark.parametrize("family", ["kosmos2", "florence2"])
def test_a_family_without_a_chat_template_is_refused_with_the_true_reason_or_prompted_plain(
    family: str, tiny_vlm_dirs: Any, vlm: Any, tmp_path: Path
) -> None:
    """Kosmos-2 and Florence-2 repositories hold no chat template; their processor classes would not
    read one anyway. Without one, the refusal says what is missing and what to do; with the target
    option ``prompt_form: plain`` each request's text is the prompt, and the run records it."""
    import shutil

    from mmchaos.errors import TargetLoadError

    path = Path(shutil.copytree(tiny_vlm_dirs(family), tmp_path / family))
    (path / "chat_template.jinja").unlink()
    with pytest.raises(TargetLoadError) as err:
        load_target(f"hf:{path}")
    message = str(err.value)
    assert err.value.code == "chat_template_missing" and "prompt_form: plain" in message and "\n" not in message
    plain = load_target(f"hf:{path}", {"prompt_form": "plain"})
    saved = vlm(family)  # its directory holds the same prompt form as a file
    try:
        assert plain.describe()["model"]["chat_template"].startswith("plain text (prompt_form: plain)")
        assert saved.describe()["model"]["chat_template"].startswith("directory (")
        assert plain.load_options["prompt_form"] == "plain"  # the run stores it: a worker reloads the same
        params = GenerationParams(max_new_tokens=4)
        assert (
            plain.generate("What colour is it?", [IMG], params).text
            == saved.generate("What colour is it?", [IMG], params).text
        )
    finally:
        plain.close()


def test_prompt_form_is_refused_on_a_contrastive_model(tmp_path: Path) -> None:
    from mmchaos.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_target(f"hf:{bt.build_tiny_clip(tmp_path / 'clip')}", {"prompt_form": "plain"})
    assert err.value.code == "target_option_inapplicable"


@pytest.mark.parametrize("family", ["kosmos2", "instructblip"])
def test_checks_that_send_two_images_keep_to_a_one_image_family(family: str, vlm: Any) -> None:
    """generation_batch_invariance's neighbours carry 0-2 images and multi_turn_consistency's chats two:
    on Kosmos-2 (one image a request) the typed refusal ended both checks as harness errors, and on
    InstructBLIP (which answers only with an image) the text-only neighbours did."""
    target = vlm(family)
    gbi = run_check_class(REGISTRY.get("generation_batch_invariance"), target, {"probes": 1, "runs": 1}, data=DATA)
    turns = run_check_class(REGISTRY.get("multi_turn_consistency"), target, {"last_images": 2}, data=DATA)
    _no_harness_errors(gbi + turns)
    assert [f.verdict for f in turns] == [Verdict.SKIPPED] and "images_per_request" in turns[0].title
    assert gbi[0].verdict == Verdict.PASS, gbi[0].title


def test_janus_answers_without_a_length_warning_per_request(vlm: Any) -> None:
    """Janus's ``generate`` hands its own copy of the generation config (with transformers' default
    ``max_length`` 20) to the generic one, which then warns on every request that ``max_new_tokens``
    wins: 154 identical lines in one quick run's terminal."""
    import logging

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("transformers.generation.utils")
    handler = Keep(logging.WARNING)
    logger.addHandler(handler)
    try:
        vlm("janus").generate("What colour is it?", [IMG], GenerationParams(max_new_tokens=2))
    finally:
        logger.removeHandler(handler)
    assert not [r for r in records if "max_new_tokens" in r.getMessage()]
