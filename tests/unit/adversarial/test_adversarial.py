"""Step 3 on the image side: the attacks (seeded, inside their ball, within their budget) and the
checks against colour classifiers whose robustness is known by construction (tests/fakes/colour).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mmchaos.attacks import AttackConfig, QueryBudget, fgsm, pgd, square_attack
from mmchaos.attacks.gradient import eps_label, eps_values
from mmchaos.attacks.plan import batches, by_shape, decode_image, encode_image
from mmchaos.checks import REGISTRY
from mmchaos.checks.adversarial.blackbox import BlackBox, BlackBoxParams
from mmchaos.checks.adversarial.transfer import Transfer, TransferParams
from mmchaos.checks.adversarial.whitebox import WhiteBox, WhiteBoxGate, WhiteBoxParams
from mmchaos.checks.base import CheckContext
from mmchaos.errors import ConfigError
from mmchaos.findings import AVAILABLE_STEPS, Finding, Step, Verdict
from tests.fakes.colour import ColourTarget, colour_dataset, fragile, masked, robust

torch = pytest.importorskip("torch")


def _run(check: object, target: object, n: int = 6) -> list[Finding]:
    ctx = CheckContext(target=target, dataset=colour_dataset(n), seed=0, check_id=check.name)  # type: ignore[arg-type, attr-defined]
    return list(check.run(ctx))  # type: ignore[attr-defined]


def _whitebox(**kw: object) -> WhiteBox:
    params = {"eps": [1.0, 2.0, 4.0], "steps": 3, "masking_queries": 30, **kw}
    return WhiteBox(WhiteBoxParams.model_validate(params), WhiteBoxGate(eps=4.0))


# -- the attacks ------------------------------------------------------------------------------------


def _linear_loss(w: object) -> object:
    return lambda x: (x * w).flatten(1).sum(dim=1)


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_pgd_stays_in_its_ball_and_in_range_and_replays_by_seed(norm: str) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.rand((3, 3, 8, 8), generator=gen)
    w = torch.randn((1, 3, 8, 8), generator=gen)
    cfg = AttackConfig(eps=4 / 255, norm=norm, steps=5, seed=7)  # type: ignore[arg-type]
    a, stats = pgd(_linear_loss(w), x, cfg)
    b, _ = pgd(_linear_loss(w), x, cfg)
    assert torch.equal(a, b)
    delta = (a - x).flatten(1)
    if norm == "linf":
        assert float(delta.abs().max()) <= 4 / 255 + 1e-6
    else:
        assert float(delta.norm(dim=1).max()) <= 4 / 255 * np.sqrt(3 * 8 * 8) + 1e-5
    assert float(a.min()) >= 0 and float(a.max()) <= 1
    assert float(_linear_loss(w)(a).sum()) > float(_linear_loss(w)(x).sum())  # it climbed
    assert stats.zero_gradient_share() == 0.0
    # One short step keeps the random start visible: the seed is what makes an attack replayable.
    short = {"eps": 4 / 255, "norm": norm, "steps": 1, "step_size": 1 / 255}
    c, _ = pgd(_linear_loss(w), x, AttackConfig(**short, seed=1))  # type: ignore[arg-type]
    d, _ = pgd(_linear_loss(w), x, AttackConfig(**short, seed=2))  # type: ignore[arg-type]
    assert not torch.equal(c, d)


def test_fgsm_is_one_signed_step_of_eps() -> None:
    x = torch.full((1, 3, 4, 4), 0.5)
    w = torch.ones((1, 3, 4, 4))
    w[..., :2] = -1
    adv, _ = fgsm(_linear_loss(w), x, 2 / 255)
    assert torch.allclose(adv - x, 2 / 255 * w.sign())


def test_pgd_counts_zero_gradients() -> None:
    x = torch.full((2, 3, 4, 4), 0.5)
    _, stats = pgd(lambda z: torch.round(z * 255).flatten(1).sum(dim=1), x, AttackConfig(eps=2 / 255, steps=3))
    assert stats.zero_gradient_steps == [3, 3] and stats.zero_gradient_share() == 1.0


@pytest.mark.parametrize("eps", [0.0, 0.5 / 255, 17 / 255])
def test_eps_outside_the_declared_range_is_a_typed_refusal(eps: float) -> None:
    with pytest.raises(ConfigError) as info:
        AttackConfig(eps=eps)
    assert info.value.code == "attack_bad_eps"


def test_attack_units_group_by_shape_and_carry_images_as_exact_json() -> None:
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, shape, dtype=np.uint8) for shape in [(8, 8, 3), (4, 6, 3), (8, 8, 3), (8, 8, 3)]]
    assert by_shape(images) == [[0, 2, 3], [1]]
    assert batches(by_shape(images), 2) == [[0, 2], [3], [1]]
    body = json.loads(json.dumps(encode_image(images[1])))
    assert np.array_equal(decode_image(body), images[1]) and decode_image(body).shape == (4, 6, 3)
    assert eps_values([8, 2, 8]) == [2.0, 8.0] and eps_label(2.0) == "2/255"
    with pytest.raises(ValueError, match="grey levels"):
        eps_values([32])


def test_square_attack_never_spends_past_its_budget_and_replays() -> None:
    images = [np.full((8, 8, 3), 128, np.uint8) for _ in range(3)]
    sent: list[int] = []

    def scorer(batch: list[np.ndarray], positions: list[int]) -> np.ndarray:
        sent.append(len(batch))
        return np.array([1.0 + float(b.astype(np.int64).sum()) * 1e-6 for b in batch])  # never succeeds

    budget = QueryBudget(40)
    res = square_attack(scorer, images, 4 / 255, budget=budget, queries_per_image=100, seed=3)
    assert sum(sent) == budget.used <= 40 and res.stopped_by_budget
    assert all(int(np.abs(a.astype(int) - 128).max()) <= 4 for a in res.images)
    again = square_attack(scorer, images, 4 / 255, budget=QueryBudget(40), queries_per_image=100, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(res.images, again.images, strict=True))


# -- the checks -------------------------------------------------------------------------------------


def test_step_3_is_available_and_its_checks_registered() -> None:
    assert Step.ADVERSARIAL in AVAILABLE_STEPS
    for name in ("adversarial_whitebox", "adversarial_blackbox", "adversarial_transfer"):
        assert REGISTRY.get(name).step == Step.ADVERSARIAL


@pytest.mark.check_contract("adversarial_whitebox", "broken")
def test_whitebox_fails_a_fragile_target() -> None:
    findings = _run(_whitebox(), fragile())
    robustness, masking = findings
    assert robustness.verdict == Verdict.FAIL
    assert robustness.metrics["robust_eps4"] == 0.0 and robustness.metrics["clean"] == 1.0
    ev = robustness.evidence
    assert [p["eps_255"] for p in ev["eps_curve"]] == [1.0, 2.0, 4.0]
    assert ev["smallest_flip_eps"]["colour-0"] in (1.0, 2.0)
    assert len(ev["attacks"]) == 3 and all("seed" in a for a in ev["attacks"])
    case = ev["worst_cases"][0]
    names = {a.name for a in robustness.artifacts}
    assert {case["clean_artifact"], case["perturbed_artifact"]} <= names
    assert masking.verdict == Verdict.PASS  # PGD is the stronger attack here: no masking


@pytest.mark.check_contract("adversarial_whitebox", "clean")
def test_whitebox_passes_a_robust_target() -> None:
    robustness, masking = _run(_whitebox(), robust())
    assert robustness.verdict == Verdict.PASS and robustness.metrics["relative_at_gate"] == 1.0
    assert masking.verdict == Verdict.PASS


def test_whitebox_replays_by_seed() -> None:
    a = _run(_whitebox(masking_check=False), fragile())[0]
    b = _run(_whitebox(masking_check=False), fragile())[0]
    assert a.metrics == b.metrics and [x.data for x in a.artifacts] == [x.data for x in b.artifacts]


def test_gradient_masking_is_detected_on_a_target_with_rounding_in_its_torch_path() -> None:
    """Rounding to grey levels with torch.round has a zero gradient: PGD finds nothing, the
    white-box number says "robust", and only the black-box comparison tells the truth."""
    robustness, masking = _run(_whitebox(), masked())
    assert robustness.verdict == Verdict.PASS  # the illusion
    assert masking.verdict == Verdict.FAIL and masking.title.startswith("gradient masking")
    assert masking.metrics["zero_gradient_share"] == 1.0
    assert masking.metrics["blackbox_success"] > masking.metrics["whitebox_success"] + 0.2


@pytest.mark.check_contract("adversarial_blackbox", "broken")
def test_blackbox_fails_a_fragile_target_within_its_budget() -> None:
    target = ColourTarget(gain=300.0)
    check = BlackBox(BlackBoxParams(eps=[4.0], queries_per_sample=100, max_queries=700, samples=6))
    (finding,) = _run(check, target)
    assert finding.verdict == Verdict.FAIL
    # every image sent was booked (and the three class prompts embedded once)
    assert finding.metrics["queries"] == target.images_seen + 3 <= 700
    assert finding.evidence["query_budget"]["max_queries"] == 700


@pytest.mark.check_contract("adversarial_blackbox", "clean")
def test_blackbox_passes_a_robust_target() -> None:
    check = BlackBox(BlackBoxParams(eps=[4.0], queries_per_sample=30, samples=6))
    (finding,) = _run(check, robust())
    assert finding.verdict == Verdict.PASS and finding.metrics["relative_at_gate"] == 1.0


def test_blackbox_stops_at_the_budget_and_says_so() -> None:
    target = robust()
    check = BlackBox(BlackBoxParams(eps=[2.0, 4.0], queries_per_sample=50, max_queries=60, samples=6))
    (finding,) = _run(check, target)
    assert target.images_seen <= 60
    assert finding.evidence["query_budget"]["stopped_by_budget"]
    assert finding.verdict == Verdict.ERROR  # the gate eps was never reached


@pytest.mark.check_contract("adversarial_transfer", "broken")
@pytest.mark.check_contract("adversarial_transfer", "clean")
def test_transfer_fails_a_target_with_the_surrogates_weakness_and_passes_a_robust_one() -> None:
    params = TransferParams(surrogate="py:tests.fakes.colour:fragile", eps=[8.0], steps=5, samples=6)
    (weak,) = _run(Transfer(params), ColourTarget(gain=300.0))
    assert weak.verdict == Verdict.FAIL and weak.metrics["robust_eps8"] < 0.5
    assert weak.evidence["surrogate_loss"].startswith("zero-shot")
    (strong,) = _run(Transfer(params), robust())
    assert strong.verdict == Verdict.PASS


def test_the_html_report_draws_the_eps_curve_and_shows_clean_and_adversarial_images() -> None:
    from mmchaos.report.html import render_html

    robustness, _ = _run(_whitebox(), fragile())
    doc = {**robustness.to_dict()}
    html = render_html({"findings": [doc], "steps": []}, {a.name: a.data for a in robustness.artifacts})
    section = html[html.index("Robust accuracy under attack") :]
    assert "<polyline" in section and "eps (grey levels /255, 0 = clean)" in section
    assert "eps 1/255" in html or "eps 2/255" in html
    assert html.count("data:image/png;base64,") >= 3  # clean, adversarial, difference
    assert "missing artifact" not in html


@pytest.mark.parametrize(
    ("params", "attack"),
    [({"norm": "l2"}, "pgd"), ({"steps": 1, "random_start": False, "step_size": 4.0}, "fgsm")],
)
def test_whitebox_l2_and_fgsm_fail_the_fragile_target_and_record_their_attack(
    params: dict[str, object], attack: str
) -> None:
    (robustness,) = _run(_whitebox(masking_check=False, **params), fragile())
    assert robustness.verdict == Verdict.FAIL and robustness.evidence["attack"] == attack
    recorded = robustness.evidence["attacks"][-1]
    assert recorded["norm"] == params.get("norm", "linf") and recorded["eps_255"] == 4.0
    (robust_finding,) = _run(_whitebox(masking_check=False, **params), robust())
    assert robust_finding.verdict == Verdict.PASS
