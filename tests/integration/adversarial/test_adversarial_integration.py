"""Step 3 on real parts: black-box over HTTP against the reference server, on PP-OCR, and the
white-box path of the built-in tiny-clip (the processor mirror and a small validate run)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mmchaos.checks.adversarial.blackbox import BlackBox, BlackBoxParams
from mmchaos.checks.base import CheckContext
from mmchaos.findings import Verdict
from tests.fakes.colour import ColourTarget, colour_dataset

pytestmark = pytest.mark.integration


def test_blackbox_through_an_openai_endpoint_books_every_request() -> None:
    """The attack sees only HTTP answers; every image the server embeds was booked first."""
    from mmchaos.server import ServerThread
    from mmchaos.targets import load_target

    served = ColourTarget(gain=300.0)
    with ServerThread(served) as srv:
        remote = load_target(f"openai:{srv.base_url}")
        try:
            check = BlackBox(BlackBoxParams(eps=[4.0], queries_per_sample=60, max_queries=300, samples=3))
            ctx = CheckContext(target=remote, dataset=colour_dataset(3), seed=0, check_id="adversarial_blackbox")
            (finding,) = list(check.run(ctx))
        finally:
            remote.close()
    assert finding.verdict == Verdict.FAIL, finding.message
    assert finding.metrics["queries"] == served.images_seen + 3 <= 300  # + the three class prompts
    assert finding.evidence["query_budget"]["requests"] == finding.metrics["requests"]


def test_blackbox_on_ppocr_changes_what_it_reads() -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    from mmchaos.data import load_dataset
    from mmchaos.targets.builtin import load_builtin

    target = load_builtin("ppocr")
    data = load_dataset("builtin:textlines?n=1")
    check = BlackBox(BlackBoxParams(eps=[16.0], queries_per_sample=8, max_queries=30, samples=1))
    ctx = CheckContext(target=target, dataset=data, seed=0, check_id="adversarial_blackbox")
    (finding,) = list(check.run(ctx))
    assert finding.verdict in (Verdict.PASS, Verdict.FAIL, Verdict.ERROR)
    assert finding.evidence["task"] == "ocr" and finding.evidence["metric"] == "unchanged read"
    assert finding.metrics["queries"] <= 30
    assert "cer_clean" in finding.metrics


def test_the_tiny_clip_mirror_is_its_processor_and_its_features() -> None:
    import torch

    from mmchaos.attacks import image_path, to_tensor
    from mmchaos.attacks.preprocess import DIFFERENTIABLE, PIXELS_AFTER_RESIZE
    from mmchaos.targets.builtin import load_builtin

    target = load_builtin("tiny-clip")
    image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    path = image_path(target, image)
    assert path is not None and path.mode == DIFFERENTIABLE
    with torch.no_grad():
        mine = path.features(to_tensor([image])).numpy()
    np.testing.assert_allclose(mine, target.embed_images([image]), atol=1e-4)
    odd = np.random.default_rng(1).integers(0, 256, (90, 70, 3), dtype=np.uint8)
    resized = image_path(target, odd)
    assert resized is not None and resized.mode in (DIFFERENTIABLE, PIXELS_AFTER_RESIZE)
    if resized.mode == PIXELS_AFTER_RESIZE:
        (ready,) = resized.inputs([odd])
        assert ready.shape == (64, 64, 3)
        with torch.no_grad():
            np.testing.assert_allclose(
                resized.features(to_tensor([ready])).numpy(), target.embed_images([ready]), atol=1e-4
            )


def test_validate_on_tiny_clip_shows_step_3(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    suite = tmp_path / "adv.yaml"
    suite.write_text(
        "name: adv\nchecks:\n"
        "  - check: adversarial_whitebox\n    params: {samples: 4, eps: [2, 8], steps: 2, masking_queries: 5}\n"
        "  - check: adversarial_transfer\n    params: {samples: 4, eps: [8], steps: 2}\n"
    )
    code, out, err = run_cli(
        "validate", "--target", "builtin:tiny-clip", "--suite", str(suite), "--data", "builtin:shapes?n=8",
        "--out", str(tmp_path / "out"), "--store", str(tmp_path / "runs.db"),
    )  # fmt: skip
    assert code in (0, 1), err
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    steps = {s["name"]: s["status"] for s in results["steps"]}
    assert steps["adversarial"] in ("pass", "fail")
    html = (tmp_path / "out" / "report.html").read_text()
    assert "Robust accuracy under attack" in html and "<svg" in html


def test_pgd_on_the_answer_likelihood_of_the_tiny_vlm() -> None:
    """The generative loss: NLL of the reference answer through the VLM's own forward, with pixels
    from the torch mirror of its processor (checked equal to the processor's output)."""
    import torch

    from mmchaos.attacks import AttackConfig, pgd, to_images, to_tensor
    from mmchaos.attacks.losses import answer_nll_loss
    from mmchaos.attacks.preprocess import processor_mirror
    from mmchaos.data import load_dataset
    from mmchaos.targets.builtin import load_builtin

    target = load_builtin("tiny-vlm")
    sample = load_dataset("builtin:vqa?n=1")[0]
    image = sample.load_image()
    inputs = target.build_inputs(sample.question or "", [image])
    mirror = processor_mirror(target.processor.image_processor)
    assert mirror is not None
    x = to_tensor([image])
    with torch.no_grad():
        np.testing.assert_allclose(mirror.pixels(x).numpy(), inputs["pixel_values"].numpy(), atol=1e-5)
    answer = target.tokenizer(sample.answer or "", add_special_tokens=False)["input_ids"]
    loss = answer_nll_loss(target.model, inputs, answer, mirror.pixels)
    with torch.no_grad():
        clean = float(loss(x)[0])
    adv, stats = pgd(loss, x, AttackConfig(eps=8 / 255, steps=5, seed=0))
    with torch.no_grad():
        attacked = float(loss(adv)[0])
    assert stats.zero_gradient_share() == 0.0
    assert attacked > clean + 0.5, (clean, attacked)
    assert to_images(adv)[0].shape == image.shape


def test_whitebox_runs_on_the_tiny_vlm_through_generate() -> None:
    from mmchaos.checks.adversarial.whitebox import WhiteBox, WhiteBoxParams
    from mmchaos.data import load_dataset
    from mmchaos.targets.builtin import load_builtin

    target = load_builtin("tiny-vlm")
    check = WhiteBox(WhiteBoxParams(samples=3, eps=[8.0], steps=3))
    ctx = CheckContext(target=target, dataset=load_dataset("builtin:vqa?n=3"), seed=0, check_id="adversarial_whitebox")
    (finding,) = list(check.run(ctx))  # no masking check: a VLM gives no score to query
    assert finding.verdict in (Verdict.PASS, Verdict.FAIL), finding.message
    ev = finding.evidence
    assert ev["task"] == "vqa" and ev["preprocessing"]["mode"] == "differentiable preprocessing"
    assert [p["eps_255"] for p in ev["eps_curve"]] == [2.0, 8.0]  # the gate eps (2) is always measured
    for case in ev["worst_cases"]:
        assert case["clean_output"] != case["perturbed_output"] or case["perturbed_output"] is not None
