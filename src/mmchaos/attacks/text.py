"""Greedy word- and character-level text attack under a query budget (after TextFooler/TextAttack).

Each step draws candidate edits of the words not yet touched -- a synonym from the built-in
table, a Latin letter swapped for its Cyrillic/Greek look-alike, a QWERTY-neighbour typo (the
tables of :mod:`mmchaos.perturb.text`) -- asks the target to score every candidate in one batch,
and keeps the edit that lowers the margin of the correct outcome most, until the outcome changes,
the budget of target queries is spent, or ``max_substitutions`` words are changed. Edits that
tie (a target that only says right or wrong) are chosen among by the seeded generator.

Candidates must keep the meaning: with the ``meaning`` extra installed, all-MiniLM-L6-v2 cosine
similarity to the original text >= ``min_similarity`` (:mod:`mmchaos.perturb.meaning`);
without it, the declared fallback is TextAttack's ``MaxWordsPerturbed`` rule alone (edits come
only from meaning-preserving tables, at most ``max_substitutions`` words). Which one ran is in
:meth:`MeaningConstraint.describe`.

Seeded (candidates are drawn from a ``numpy.random.Generator``) and replayable: the record holds
the sequence of substitutions, and :func:`replay` rebuilds the adversarial text from the original
without the target or the embedding model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from mmchaos.errors import ConfigError
from mmchaos.perturb.meaning import DefaultEmbedder, SentenceEmbedder
from mmchaos.perturb.text import HOMOGLYPHS, KEYBOARD, match_case, replace_words, split_core, word_spans
from mmchaos.perturb.text_tables import SYNONYMS

__all__ = [
    "EDIT_KINDS",
    "AttackRecord",
    "MeaningConstraint",
    "Substitution",
    "candidate_edits",
    "greedy_attack",
    "replay",
]

log = logging.getLogger(__name__)

EDIT_KINDS = ("synonym", "homoglyph", "typo")
Scorer = Callable[[Sequence[str]], npt.NDArray[np.float64]]
"""Texts -> margin of the correct outcome per text (< 0: the outcome changed)."""


@dataclass(frozen=True)
class Substitution:
    """Word ``index`` (of the text as it was at that step) replaced by ``new``."""

    index: int
    kind: str
    old: str
    new: str

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind, "old": self.old, "new": self.new}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Substitution:
        return cls(int(data["index"]), str(data["kind"]), str(data["old"]), str(data["new"]))


def apply_substitution(text: str, sub: Substitution) -> str:
    words = [text[s:e] for s, e in word_spans(text)]
    if not 0 <= sub.index < len(words) or words[sub.index] != sub.old:
        raise ConfigError(f"substitution {sub.to_dict()} does not match the text {text!r}", code="replay_mismatch")
    return replace_words(text, {sub.index: sub.new})


def replay(text: str, substitutions: Sequence[Substitution | dict[str, Any]]) -> str:
    """The adversarial text again, from the original and the recorded substitution sequence."""
    for sub in substitutions:
        text = apply_substitution(text, sub if isinstance(sub, Substitution) else Substitution.from_dict(sub))
    return text


def _word_edits(word: str, kinds: Sequence[str]) -> list[tuple[str, str]]:
    """Every (kind, new word) the tables allow for one word (punctuation around it kept)."""
    lead, core, trail = split_core(word)
    if not core:
        return []
    out: list[tuple[str, str]] = []
    if "synonym" in kinds:
        out += [("synonym", lead + match_case(core, s) + trail) for s in SYNONYMS.get(core.lower(), ())]
    if "homoglyph" in kinds:
        out += [("homoglyph", lead + core[:i] + HOMOGLYPHS[ch] + core[i + 1 :] + trail)
                for i, ch in enumerate(core) if ch in HOMOGLYPHS]  # fmt: skip
    if "typo" in kinds:
        for i, ch in enumerate(core):
            for near in KEYBOARD.get(ch.lower(), ""):
                new = near.upper() if ch.isupper() else near
                out.append(("typo", lead + core[:i] + new + core[i + 1 :] + trail))
    return out


def candidate_edits(
    text: str, rng: np.random.Generator, kinds: Sequence[str], per_word: int, skip: frozenset[int] = frozenset()
) -> list[Substitution]:
    """Up to ``per_word`` edits of each word not in ``skip``: synonyms first, the rest drawn by ``rng``."""
    words = [text[s:e] for s, e in word_spans(text)]
    out: list[Substitution] = []
    for i, word in enumerate(words):
        if i in skip:
            continue
        edits = _word_edits(word, kinds)
        synonyms = [e for e in edits if e[0] == "synonym"][:per_word]
        rest = [e for e in edits if e[0] != "synonym"]
        room = per_word - len(synonyms)
        if room > 0 and rest:
            picked = rng.choice(len(rest), size=min(room, len(rest)), replace=False)
            synonyms += [rest[int(j)] for j in sorted(picked)]
        out += [Substitution(i, kind, word, new) for kind, new in synonyms]
    return out


class MeaningConstraint:
    """all-MiniLM similarity to the original when available; else the declared word-budget fallback."""

    FALLBACK = "max_words_perturbed (TextAttack's MaxWordsPerturbed rule; edits from meaning-preserving tables only)"

    def __init__(self, min_similarity: float = 0.85, embedder: SentenceEmbedder | None = None) -> None:
        self.min_similarity = float(min_similarity)
        self._default = DefaultEmbedder(embedder)
        self.fallback_reason: str | None = None
        self._cache: dict[str, npt.NDArray[np.float32]] = {}

    def _load(self) -> SentenceEmbedder | None:
        embed = self._default.get()
        if embed is None and self.fallback_reason is None:  # a broken install falls back too, and says so
            broken = self._default.broken
            if broken is not None:
                self.fallback_reason = f"cannot load the embedding model ({type(broken).__name__}: {broken})"
                log.warning("meaning constraint: %s", self.fallback_reason)
            else:
                self.fallback_reason = self._default.missing
        return embed

    @property
    def active(self) -> bool:
        return self._load() is not None

    def describe(self) -> dict[str, Any]:
        if self._load() is None:
            return {"constraint": self.FALLBACK, "fallback_reason": self.fallback_reason}
        return {"constraint": "sentence similarity", "embedder": self._default.name,
                "min_similarity": self.min_similarity}  # fmt: skip

    def _embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        embed = self._load()
        assert embed is not None
        todo = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if todo:
            for t, v in zip(todo, np.asarray(embed(todo), dtype=np.float32), strict=True):
                self._cache[t] = v
        return np.stack([self._cache[t] for t in texts])

    def similarity(self, original: str, texts: Sequence[str]) -> npt.NDArray[np.float64]:
        """Cosine similarity of each text to the original (1.0 for all under the fallback)."""
        if not texts or self._load() is None:
            return np.ones(len(texts))
        emb = self._embed([original, *texts])
        sims: npt.NDArray[np.float64] = (emb[1:] @ emb[0]).astype(np.float64)
        return sims


@dataclass
class AttackRecord:
    """What one attack did to one text: enough to replay it and to judge it."""

    original: str
    adversarial: str
    substitutions: list[Substitution] = field(default_factory=list)
    queries: int = 0
    success: bool = False
    clean_margin: float = 0.0
    margin: float = 0.0
    similarity: float = 1.0
    rejected_by_meaning: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "original": self.original,
            "adversarial": self.adversarial,
            "substitutions": [s.to_dict() for s in self.substitutions],
            "queries": self.queries,
            "success": self.success,
            "clean_margin": round(self.clean_margin, 6),
            "margin": round(self.margin, 6),
            "similarity": round(self.similarity, 4),
            "rejected_by_meaning": self.rejected_by_meaning,
        }

    def to_json(self) -> dict[str, Any]:
        """:meth:`to_dict` with the numbers exact (a work unit's result; :meth:`from_json` reads it back)."""
        return {**self.to_dict(), "clean_margin": float(self.clean_margin), "margin": float(self.margin),
                "similarity": float(self.similarity)}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AttackRecord:
        return cls(
            str(data["original"]), str(data["adversarial"]), [Substitution.from_dict(s) for s in data["substitutions"]],
            int(data["queries"]), bool(data["success"]), float(data["clean_margin"]), float(data["margin"]),
            float(data["similarity"]), int(data["rejected_by_meaning"]),
        )  # fmt: skip


def greedy_attack(
    text: str,
    score: Scorer,
    rng: np.random.Generator,
    *,
    constraint: MeaningConstraint,
    kinds: Sequence[str] = EDIT_KINDS,
    per_word: int = 4,
    max_substitutions: int = 2,
    query_budget: int = 100,
    clean_margin: float | None = None,
) -> AttackRecord:
    """Greedy search for the fewest substitutions that make ``score`` negative, within the budget.

    ``clean_margin`` (the score of ``text``) is measured here, at one query, unless given.
    """
    record = AttackRecord(original=text, adversarial=text)
    if clean_margin is None:
        clean_margin = float(score([text])[0])
        record.queries += 1
    record.clean_margin = record.margin = clean_margin
    current, margin = text, clean_margin
    touched: set[int] = set()
    while margin >= 0 and len(record.substitutions) < max_substitutions and record.queries < query_budget:
        cands = candidate_edits(current, rng, kinds, per_word, frozenset(touched))
        texts = [apply_substitution(current, c) for c in cands]
        if cands:
            sims = constraint.similarity(text, texts)
            keep = [i for i, s in enumerate(sims) if s >= constraint.min_similarity]
            record.rejected_by_meaning += len(cands) - len(keep)
            cands, texts = [cands[i] for i in keep], [texts[i] for i in keep]
            sims = sims[keep]
        room = query_budget - record.queries
        if not cands or room <= 0:
            break
        if len(cands) > room:  # a seeded subset that fits what is left of the budget
            picked = sorted(int(i) for i in rng.choice(len(cands), size=room, replace=False))
            cands, texts, sims = [cands[i] for i in picked], [texts[i] for i in picked], sims[picked]
        margins = np.asarray(score(texts), dtype=np.float64)
        record.queries += len(texts)
        lowest = float(margins.min())
        if lowest > margin:  # every edit moves away from the boundary: stop (greedy)
            break
        # Ties (a target that only says right/wrong scores every surviving edit alike) are broken
        # by the seeded generator, so the search walks on instead of stopping.
        tied = np.flatnonzero(margins == lowest)
        best = int(tied[int(rng.integers(len(tied)))]) if len(tied) > 1 else int(tied[0])
        sub = cands[best]
        record.substitutions.append(sub)
        # A multi-word synonym ("close to") shifts later indices: re-find touched words by position.
        shift = len(sub.new.split()) - 1
        touched = {i + shift if i > sub.index else i for i in touched} | set(range(sub.index, sub.index + shift + 1))
        current, margin = texts[best], float(margins[best])
        record.similarity = float(sims[best])
    record.adversarial = current
    record.margin = margin
    record.success = margin < 0
    return record
