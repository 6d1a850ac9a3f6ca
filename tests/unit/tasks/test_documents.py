"""builtin:documents, PDF input (--data and rows) and the document_qa task, on real PDFs.

The PDFs are written by ReportLab and read back by PDFium (the ``pdf`` extra, in ``dev``), so
the answers are checked against the text layer PDFium extracts, not against the generator.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pypdfium2")
pytest.importorskip("reportlab")

from mmchaos.data import load_dataset
from mmchaos.data.base import Dataset
from mmchaos.data.documents import make_document_sample
from mmchaos.data.pdf import page_texts
from mmchaos.errors import DataError, MissingDependencyError
from mmchaos.targets.base import Capability, Fingerprint, Target
from mmchaos.targets.generation import Completion, GenerationParams, GenerationResult, Message, as_messages
from mmchaos.tasks import REGISTRY, default_task
from mmchaos.tasks.documents import DocumentQA


class RecordingReader(Target):
    """Answers from a table of questions (``answers``) and records every request's pages."""

    uri = "py:tests.unit.tasks.test_documents:RecordingReader"
    capabilities = frozenset({Capability.GENERATE})

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.requests: list[list[np.ndarray]] = []

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[np.ndarray] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        last = as_messages(prompt, images)[-1]
        self.requests.append(last.images())
        question = " ".join(p for p in last.parts() if isinstance(p, str))
        return GenerationResult((Completion(self.answers.get(question, "page 1"), "stop"),))

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(weights="recording-reader")


@pytest.fixture(scope="module")
def docs() -> Dataset:
    return load_dataset("builtin:documents?n=8&dpi=100")


def test_pages_are_large_renders_of_real_pdfs() -> None:
    sample = make_document_sample(0, 3)  # default: 4 pages at 200 dpi
    page = sample.load_image()
    assert page.shape == (2339, 1654, 3) and page.dtype == np.uint8  # A4 at 200 dpi
    assert len(sample.meta["pages"]) == 4 and sample.page in sample.meta["pages"]
    assert float(page.mean()) > 200 and int(page.min()) < 60, "a white page with dark text and table lines"


def test_answers_are_on_the_pages_pdfium_reads(docs: Dataset) -> None:
    for s in docs:
        texts = page_texts(s.page.source)  # type: ignore[union-attr]
        about = s.meta["about_pages"]
        if s.meta["kind"] in ("cell", "total", "region"):
            assert s.answer in texts[about[0] - 1].split(), (s.question, s.answer)
        else:
            assert len(about) == 2 and s.answer in (f"page {about[0]}", f"page {about[1]}")


def test_deterministic_by_seed_and_index() -> None:
    a, b = make_document_sample(5, 2, dpi=72), make_document_sample(5, 2, dpi=72)
    assert a.page.source == b.page.source and a.question == b.question  # type: ignore[union-attr]
    assert np.array_equal(a.load_image(), b.load_image())
    assert make_document_sample(6, 2).page.source != a.page.source  # type: ignore[union-attr]


def test_bad_options_and_a_missing_extra_are_one_line_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DataError, match="dpi=72-300") as bad:
        load_dataset("builtin:documents?dpi=600")
    assert bad.value.code == "data_bad_spec"
    monkeypatch.setitem(sys.modules, "pypdfium2", None)  # as if the extra were not installed
    with pytest.raises(MissingDependencyError, match=r'pip install "mmchaos\[pdf\]"'):
        load_dataset("builtin:documents?n=1")


def test_every_page_goes_in_each_request_the_perturbed_one_in_place(docs: Dataset) -> None:
    target = RecordingReader({})
    marked = [np.zeros((8, 8, 3), np.uint8) for _ in docs]
    DocumentQA(batch_size=3).evaluate(target, docs, images=marked)
    assert len(target.requests) == len(docs)
    for s, pages in zip(docs, target.requests, strict=True):
        own = s.meta["pages"].index(s.page)
        assert len(pages) == len(s.meta["pages"])
        assert pages[own].shape == (8, 8, 3), "the perturbed page replaces the page the question is about"
        assert all(p.shape == (1170, 827, 3) for i, p in enumerate(pages) if i != own)  # A4 at 100 dpi


def test_scores_right_answers_and_names_the_kinds(docs: Dataset) -> None:
    right = DocumentQA().evaluate(RecordingReader({s.question or "": s.answer or "" for s in docs}), docs)
    assert right.metric == 1.0 and right.extra["pages_per_request"] == 4.0
    assert {"accuracy_cell", "accuracy_total", "accuracy_region", "accuracy_compare"} <= set(right.extra)
    guessing = DocumentQA().evaluate(RecordingReader({}), docs)  # always "page 1"
    assert guessing.metric < 0.5 and guessing.extra["accuracy_cell"] == 0.0


def test_documents_pick_document_qa_on_a_generative_target(docs: Dataset) -> None:
    target = RecordingReader({})
    assert default_task("image", target, docs) == "document_qa"
    assert default_task("text", target, docs) == "document_qa"
    assert REGISTRY.get("document_qa").supports(target, docs)


def test_pdf_as_data_and_as_a_row(tmp_path: Path) -> None:
    sample = make_document_sample(0, 1, dpi=72)
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(sample.page.source)  # type: ignore[union-attr, arg-type]
    pages = load_dataset(str(pdf))
    assert len(pages) == 4 and pages.has_images and pages.has_transcriptions
    assert "page 2" in (pages[1].text or "")
    rows = tmp_path / "docs.jsonl"
    row = {"image": "report.pdf", "page": 2, "question": "Which region is the table on page 2 about?", "answer": "x"}
    rows.write_text(json.dumps(row) + "\n")
    ds = load_dataset(str(rows))
    assert ds.has_images and len(ds[0].meta["pages"]) == 4 and ds[0].page.index == 1  # type: ignore[union-attr]
    assert REGISTRY.get("document_qa").supports(RecordingReader({}), ds)
    rows.write_text(json.dumps({**row, "page": 9}) + "\n")
    with pytest.raises(DataError, match="has no page 9") as err:
        load_dataset(str(rows))
    assert err.value.code == "data_bad_row"
    junk = tmp_path / "junk.pdf"
    junk.write_bytes(b"%PDF-1.4 not really")
    with pytest.raises(DataError, match="not a readable PDF"):
        load_dataset(str(junk))


def test_perturb_reads_a_pdf_and_writes_one(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(make_document_sample(0, 1, dpi=72).page.source)  # type: ignore[union-attr, arg-type]
    out = tmp_path / "scan.pdf"
    code, stdout, err = run_cli("perturb", str(pdf), "-n", "gaussian_noise", "-s", "2", "--dpi", "72", "-o", str(out))
    assert code == 0, err
    assert "4 pages" in stdout
    with pytest.raises(DataError, match="no page has a text layer"):  # now a scan: pixels only
        load_dataset(str(out))
    png = tmp_path / "p2.png"
    code, _, err = run_cli("perturb", str(pdf), "-n", "gaussian_noise", "--page", "2", "--dpi", "72", "-o", str(png))
    assert code == 0 and png.exists(), err
    code, _, err = run_cli("perturb", str(pdf), "-n", "gaussian_noise", "-o", str(png))
    assert code == 2 and "give --page N" in err
