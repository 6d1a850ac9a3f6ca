"""How a generated short answer is compared with a reference, and when it is an abstention.

Normalisation (VQA-style, kept small so a reader can predict it): lower-case, punctuation to
spaces, the articles a/an/the dropped, British/American spellings of the built-in vocabulary
folded (colour/color, centre/center, grey/gray), number digits to words (``2`` -> ``two``) and
whitespace collapsed. A *normalised match* is equality after that; an *exact match* is equality
after stripping the ends only. An answer *names* a reference when, read as whole words, the one
thing of a vocabulary it mentions is that reference ("The shape is red." names red; "red or blue"
names nothing), so a sentence is scored as a short answer is.

An abstention is an answer that declines to name anything about the image ("none", "nothing",
"there is no shape", "I cannot see an image", "zero"): the right reply to a question about a
blank or absent image, and what a hallucination is not.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = [
    "exact_match",
    "is_abstention",
    "is_right",
    "named",
    "names_answer",
    "normalise_answer",
    "normalised_match",
    "vocabulary",
]

_ARTICLES = frozenset({"a", "an", "the"})
_SPELLINGS = {"colour": "color", "colours": "colors", "centre": "center", "grey": "gray", "nought": "zero"}
_DIGITS = {
    "0": "zero", "1": "one", "2": "two", "3": "three", "4": "four", "5": "five",
    "6": "six", "7": "seven", "8": "eight", "9": "nine", "10": "ten",
}  # fmt: skip
_PUNCT = re.compile(r"[^\w\s]")

_ABSTAIN_WORDS = frozenset({"none", "nothing", "zero", "blank", "empty", "unknown", "unanswerable", "na", "n a"})
_ABSTAIN_PHRASES = (
    "there is no", "there are no", "there isn t", "there aren t", "no shape", "no shapes", "no object",
    "no objects", "no image", "no picture", "not visible", "nothing visible", "cannot", "can t", "can not",
    "unable", "don t see", "do not see", "didn t see", "not sure", "no visible", "i don t know",
    "not able to", "no color", "not possible to tell",
)  # fmt: skip


def normalise_answer(text: str) -> str:
    """Lower-case, no punctuation or articles, folded spellings, digits as words, one space."""
    words = _PUNCT.sub(" ", text.lower()).split()
    out = [_DIGITS.get(w, _SPELLINGS.get(w, w)) for w in words if w not in _ARTICLES]
    return " ".join(out)


def exact_match(prediction: str, answers: Sequence[str]) -> bool:
    """The prediction equals one of the answers, ends stripped, case kept."""
    return prediction.strip() in {a.strip() for a in answers}


def normalised_match(prediction: str, answers: Sequence[str]) -> bool:
    """The prediction equals one of the answers after :func:`normalise_answer`."""
    got = normalise_answer(prediction)
    return bool(got) and got in {normalise_answer(a) for a in answers}


def named(prediction: str, vocabulary: Sequence[str]) -> set[str]:
    """The entries of ``vocabulary`` the prediction mentions as whole words, less those that are
    part of a longer mentioned one ("center" inside "top center")."""
    spaced = f" {normalise_answer(prediction)} "
    found = {normalise_answer(v) for v in vocabulary}
    found = {v for v in found if v and f" {v} " in spaced}
    return {v for v in found if not any(v != w and f" {v} " in f" {w} " for w in found)}


def names_answer(prediction: str, answers: Sequence[str], vocabulary: Sequence[str]) -> bool:
    """The prediction mentions one of ``answers`` and nothing else of ``vocabulary``."""
    refs = {normalise_answer(a) for a in answers}
    mentioned = named(prediction, [*vocabulary, *answers])
    return bool(mentioned) and mentioned <= refs


def is_abstention(text: str) -> bool:
    """Whether an answer declines to describe the image (none-class answer or refusal)."""
    norm = normalise_answer(text)
    if not norm:
        return True  # saying nothing invents nothing
    if norm in _ABSTAIN_WORDS or norm.split()[0] in ("none", "nothing", "no"):
        return True
    spaced = f" {norm} "
    return any(f" {p} " in spaced for p in _ABSTAIN_PHRASES)


def vocabulary(kind: str) -> list[str]:
    """Every answer a built-in VQA question of ``kind`` can have: a reply is right when it names
    only its own."""
    from mmchaos.data.vqa import ANSWERS, NONE_ANSWERS

    return [*ANSWERS[kind], NONE_ANSWERS[kind]]


def is_right(text: str, kind: str, answers: Sequence[str]) -> bool:
    """Whether a free-text reply to a built-in ``kind`` question names one of ``answers`` and no
    other answer of the kind: how the black-box known-answer probes grade."""
    return names_answer(text, answers, vocabulary(kind))
