"""The built-in ``documents`` dataset: multi-page PDF reports with tables, and questions about them.

The document path of the headline incident (000): multi-page scans at 200 dpi and requests like
"compare the table on page 2 with page 4". Each sample is one report of ``pages`` A4 pages,
written with ReportLab (a heading naming the page's region, a paragraph, a table of items by
quarter with totals) and rendered with PDFium at ``dpi`` when loaded, so a page image is large
(1654 x 2339 at 200 dpi) and a request carries every page of its document. Four kinds of
question: a cell of one page's table, a row total, the region a page is about, and which of two
pages has the larger total for an item (the cross-page comparison).

Deterministic by (seed, index): sample ``i`` is the same whatever ``n`` is, and ReportLab runs in
invariant mode, so the PDF bytes replay too. Needs the ``pdf`` extra (ReportLab, pypdfium2).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from mmchaos._lazy import require
from mmchaos.data.base import Dataset, Sample
from mmchaos.data.pdf import DEFAULT_DPI, PdfPage

__all__ = ["ITEMS", "KINDS", "QUARTERS", "REGIONS", "make_document_sample", "make_documents", "write_report_pdf"]

REGIONS = ("North", "South", "East", "West", "Central", "Coastal", "Highland", "Harbour")
ITEMS = ("Gears", "Valves", "Pumps", "Bolts", "Cables", "Filters")
QUARTERS = ("Q1", "Q2", "Q3", "Q4")
KINDS = ("cell", "total", "region", "compare")
_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight")
_FILLER = (
    "Figures are units shipped per quarter, counted at the regional depot and checked against invoices. "
    "Returns are netted out. The totals column is the sum of the four quarters. "
)

Table = list[list[int]]
"""One page's table: a row per item, a column per quarter (the total is their sum)."""


def write_report_pdf(regions: list[str], tables: list[Table], title: str) -> bytes:
    """A PDF of one page per region: heading, paragraph, the table with a totals column."""
    pagesizes = require("reportlab.lib.pagesizes")
    platypus = require("reportlab.platypus")
    styles = require("reportlab.lib.styles").getSampleStyleSheet()
    colors = require("reportlab.lib.colors")
    story: list[Any] = []
    for number, (region, table) in enumerate(zip(regions, tables, strict=True), start=1):
        rows = [["Item", *QUARTERS, "Total"]]
        rows += [[item, *map(str, values), str(sum(values))] for item, values in zip(ITEMS, table, strict=False)]
        grid = platypus.Table(rows, colWidths=[90] + [60] * 5)
        grid.setStyle(
            platypus.TableStyle(
                [
                    ("GRID", (0, 0), (-1, -1), 0.75, colors.black),
                    ("BACKGROUND", (0, 0), (-1, 0), colors.lightgrey),
                    ("FONTSIZE", (0, 0), (-1, -1), 12),
                    ("ALIGN", (1, 1), (-1, -1), "RIGHT"),
                ]
            )
        )
        story += [
            platypus.Paragraph(f"{title}: page {number}", styles["Title"]),
            platypus.Paragraph(f"{region} region", styles["Heading1"]),
            platypus.Paragraph(_FILLER * 3, styles["BodyText"]),
            platypus.Spacer(1, 18),
            grid,
            platypus.Spacer(1, 18),
            platypus.Paragraph(f"Prepared by the {region} office. " + _FILLER, styles["BodyText"]),
        ]
        if number < len(regions):
            story.append(platypus.PageBreak())
    buf = io.BytesIO()
    doc = platypus.SimpleDocTemplate(buf, pagesize=pagesizes.A4, invariant=1, title=title, author="mmchaos")
    doc.build(story)
    return buf.getvalue()


def _page_answers(page: int) -> list[str]:
    return [f"page {page}", str(page), _WORDS[page], f"page {_WORDS[page]}"]


def _question(
    rng: np.random.Generator, kind: str, regions: list[str], tables: list[Table]
) -> tuple[str, str, list[str], list[int]]:
    """(question, answer, accepted alternatives, the 1-based pages it is about)."""
    pages = len(regions)
    a = int(rng.integers(pages))
    item = int(rng.integers(len(ITEMS)))
    if kind == "cell":
        q = int(rng.integers(len(QUARTERS)))
        value = str(tables[a][item][q])
        return f"On page {a + 1}, what is the {QUARTERS[q]} value for {ITEMS[item]}?", value, [value], [a + 1]
    if kind == "total":
        value = str(sum(tables[a][item]))
        return f"On page {a + 1}, what is the total for {ITEMS[item]}?", value, [value], [a + 1]
    if kind == "region":
        return f"Which region is the table on page {a + 1} about?", regions[a], [regions[a]], [a + 1]
    b = int((a + 1 + rng.integers(pages - 1)) % pages)
    larger = a if sum(tables[a][item]) > sum(tables[b][item]) else b
    question = (
        f"Compare the table on page {a + 1} with page {b + 1}: which page has the larger total for {ITEMS[item]}?"
    )
    return question, f"page {larger + 1}", _page_answers(larger + 1), [a + 1, b + 1]


def _tables(rng: np.random.Generator, pages: int) -> list[Table]:
    """Per page, a row of four quarter values per item; two pages never tie on an item's total."""
    while True:
        tables = [[[int(v) for v in rng.integers(10, 100, size=len(QUARTERS))] for _ in ITEMS] for _ in range(pages)]
        totals = [{sum(t[i]) for t in tables} for i in range(len(ITEMS))]
        if all(len(t) == pages for t in totals):
            return tables


def make_document_sample(seed: int, index: int, pages: int = 4, dpi: int = DEFAULT_DPI) -> Sample:
    """Sample ``index``: a ``pages``-page report, a question about it and the short answer."""
    rng = np.random.default_rng([seed, 11, index])
    regions = [REGIONS[int(i)] for i in rng.choice(len(REGIONS), size=pages, replace=False)]
    tables = _tables(rng, pages)
    kind = KINDS[index % len(KINDS)]
    question, answer, alternatives, about = _question(rng, kind, regions, tables)
    pdf = write_report_pdf(regions, tables, title=f"Depot report {index + 1}")
    page_refs = [PdfPage(pdf, i, dpi) for i in range(pages)]
    meta: dict[str, Any] = {
        "kind": kind,
        "pages": page_refs,
        "about_pages": about,
        "answers": alternatives,
        "regions": regions,
    }
    return Sample(id=f"documents-{index}", page=page_refs[about[0] - 1], question=question, answer=answer, meta=meta)


def make_documents(n: int = 12, seed: int = 0, pages: int = 4, dpi: int = DEFAULT_DPI) -> Dataset:
    """Generate ``n`` document-question samples (a PDF of ``pages`` pages each, rendered at ``dpi``)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 2 <= pages <= len(REGIONS):
        raise ValueError(f"pages must be 2-{len(REGIONS)}, got {pages}")
    return Dataset(
        name="documents",
        samples=[make_document_sample(seed, i, pages, dpi) for i in range(n)],
        source=f"builtin:documents?seed={seed}&n={n}&pages={pages}&dpi={dpi}",
    )
