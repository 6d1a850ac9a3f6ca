"""The built-in OCR stack: textlines dataset, CER metric and the PP-OCR target (real inference)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from mmchaos.data.textlines import make_textline, make_textlines, render_textline
from mmchaos.errors import TargetCallError
from mmchaos.tasks.ocr_metrics import cer, corpus_cer


@pytest.fixture(scope="module")
def ppocr() -> Iterator[object]:
    pytest.importorskip("rapidocr_onnxruntime")
    from mmchaos.targets.ppocr import PPOCRTarget

    target = PPOCRTarget()
    yield target
    target.close()


@pytest.mark.integration
def test_reads_clean_textlines(ppocr: object) -> None:
    ds = make_textlines(30, seed=0)
    preds = ppocr.read_text([s.load_image() for s in ds])  # type: ignore[attr-defined]
    assert len(preds) == 30 and all(isinstance(p, str) for p in preds)
    refs = [s.text or "" for s in ds]
    assert corpus_cer(preds, refs) < 0.1
    assert ppocr.read_text([]) == []  # type: ignore[attr-defined]


@pytest.mark.integration
def test_blank_and_degenerate_images_read_empty(ppocr: object) -> None:
    images = [
        np.full((48, 300, 3), 255, np.uint8),
        np.zeros((48, 300, 3), np.uint8),
        np.full((5, 5, 3), 255, np.uint8),
        np.zeros((0, 10, 3), np.uint8),
    ]
    assert ppocr.read_text(images) == ["", "", "", ""]  # type: ignore[attr-defined]


@pytest.mark.integration
def test_colour_order_matches_rapidocrs_own_rgb_path(ppocr: object) -> None:
    """Our RGB->BGR conversion gives exactly what RapidOCR reads from the same PIL image."""
    from PIL import Image

    ds = make_textlines(8, seed=11)
    images = [s.load_image() for s in ds]
    engine = ppocr.engine  # type: ignore[attr-defined]
    expected = []
    for img in images:
        result, _ = engine(Image.fromarray(img), use_det=False, use_cls=False, use_rec=True)
        expected.append(str(result[0][0]).strip() if result else "")
    assert ppocr.read_text(images) == expected  # type: ignore[attr-defined]


@pytest.mark.integration
def test_swapped_channels_still_read(ppocr: object) -> None:
    """PP-OCRv4 is nearly colour-blind on these lines: BGR-ordered input still reads, which is
    why a wrong channel order would go unnoticed by CER and is pinned by the exact test above."""
    ds = make_textlines(10, seed=5)
    refs = [s.text or "" for s in ds]
    rgb = [s.load_image() for s in ds]
    bgr = [np.ascontiguousarray(img[:, :, ::-1]) for img in rgb]
    assert corpus_cer(ppocr.read_text(rgb), refs) < 0.1  # type: ignore[attr-defined]
    assert corpus_cer(ppocr.read_text(bgr), refs) < 0.1  # type: ignore[attr-defined]
    # Saturated colours: blue text on yellow becomes red on cyan when the channels swap.
    img = render_textline("Total $12.99 due", 30, 48, (20, 40, 200), (240, 230, 40), 10, 10)
    assert cer(ppocr.read_text([img])[0], "Total $12.99 due") < 0.15  # type: ignore[attr-defined]
    assert cer(ppocr.read_text([img[:, :, ::-1].copy()])[0], "Total $12.99 due") < 0.15  # type: ignore[attr-defined]


@pytest.mark.integration
def test_input_coercion_and_rejection(ppocr: object) -> None:
    img = make_textline(0, 1).load_image()
    (colour,) = ppocr.read_text([img])  # type: ignore[attr-defined]
    gray = np.asarray(img.mean(axis=2), dtype=np.uint8)
    rgba = np.concatenate([img, np.full(img.shape[:2] + (1,), 255, np.uint8)], axis=2)
    gray_text, rgba_text = ppocr.read_text([gray, rgba])  # type: ignore[attr-defined]
    assert rgba_text == colour
    assert cer(gray_text, colour) < 0.2
    with pytest.raises(TargetCallError):
        ppocr.read_text([img.astype(np.float32)])  # type: ignore[attr-defined]
    with pytest.raises(TargetCallError):
        ppocr.read_text([np.zeros((4, 4, 5), np.uint8)])  # type: ignore[attr-defined]


@pytest.mark.integration
def test_preprocess_is_what_the_recogniser_sees(ppocr: object) -> None:
    img = make_textline(0, 2).load_image()
    (a,) = ppocr.preprocess([img])  # type: ignore[attr-defined]
    (b,) = ppocr.preprocess([img])  # type: ignore[attr-defined]
    assert a.dtype == np.float32 and a.shape[:3] == (1, 3, 48) and a.shape[3] >= 320
    assert np.array_equal(a, b)
    assert float(a.min()) >= -1.0 and float(a.max()) <= 1.0


@pytest.mark.integration
def test_batched_recognition_is_close_to_looped() -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    from mmchaos.targets.ppocr import PPOCRTarget

    ds = make_textlines(12, seed=2)
    images = [s.load_image() for s in ds]
    refs = [s.text or "" for s in ds]
    batched = PPOCRTarget(batch_size=6)
    assert corpus_cer(batched.read_text(images), refs) < 0.1


@pytest.mark.integration
def test_detect_mode_reads_a_page_in_reading_order() -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    from mmchaos.targets.ppocr import PPOCRTarget

    lines = [s for s in make_textlines(12, seed=0) if not s.meta["inverted"]][:3]
    width = max(s.load_image().shape[1] for s in lines) + 80
    page = np.full((len(lines) * 70 + 60, width, 3), 240, np.uint8)
    for j, s in enumerate(lines):
        img = s.load_image()
        page[30 + j * 70 : 30 + j * 70 + img.shape[0], 40 : 40 + img.shape[1]] = img
    target = PPOCRTarget(detect=True)
    text, blank = target.read_text([page, np.full((200, 300, 3), 255, np.uint8)])
    reference = " ".join(s.text or "" for s in lines)
    assert cer(text, reference) < 0.15
    assert blank == ""
