"""Character error rate (CER) for OCR checks.

How texts are compared
----------------------
Both the prediction and the reference go through :func:`normalise_ocr_text` first:

* Unicode NFC, so a precomposed ``"é"`` and ``"e" + U+0301`` count as the same character;
  compatibility forms are *not* folded (full-width ``"："`` stays different from ``":"``).
* Whitespace: every run of whitespace characters (spaces, tabs, newlines, no-break spaces, ...)
  becomes one ASCII space, and leading/trailing whitespace is removed. So ``"a  b\\n"`` equals
  ``"a b"``, but ``"ab"`` and ``"a b"`` still differ by one edit: a missing or extra word gap
  is an error, how wide the gap is is not.
* Case-sensitive: ``"Total"`` vs ``"total"`` is one edit. Nothing else is folded (no
  punctuation stripping, no lower-casing).

Distances are Levenshtein distances over Unicode code points (insertions, deletions and
substitutions each cost 1). :func:`cer` divides by the length of the normalised reference
(at least 1), so it can exceed 1 when the prediction is much longer than the reference;
:func:`corpus_cer` divides the total edits by the total reference length, so long lines weigh
more than short ones.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

__all__ = ["cer", "corpus_cer", "levenshtein", "normalise_ocr_text"]

# ``\s`` on str patterns matches every Unicode whitespace character (incl. U+00A0, U+2003,
# U+3000, line/paragraph separators), which is what we want.
_WS = re.compile(r"\s+")


def normalise_ocr_text(s: str) -> str:
    """NFC, every whitespace run collapsed to one space, ends stripped; case is kept."""
    return _WS.sub(" ", unicodedata.normalize("NFC", s)).strip()


def levenshtein(a: str, b: str) -> int:
    """Levenshtein distance between two strings, over code points.

    Uses the bit-parallel algorithm of Myers (1999) in Hyyrö's (2003) formulation, with a Python
    int as an arbitrarily wide bit vector: one pass over the longer string, a handful of integer
    operations per character, whatever the length of the shorter one.
    """
    if a == b:
        return 0
    # Strip the common prefix and suffix; they never change the distance.
    start = 0
    limit = min(len(a), len(b))
    while start < limit and a[start] == b[start]:
        start += 1
    end_a, end_b = len(a), len(b)
    while end_a > start and end_b > start and a[end_a - 1] == b[end_b - 1]:
        end_a -= 1
        end_b -= 1
    a, b = a[start:end_a], b[start:end_b]
    if len(a) < len(b):
        a, b = b, a
    m = len(b)
    if m == 0:
        return len(a)

    peq: dict[str, int] = {}
    for i, ch in enumerate(b):
        peq[ch] = peq.get(ch, 0) | (1 << i)
    full = (1 << m) - 1
    high = 1 << (m - 1)
    pv, mv, score = full, 0, m
    for ch in a:
        eq = peq.get(ch, 0)
        xv = eq | mv
        xh = (((eq & pv) + pv) ^ pv) | eq
        ph = mv | (~(xh | pv) & full)
        mh = pv & xh
        if ph & high:
            score += 1
        elif mh & high:
            score -= 1
        ph = ((ph << 1) | 1) & full
        mh = (mh << 1) & full
        pv = mh | (~(xv | ph) & full)
        mv = ph & xv
    return score


def cer(prediction: str, reference: str) -> float:
    """Edit distance / max(1, len(reference)) after normalisation; can exceed 1."""
    pred, ref = normalise_ocr_text(prediction), normalise_ocr_text(reference)
    return levenshtein(pred, ref) / max(1, len(ref))


def corpus_cer(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Total edits / total reference characters (after normalisation) over a corpus.

    An empty corpus, or one whose references are all empty, divides by 1 rather than 0.
    """
    if len(predictions) != len(references):
        raise ValueError(f"got {len(predictions)} predictions for {len(references)} references")
    edits = 0
    chars = 0
    for pred, ref in zip(predictions, references, strict=True):
        p, r = normalise_ocr_text(pred), normalise_ocr_text(ref)
        edits += levenshtein(p, r)
        chars += len(r)
    return edits / max(1, chars)
