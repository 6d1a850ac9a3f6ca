"""PDF pages as images: render a page of a PDF (bytes or a file) at a chosen dpi with PDFium.

A multi-page scan at 200 dpi is what crashed the headline incident (000): an A4 page is then
1654 x 2339 pixels, 11.6 MB as RGB, and a request of many pages multiplies that. Pages are
rendered on demand (:class:`PdfPage` is a small, picklable reference), so a dataset of documents
holds PDF bytes, not page images. PDFium is not thread-safe: every call into it holds one lock,
so the thread-safety checks see the target's concurrency, not PDFium's.

Needs the ``pdf`` extra (``pypdfium2``); without it every entry point raises a
:class:`~mmchaos.errors.MissingDependencyError` with the install hint (a one-line error, exit 2).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from mmchaos._lazy import require
from mmchaos.errors import DataError
from mmchaos.guard.limits import PILLOW_MAX_IMAGE_PIXELS, SizeLimits, check_declared_size

__all__ = ["DEFAULT_DPI", "PdfPage", "page_count", "page_texts", "pdfium", "render_page"]

ImageArray = npt.NDArray[np.uint8]
DEFAULT_DPI = 200
_LOCK = threading.RLock()
_POINTS_PER_INCH = 72.0


def pdfium() -> Any:
    """The ``pypdfium2`` module, or a MissingDependencyError naming ``mmchaos[pdf]``."""
    return require("pypdfium2")


@dataclass(frozen=True)
class PdfPage:
    """Page ``index`` (0-based) of a PDF, rendered at ``dpi`` when asked; ``source`` is bytes or a path."""

    source: bytes | Path
    index: int
    dpi: int = DEFAULT_DPI

    def render(self) -> ImageArray:
        return render_page(self.source, self.index, self.dpi)

    @property
    def name(self) -> str:
        where = self.source.name if isinstance(self.source, Path) else "pdf"
        return f"{where}#page={self.index + 1}@{self.dpi}dpi"


def _label(source: bytes | Path) -> str:
    return str(source) if isinstance(source, Path) else "<pdf bytes>"


def _open(source: bytes | Path) -> Any:
    lib = pdfium()
    try:
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
    except FileNotFoundError as exc:
        raise DataError(f"PDF not found: {_label(source)}", code="data_missing_file") from exc
    except OSError as exc:
        raise DataError(f"cannot read {_label(source)}: {exc}", code="data_unreadable") from exc
    try:
        return lib.PdfDocument(data)
    except lib.PdfiumError as exc:
        raise DataError(f"{_label(source)} is not a readable PDF ({exc})", code="data_unreadable_image") from exc


def page_count(source: bytes | Path) -> int:
    """How many pages the PDF has."""
    with _LOCK:
        doc = _open(source)
        try:
            return len(doc)
        finally:
            doc.close()


def page_texts(source: bytes | Path) -> list[str]:
    """The text layer of every page (empty for a scan without one), whitespace collapsed."""
    with _LOCK:
        doc = _open(source)
        try:
            out = []
            for i in range(len(doc)):
                page = doc[i]
                textpage = page.get_textpage()
                out.append(" ".join(textpage.get_text_range().split()))
                textpage.close()
                page.close()
            return out
        finally:
            doc.close()


def render_page(source: bytes | Path, index: int, dpi: int = DEFAULT_DPI) -> ImageArray:
    """Page ``index`` as an RGB uint8 array of (height, width, 3) at ``dpi`` (a fresh copy each call)."""
    return _render_cached(source, index, dpi).copy()


@functools.lru_cache(maxsize=8)
def _render_cached(source: bytes | Path, index: int, dpi: int) -> ImageArray:
    """The last few pages stay rendered: robustness perturbs the same page many times."""
    if not 18 <= dpi <= 1200:
        raise DataError(f"dpi must be 18-1200, got {dpi}", code="data_bad_spec")
    with _LOCK:
        doc = _open(source)
        try:
            if not 0 <= index < len(doc):
                raise DataError(f"{_label(source)}: no page {index + 1} (it has {len(doc)})", code="data_bad_row")
            page = doc[index]
            scale = dpi / _POINTS_PER_INCH
            width, height = page.get_size()
            # The declared size is checked in 64-bit before PDFium allocates the bitmap (000).
            shape = (round(height * scale), round(width * scale), 3)
            problem = check_declared_size(shape, SizeLimits(max_pixels=PILLOW_MAX_IMAGE_PIXELS))
            if problem is not None:
                raise DataError(f"page {index + 1} at {dpi} dpi refused: {problem.message}", code=problem.code)
            bitmap = page.render(scale=scale, rev_byteorder=True)
            array = np.array(bitmap.to_numpy()[..., :3], dtype=np.uint8, copy=True)
            bitmap.close()
            page.close()
        finally:
            doc.close()
    array.setflags(write=False)
    return array
