"""The built-in OCR stack: textlines dataset, CER metric and the PP-OCR target (real inference)."""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmchaos.data.textlines import make_textline, make_textlines, render_textline
from mmchaos.errors import TargetCallError
from mmchaos.targets.base import Capability, hash_files
from mmchaos.tasks.ocr_metrics import cer, corpus_cer, levenshtein, normalise_ocr_text


def _dp_levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("", "", 0),
        ("", "abc", 3),
        ("abc", "", 3),
        ("kitten", "sitting", 3),
        ("flaw", "lawn", 2),
        ("INV-20431", "lNV-2043l", 2),
        ("café", "cafe", 1),
        ("日本語", "日本", 1),
        ("a😀b", "ab", 1),
        ("x" * 300 + "y", "y" + "x" * 300, 2),
    ],
)
def test_levenshtein_known_values(a: str, b: str, expected: int) -> None:
    assert levenshtein(a, b) == expected
    assert levenshtein(b, a) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="abcé ", max_size=14), st.text(alphabet="abcé ", max_size=14))
def test_levenshtein_matches_dynamic_programming(a: str, b: str) -> None:
    assert levenshtein(a, b) == _dp_levenshtein(a, b)


def test_levenshtein_long_random_strings() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = "".join(rng.choice(list("abcdefgh"), size=int(rng.integers(0, 150))))
        b = "".join(rng.choice(list("abcdefgh"), size=int(rng.integers(0, 150))))
        assert levenshtein(a, b) == _dp_levenshtein(a, b)


def test_normalise_collapses_whitespace_runs_and_strips() -> None:
    assert normalise_ocr_text("  Total \t $12.99 \n\n due  ") == "Total $12.99 due"
    # No-break, em and ideographic spaces, line separators: all whitespace.
    assert normalise_ocr_text("a\u00a0b\u2003c\u3000d\u2028e") == "a b c d e"
    assert normalise_ocr_text(" \t\n ") == ""


def test_normalise_is_nfc_and_case_sensitive() -> None:
    decomposed = "cafe\u0301"
    assert normalise_ocr_text(decomposed) == "caf\u00e9"
    assert unicodedata.is_normalized("NFC", normalise_ocr_text(decomposed))
    assert normalise_ocr_text("Total TOTAL") == "Total TOTAL"
    # Compatibility forms are not folded: a full-width colon is another character.
    assert normalise_ocr_text("12：30") != "12:30"


def test_cer_rules() -> None:
    assert cer("Total $12.99", "Total $12.99") == 0.0
    assert cer("  Total   $12.99\n", "Total $12.99") == 0.0  # gap width does not count
    assert cer("Total$12.99", "Total $12.99") == pytest.approx(1 / 12)  # a lost gap does
    assert cer("total", "Total") == pytest.approx(1 / 5)  # case-sensitive
    assert cer("cafe\u0301", "caf\u00e9") == 0.0  # NFC
    assert cer("", "abcd") == 1.0
    assert cer("abc", "") == 3.0  # empty reference divides by 1
    assert cer("abcabcabc", "abc") == 2.0  # can exceed 1


def test_corpus_cer_weights_by_reference_length() -> None:
    preds = ["abcd", "x"]
    refs = ["abce", "y"]
    assert corpus_cer(preds, refs) == pytest.approx(2 / 5)
    assert corpus_cer([], []) == 0.0
    with pytest.raises(ValueError):
        corpus_cer(["a"], ["a", "b"])


def test_textlines_deterministic_and_independent_of_n() -> None:
    a, b = make_textlines(6, seed=3), make_textlines(6, seed=3)
    longer = make_textlines(9, seed=3)
    for x, y, z in zip(a, b, longer, strict=False):
        assert x.image is not None and y.image is not None and z.image is not None
        assert x.image.tobytes() == y.image.tobytes() == z.image.tobytes()
        assert x.text == y.text == z.text
    assert make_textline(3, 7).text == longer[7].text
    other = make_textlines(6, seed=4)
    assert [s.text for s in other] != [s.text for s in a]


def test_textlines_fields_and_content() -> None:
    ds = make_textlines(200, seed=0)
    assert ds.name == "textlines"
    assert ds.source == "builtin:textlines?seed=0&n=200"
    assert ds.has_transcriptions and not ds.has_labels and not ds.has_captions
    inverted = 0
    for s in ds:
        assert s.image is not None
        assert s.image.dtype == np.uint8 and s.image.ndim == 3 and s.image.shape[2] == 3
        assert s.image.shape[0] == 48
        assert s.text is not None and 2 <= len(s.text.split()) <= 6
        assert s.text == normalise_ocr_text(s.text)
        assert "€" not in s.text  # neither the bundled font nor PP-OCRv4's dictionary has it
        inverted += bool(s.meta["inverted"])
    assert 5 <= inverted <= 60  # a few light-on-dark lines
    assert make_textlines(2, height=64)[0].image.shape[0] == 64  # type: ignore[union-attr]


def test_render_textline_draws_ink() -> None:
    img = render_textline("INV-20431", 28, 48, (0, 0, 0), (255, 255, 255), 8, 8)
    assert img.shape[0] == 48
    assert (img < 128).any() and (img > 128).any()


def test_construction_is_lazy_and_fingerprint_stable() -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    from mmchaos.targets.ppocr import _MODEL_FILES, PPOCRTarget

    a, b = PPOCRTarget(), PPOCRTarget()
    assert a.uri == "builtin:ppocr" and a.has(Capability.READ_TEXT, Capability.PREPROCESS)
    assert not a.has(Capability.EMBED_IMAGE)
    fa, fb = a.fingerprint(), b.fingerprint()
    assert a._engine is None and b._engine is None  # neither construction nor hashing loads it
    assert fa == fb and fa.digest == fb.digest
    assert fa.weights == hash_files([a._package_dir / "models" / f for f in _MODEL_FILES])
    assert len(fa.config) == 64
    assert set(fa.versions) == {"rapidocr_onnxruntime", "onnxruntime", "numpy"}
    assert "unknown" not in fa.versions.values()
    det = PPOCRTarget(detect=True)
    assert det.uri == "builtin:ppocr-det"
    assert det.fingerprint().weights == fa.weights
    assert det.fingerprint().digest != fa.digest


def test_reading_order_groups_lines_then_sorts_left_to_right() -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    from mmchaos.targets.ppocr import _reading_order

    def box(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
        return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float32)

    boxes = [
        box(200, 52, 300, 80),  # line 2, right (slightly lower)
        box(150, 12, 260, 40),  # line 1, right, 2 px lower than its left neighbour
        box(10, 10, 120, 38),  # line 1, left
        box(10, 50, 150, 78),  # line 2, left
    ]
    assert _reading_order(boxes) == [2, 1, 3, 0]
    assert _reading_order([]) == []


def test_grey_arrays_are_size_checked_as_the_rgb_array_they_become() -> None:
    # A (30000, 30000) grey view is 9e8 elements, but the (H, W, 3) copy ppocr builds is 2.7e9:
    # refused for int32 overflow, with the code every other decoder and Preflight give.
    from mmchaos.targets.decode import check_image_array
    from mmchaos.targets.ppocr import _to_bgr

    grey = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), (30_000, 30_000), (0, 0))
    rgb = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), (30_000, 30_000, 3), (0, 0, 0))
    with pytest.raises(TargetCallError) as from_grey:
        _to_bgr(grey, 0)
    with pytest.raises(TargetCallError) as from_rgb:
        check_image_array(rgb, max_pixels=None)
    assert from_grey.value.code == from_rgb.value.code == "element_count_overflow"
