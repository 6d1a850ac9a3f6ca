"""Text perturbations at character and word level (MMRobustness' levels, Qiu et al. 2022).

Severity s perturbs ``WORD_SHARE[s-1]`` of the eligible words (at least one when any word is
eligible). An empty string, or one with no eligible word, is returned unchanged with an empty
record: there is nothing to perturb, and inventing text would change the task.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from mmchaos.perturb.base import TextPerturbation, severity_value

WORD_SHARE = (0.1, 0.2, 0.3, 0.4, 0.5)
MMROBUSTNESS = "MMRobustness (Qiu et al. 2022), character level"
_WORD = re.compile(r"\S+")

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


def word_spans(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in _WORD.finditer(text)]


def choose_words(n_words: int, severity: int, rng: np.random.Generator) -> list[int]:
    """Indices of the words to perturb, sorted; at least one when there is any word."""
    if n_words == 0:
        return []
    k = max(1, int(round(severity_value(WORD_SHARE, severity) * n_words)))
    return sorted(int(i) for i in rng.choice(n_words, size=min(k, n_words), replace=False))


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


class KeyboardTypo(_WordEdit):
    """One QWERTY-neighbour substitution in each chosen word."""

    name = "keyboard_typo"

    def eligible(self, word: str) -> bool:
        return any(ch.lower() in KEYBOARD for ch in word)

    def edit(self, word: str, rng: np.random.Generator) -> str:
        positions = [i for i, ch in enumerate(word) if ch.lower() in KEYBOARD]
        pos = positions[int(rng.integers(len(positions)))]
        near = KEYBOARD[word[pos].lower()]
        ch = near[int(rng.integers(len(near)))]
        ch = ch.upper() if word[pos].isupper() else ch
        return word[:pos] + ch + word[pos + 1 :]


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


class WordShuffle(TextPerturbation):
    """Swaps of adjacent words, more swaps at higher severity (MMRobustness' word swap)."""

    name = "word_shuffle"
    group = "text-word"
    source = "MMRobustness (Qiu et al. 2022), word level"

    def sample(self, item: str, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        n = len(word_spans(item))
        if n < 2:
            return {"order": list(range(n))}
        order = list(range(n))
        swaps = max(1, int(round(severity_value(WORD_SHARE, severity) * n)))
        for _ in range(swaps):
            i = int(rng.integers(0, n - 1))
            order[i], order[i + 1] = order[i + 1], order[i]
        return {"order": order}

    def apply(self, item: str, params: dict[str, Any]) -> str:
        words = item.split()
        order = params["order"]
        if len(order) != len(words):
            raise ValueError("recorded word order does not match the text")
        return " ".join(words[i] for i in order)
