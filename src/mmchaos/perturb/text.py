"""Text perturbations: MMRobustness' character and word levels plus tokenizer realities.

Character-level edits (Qiu et al. 2022, after Ribeiro et al. and EDA) touch ``WORD_SHARE[s-1]``
of the eligible words at severity ``s`` (at least one when any word is eligible) and keep the
text's own whitespace. Word-level edits work on the whitespace-separated words and join them
with single spaces (EDA's convention).

Documented edge cases:

* Severity 0 returns the text unchanged (the base class's clean severity).
* An empty string, a whitespace-only string, or a text with no eligible word (``unicode_nfd`` on
  ASCII text, ``code_switch`` without a word in its table) comes back unchanged with an empty
  edit in its record: there is nothing to perturb, and inventing text would change the task.
* Every output is valid UTF-8 (edits insert whole code points, never surrogates).
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from mmchaos.perturb.base import TextPerturbation, severity_value
from mmchaos.perturb.text_tables import (
    ATTRIBUTE_OF,
    ATTRIBUTES,
    CODE_SWITCH,
    FILLER,
    INSERT_FALLBACK,
    LANGUAGES,
    NEGATION_FORMS,
    OCR_CONFUSIONS,
    PUNCTUATION,
    SYNONYMS,
)

T = TypeVar("T")
WORD_SHARE = (0.1, 0.2, 0.3, 0.4, 0.5)
MMROBUSTNESS = "MMRobustness (Qiu et al. 2022), character level"
MMROBUSTNESS_WORD = "MMRobustness (Qiu et al. 2022), word level (EDA, Wei & Zou 2019)"
_WORD = re.compile(r"\S+")
_CORE = re.compile(r"^(\W*)(.*?)(\W*)$", re.DOTALL)  # leading punctuation, word, trailing punctuation
LETTERS = "abcdefghijklmnopqrstuvwxyz"

# QWERTY neighbours, for keyboard typos.
_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
KEYBOARD: dict[str, str] = {}
for _r, _row in enumerate(_ROWS):
    for _c, _ch in enumerate(_row):
        near = [_row[j] for j in (_c - 1, _c + 1) if 0 <= j < len(_row)]
        for _dr in (-1, 1):
            if 0 <= _r + _dr < len(_ROWS):
                other = _ROWS[_r + _dr]
                near += [other[j] for j in (_c - 1, _c, _c + 1) if 0 <= j < len(other)]
        KEYBOARD[_ch] = "".join(sorted(set(near)))

# Latin letters and their Cyrillic/Greek look-alikes (Unicode confusables).
HOMOGLYPHS: dict[str, str] = {
    "a": "\u0430", "c": "\u0441", "e": "\u0435", "o": "\u043e", "p": "\u0440", "x": "\u0445",
    "y": "\u0443", "i": "\u0456", "j": "\u0458", "s": "\u0455", "h": "\u04bb", "l": "\u04cf",
    "A": "\u0391", "B": "\u0392", "C": "\u0421", "E": "\u0395", "H": "\u0397", "K": "\u039a",
    "M": "\u039c", "N": "\u039d", "O": "\u039f", "P": "\u03a1", "T": "\u03a4", "X": "\u03a7",
}  # fmt: skip
ZERO_WIDTH = ("\u200b", "\u200c", "\u200d", "\u2060", "\ufeff")
_LIGATURES = {"ff": "\ufb00", "fi": "\ufb01", "fl": "\ufb02", "ffi": "\ufb03", "ffl": "\ufb04"}


def word_spans(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in _WORD.finditer(text)]


def choose_words(n_words: int, severity: int, rng: np.random.Generator) -> list[int]:
    """Indices of the words to perturb, sorted; at least one when there is any word."""
    if n_words == 0:
        return []
    k = max(1, round(severity_value(WORD_SHARE, severity) * n_words))
    return sorted(int(i) for i in rng.choice(n_words, size=min(k, n_words), replace=False))


def edit_count(n_words: int, severity: int) -> int:
    return max(1, round(severity_value(WORD_SHARE, severity) * n_words)) if n_words else 0


def replace_words(text: str, edits: dict[int, str]) -> str:
    spans = word_spans(text)
    out, last = [], 0
    for idx, (start, end) in enumerate(spans):
        if idx in edits:
            out.append(text[last:start])
            out.append(edits[idx])
            last = end
    out.append(text[last:])
    return "".join(out)


def split_core(word: str) -> tuple[str, str, str]:
    """``"(Circle)."`` -> ``("(", "Circle", ").")``."""
    m = _CORE.match(word)
    assert m is not None
    return m.group(1), m.group(2), m.group(3)


def match_case(template: str, word: str) -> str:
    if template.isupper() and len(template) > 1:
        return word.upper()
    if template[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


def insert_words(text: str, inserts: list[list[Any]]) -> str:
    """Insert ``[position, word]`` pairs one after the other into the word list."""
    if not inserts:
        return text
    words = text.split()
    for pos, word in inserts:
        words.insert(int(pos), str(word))
    return " ".join(words)


class _WordEdit(TextPerturbation):
    """Shared machinery: pick words, draw one edit per word, apply edits by word index."""

    group = "text-char"
    source = MMROBUSTNESS

    def eligible(self, word: str) -> bool:
        return any(ch.isalpha() for ch in word)

    def edit(self, word: str, rng: np.random.Generator) -> str:
        raise NotImplementedError

    def sample(self, item: str, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        words = [item[s:e] for s, e in word_spans(item)]
        candidates = [i for i, w in enumerate(words) if self.eligible(w)]
        picked = [candidates[i] for i in choose_words(len(candidates), severity, rng)]
        return {"edits": {str(i): self.edit(words[i], rng) for i in picked}}

    def apply(self, item: str, params: dict[str, Any]) -> str:
        return replace_words(item, {int(k): v for k, v in params["edits"].items()})


def _pick(rng: np.random.Generator, options: Sequence[T]) -> T:
    return options[int(rng.integers(len(options)))]


class KeyboardTypo(_WordEdit):
    """One QWERTY-neighbour substitution in each chosen word."""

    name = "keyboard_typo"

    def eligible(self, word: str) -> bool:
        return any(ch.lower() in KEYBOARD for ch in word)

    def edit(self, word: str, rng: np.random.Generator) -> str:
        positions = [i for i, ch in enumerate(word) if ch.lower() in KEYBOARD]
        pos = _pick(rng, positions)
        ch = _pick(rng, KEYBOARD[word[pos].lower()])
        ch = ch.upper() if word[pos].isupper() else ch
        return word[:pos] + ch + word[pos + 1 :]


class OCRConfusion(_WordEdit):
    """Characters an OCR engine confuses (rn/m, l/1, O/0, cl/d ...) swapped in each chosen word."""

    name = "ocr_confusion"

    def eligible(self, word: str) -> bool:
        return any(src in word for src, _ in OCR_CONFUSIONS)

    def edit(self, word: str, rng: np.random.Generator) -> str:
        options = [(i, src, dst) for src, dst in OCR_CONFUSIONS for i in _find_all(word, src)]
        pos, src, dst = _pick(rng, options)
        return word[:pos] + dst + word[pos + len(src) :]


def _find_all(word: str, sub: str) -> list[int]:
    return [i for i in range(len(word) - len(sub) + 1) if word.startswith(sub, i)]


class CharInsert(_WordEdit):
    """A random letter inserted into each chosen word."""

    name = "char_insert"

    def edit(self, word: str, rng: np.random.Generator) -> str:
        pos = int(rng.integers(0, len(word) + 1))
        return word[:pos] + _pick(rng, LETTERS) + word[pos:]


class CharReplace(_WordEdit):
    """One letter of each chosen word replaced by a random other letter."""

    name = "char_replace"

    def edit(self, word: str, rng: np.random.Generator) -> str:
        pos = _pick(rng, [i for i, ch in enumerate(word) if ch.isalpha()])
        ch = _pick(rng, [c for c in LETTERS if c != word[pos].lower()])
        return word[:pos] + (ch.upper() if word[pos].isupper() else ch) + word[pos + 1 :]


class CharSwap(_WordEdit):
    """Two neighbouring characters swapped in each chosen word."""

    name = "char_swap"

    def eligible(self, word: str) -> bool:
        return any(a != b for a, b in itertools.pairwise(word))

    def edit(self, word: str, rng: np.random.Generator) -> str:
        pos = _pick(rng, [i for i in range(len(word) - 1) if word[i] != word[i + 1]])
        return word[:pos] + word[pos + 1] + word[pos] + word[pos + 2 :]


class CharDelete(_WordEdit):
    """One character deleted from each chosen word (words of two or more characters)."""

    name = "char_delete"

    def eligible(self, word: str) -> bool:
        return len(word) >= 2 and any(ch.isalnum() for ch in word)

    def edit(self, word: str, rng: np.random.Generator) -> str:
        pos = _pick(rng, [i for i, ch in enumerate(word) if ch.isalnum()])
        return word[:pos] + word[pos + 1 :]


class WhitespaceInsert(_WordEdit):
    """A space inside each chosen word: the tokenisation boundary shifts."""

    name = "whitespace_insert"
    source = "mmchaos (tokenizer boundary shift)"

    def eligible(self, word: str) -> bool:
        return len(word) >= 2

    def edit(self, word: str, rng: np.random.Generator) -> str:
        pos = int(rng.integers(1, len(word)))
        return word[:pos] + " " + word[pos:]


class Homoglyph(_WordEdit):
    """Latin letters swapped for identical-looking Cyrillic/Greek code points (confusables)."""

    name = "homoglyph"
    source = "Unicode confusables (UTS #39)"

    def eligible(self, word: str) -> bool:
        return any(ch in HOMOGLYPHS for ch in word)

    def edit(self, word: str, rng: np.random.Generator) -> str:
        positions = [i for i, ch in enumerate(word) if ch in HOMOGLYPHS]
        swap = rng.random(len(positions)) < 0.5
        swap[int(rng.integers(len(positions)))] = True
        chars = list(word)
        for pos, do in zip(positions, swap, strict=True):
            if do:
                chars[pos] = HOMOGLYPHS[chars[pos]]
        return "".join(chars)


class ZeroWidth(_WordEdit):
    """Invisible zero-width characters (ZWSP, ZWNJ, ZWJ, WJ, BOM) hidden inside each chosen word."""

    name = "zero_width"
    source = "mmchaos (invisible Unicode characters; tokenizer realities)"

    def eligible(self, word: str) -> bool:
        return len(word) >= 2

    def edit(self, word: str, rng: np.random.Generator) -> str:
        pos = int(rng.integers(1, len(word)))
        return word[:pos] + _pick(rng, ZERO_WIDTH) + word[pos:]


class UnicodeNFD(_WordEdit):
    """Accented letters of each chosen word decomposed (NFD): base letter plus combining mark.

    A tokenizer without NFC/NFKC normalisation sees different code points. Text without
    decomposable characters (plain ASCII) has no eligible word and comes back unchanged.
    """

    name = "unicode_nfd"
    source = "Unicode normalization forms (UAX #15)"

    def eligible(self, word: str) -> bool:
        return unicodedata.normalize("NFD", word) != word

    def edit(self, word: str, rng: np.random.Generator) -> str:
        return unicodedata.normalize("NFD", word)


class UnicodeCompat(_WordEdit):
    """Letters of each chosen word turned into compatibility forms (full-width, ligatures) that NFKC folds back."""

    name = "unicode_compat"
    source = "Unicode normalization forms (UAX #15): NFKC compatibility characters"

    def eligible(self, word: str) -> bool:
        return any("!" <= ch <= "~" for ch in word)

    def edit(self, word: str, rng: np.random.Generator) -> str:
        ligatures = [(i, lig) for lig in _LIGATURES for i in _find_all(word, lig)]
        if ligatures and rng.random() < 0.5:
            pos, lig = _pick(rng, ligatures)
            return word[:pos] + _LIGATURES[lig] + word[pos + len(lig) :]
        return "".join(chr(ord(ch) + 0xFEE0) if "!" <= ch <= "~" else ch for ch in word)


class CaseChange(_WordEdit):
    """Each chosen word upper-cased, lower-cased, title-cased or with its case flipped."""

    name = "case_change"
    source = "mmchaos (case sensitivity of cased tokenizers)"
    MODES = ("upper", "lower", "title", "swap")

    def eligible(self, word: str) -> bool:
        return any(ch.isalpha() and ch.lower() != ch.upper() for ch in word)

    def edit(self, word: str, rng: np.random.Generator) -> str:
        variants = [v for v in (word.upper(), word.lower(), word.title(), word.swapcase()) if v != word]
        return str(_pick(rng, variants)) if variants else word


# --- word level ---------------------------------------------------------------------------------


class WordShuffle(TextPerturbation):
    """Swaps of adjacent words, more swaps at higher severity (MMRobustness' word swap)."""

    name = "word_shuffle"
    group = "text-word"
    source = MMROBUSTNESS_WORD

    def sample(self, item: str, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        n = len(word_spans(item))
        if n < 2:
            return {"order": list(range(n))}
        order = list(range(n))
        for _ in range(edit_count(n, severity)):
            i = int(rng.integers(0, n - 1))
            order[i], order[i + 1] = order[i + 1], order[i]
        return {"order": order}

    def apply(self, item: str, params: dict[str, Any]) -> str:
        words = item.split()
        order = params["order"]
        if len(order) != len(words):
            raise ValueError("recorded word order does not match the text")
        if order == list(range(len(words))):
            return item
        return " ".join(words[i] for i in order)


class WordSwap(TextPerturbation):
    """Random pairs of words swapped anywhere in the text (EDA's random swap)."""

    name = "word_swap"
    group = "text-word"
    source = MMROBUSTNESS_WORD

    def sample(self, item: str, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        n = len(item.split())
        if n < 2:
            return {"swaps": []}
        swaps = []
        for _ in range(edit_count(n, severity)):
            i, j = (int(v) for v in rng.choice(n, size=2, replace=False))
            swaps.append([i, j])
        return {"swaps": swaps}

    def apply(self, item: str, params: dict[str, Any]) -> str:
        if not params["swaps"]:
            return item
        words = item.split()
        for i, j in params["swaps"]:
            words[i], words[j] = words[j], words[i]
        return " ".join(words)


class WordInsert(TextPerturbation):
    """Synonyms of words of the text inserted at random places (EDA's random insertion)."""

    name = "word_insert"
    group = "text-word"
    source = MMROBUSTNESS_WORD

    def sample(self, item: str, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        words = item.split()
        if not words:
            return {"inserts": []}
        pool = [s for w in words for s in SYNONYMS.get(split_core(w)[1].lower(), ())] or list(INSERT_FALLBACK)
        inserts = []
        n = len(words)
        for _ in range(edit_count(len(words), severity)):
            inserts.append([int(rng.integers(0, n + 1)), str(_pick(rng, pool))])
            n += 1
        return {"inserts": inserts}

    def apply(self, item: str, params: dict[str, Any]) -> str:
        return insert_words(item, params["inserts"])


class WordDelete(TextPerturbation):
    """Words deleted at random, at least one and never all (EDA's random deletion)."""

    name = "word_delete"
    group = "text-word"
    source = MMROBUSTNESS_WORD

    def sample(self, item: str, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        n = len(item.split())
        if n < 2:
            return {"deleted": []}
        k = min(n - 1, edit_count(n, severity))
        return {"deleted": sorted(int(i) for i in rng.choice(n, size=k, replace=False))}

    def apply(self, item: str, params: dict[str, Any]) -> str:
        if not params["deleted"]:
            return item
        gone = set(params["deleted"])
        return " ".join(w for i, w in enumerate(item.split()) if i not in gone)


class SynonymReplace(_WordEdit):
    """Words replaced by a synonym from a small built-in table (EDA's synonym replacement)."""

    name = "synonym_replace"
    group = "text-word"
    source = MMROBUSTNESS_WORD

    def eligible(self, word: str) -> bool:
        return split_core(word)[1].lower() in SYNONYMS

    def edit(self, word: str, rng: np.random.Generator) -> str:
        lead, core, trail = split_core(word)
        return lead + match_case(core, str(_pick(rng, SYNONYMS[core.lower()]))) + trail


class PunctuationInsert(TextPerturbation):
    """Punctuation marks inserted between words (AEDA, Karimi et al. 2021)."""

    name = "punctuation_insert"
    group = "text-word"
    source = "AEDA (Karimi et al. 2021)"

    def sample(self, item: str, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        n = len(item.split())
        inserts = []
        for _ in range(edit_count(n, severity)):
            inserts.append([int(rng.integers(0, n + 1)), str(_pick(rng, PUNCTUATION))])
            n += 1
        return {"inserts": inserts}

    def apply(self, item: str, params: dict[str, Any]) -> str:
        return insert_words(item, params["inserts"])


class CodeSwitch(_WordEdit):
    """Key words replaced by their Chinese, Spanish or German equivalent (one language per text)."""

    name = "code_switch"
    group = "text-word"
    source = "mmchaos (code-switching; built-in zh/es/de table)"

    def sample(self, item: str, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        language = _pick(rng, LANGUAGES)
        words = [item[s:e] for s, e in word_spans(item)]
        candidates = [i for i, w in enumerate(words) if split_core(w)[1].lower() in CODE_SWITCH]
        picked = [candidates[i] for i in choose_words(len(candidates), severity, rng)]
        edits = {}
        for i in picked:
            lead, core, trail = split_core(words[i])
            edits[str(i)] = lead + CODE_SWITCH[core.lower()][language] + trail
        return {"language": language, "edits": edits}


class Negation(TextPerturbation):
    """The text negated ("a red circle" -> "no red circle"): the model should now disagree.

    A sensitivity probe, not an invariance: severity picks the form, from swapping the first
    article for "no" (subtle) to an explicit "no, this is not ..." (blatant).
    """

    name = "negation"
    group = "text-word"
    source = "mmchaos (negation sensitivity; CLIP-style models are known to ignore it)"
    expects_change = True

    def sample(self, item: str, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        if not item.strip():
            return {"form": None}
        return {"form": severity_value(NEGATION_FORMS, severity)}

    def apply(self, item: str, params: dict[str, Any]) -> str:
        form = params["form"]
        if form is None:
            return item
        text = item.strip()
        words = text.split()
        article = words[0].lower() in ("a", "an", "the")
        if form == "no-article":
            for i, w in enumerate(words):
                if w.lower() in ("a", "an", "the"):
                    words[i] = match_case(w, "no")
                    return " ".join(words)
            form = "not {np}"
        bare = " ".join(words[1:]) if article and len(words) > 1 else text
        return str(form).format(np=text, bare=bare)


class AttributeSwap(_WordEdit):
    """Attribute words swapped for another value ("red circle" -> "blue circle"): the model should disagree.

    A sensitivity probe: severity ``s`` swaps ``s`` attributes (all of them if the text has fewer).
    """

    name = "attribute_swap"
    group = "text-word"
    source = "mmchaos (attribute-binding sensitivity, after Winoground/ARO-style probes)"
    expects_change = True

    def eligible(self, word: str) -> bool:
        return split_core(word)[1].lower() in ATTRIBUTE_OF

    def sample(self, item: str, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        words = [item[s:e] for s, e in word_spans(item)]
        candidates = [i for i, w in enumerate(words) if self.eligible(w)]
        k = min(len(candidates), severity)
        picked = sorted(int(candidates[j]) for j in rng.choice(len(candidates), size=k, replace=False)) if k else []
        return {"edits": {str(i): self.edit(words[i], rng) for i in picked}}

    def edit(self, word: str, rng: np.random.Generator) -> str:
        lead, core, trail = split_core(word)
        category = ATTRIBUTE_OF[core.lower()]
        other = _pick(rng, [v for v in ATTRIBUTES[category] if v != core.lower()])
        return lead + match_case(core, other) + trail


class ContextOverflow(TextPerturbation):
    """Filler text prepended until the content falls past the tokenizer's context window."""

    name = "context_overflow"
    group = "text-word"
    source = "mmchaos (silent truncation at the context boundary)"
    TABLE = (16, 48, 80, 128, 256)  # filler words; CLIP's window is 77 tokens

    def sample(self, item: str, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        if not item.strip():
            return {"filler_words": 0}
        return {"filler_words": int(severity_value(self.TABLE, severity)), "start": int(rng.integers(len(FILLER)))}

    def apply(self, item: str, params: dict[str, Any]) -> str:
        n = int(params["filler_words"])
        if n == 0:
            return item
        start = int(params["start"])
        filler = [FILLER[(start + i) % len(FILLER)] for i in range(n)]
        return " ".join(filler) + " " + item
