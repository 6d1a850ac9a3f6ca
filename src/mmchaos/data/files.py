"""User datasets: a folder of class subfolders, or a CSV/JSONL file of rows.

Rows carry ``image`` (a path, relative to the file's folder), and any of ``caption`` (for
retrieval), ``label`` (for zero-shot classification), ``text`` (an OCR transcription) and
``question`` with ``answer`` (visual question answering on generative targets). An ``image``
that is a ``.pdf`` is a document: ``page`` (1-based, default 1) names the page the row is about,
and a generative target is asked with every page of it (``document_qa``). A ``.pdf`` given as the
dataset itself is one sample per page, its text layer the reference transcription. Every
problem names the file and line; nothing is skipped silently.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

from mmchaos.data.base import Dataset, Sample
from mmchaos.data.images import ImageLoadError, probe_image
from mmchaos.errors import DataError

__all__ = ["IMAGE_SUFFIXES", "load_csv", "load_folder", "load_jsonl", "load_pdf"]

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
FIELDS = ("image", "caption", "label", "text", "question", "answer", "id", "page")
_TEXT_FIELDS = ("caption", "label", "text", "question", "answer")


def _check_image(path: Path, where: str) -> None:
    """Fail now, with the row, on a missing, unidentifiable or oversized image (header only, cheap)."""
    if not path.is_file():
        raise DataError(f"{where}: image file not found: {path}", code="data_missing_file")
    try:
        probe_image(path)
    except ImageLoadError as exc:
        raise DataError(f"{where}: unreadable image {path}: {exc.message}", code="data_unreadable_image") from exc


def _row_to_sample(row: dict[str, Any], base: Path, where: str, index: int) -> Sample:
    unknown = sorted(set(row) - set(FIELDS))
    if unknown:
        raise DataError(
            f"{where}: unknown field(s) {', '.join(unknown)}; expected {', '.join(FIELDS)}", code="data_bad_row"
        )
    image = row.get("image")
    if not isinstance(image, str) or not image.strip():
        raise DataError(f"{where}: missing 'image' path", code="data_bad_row")
    values: dict[str, str | None] = {}
    for key in _TEXT_FIELDS:
        value = row.get(key)
        if value is not None and not isinstance(value, str):
            raise DataError(f"{where}: '{key}' must be a string, got {type(value).__name__}", code="data_bad_row")
        values[key] = value if value != "" or key == "text" else None
    if (values["question"] is None) != (values["answer"] is None):
        raise DataError(f"{where}: 'question' and 'answer' go together", code="data_bad_row")
    if all(values[k] is None for k in ("caption", "label", "text", "question")):
        raise DataError(f"{where}: a row needs at least one of caption, label, text, question", code="data_bad_row")
    path = (base / image).resolve() if not Path(image).is_absolute() else Path(image)
    if path.suffix.lower() == ".pdf":
        return _document_row(row, path, values, where, index)
    if row.get("page") not in (None, ""):
        raise DataError(f"{where}: 'page' is for a .pdf image", code="data_bad_row")
    _check_image(path, where)
    return Sample(
        id=str(row.get("id") or f"{index}"),
        image_path=path,
        caption=values["caption"],
        label=None if values["label"] is None else sys.intern(values["label"]),  # a few classes, many rows
        text=values["text"],
        question=values["question"],
        answer=values["answer"],
    )


def _document_row(row: dict[str, Any], path: Path, values: dict[str, str | None], where: str, index: int) -> Sample:
    """A row about page ``page`` of a PDF; the request carries every page of it."""
    from mmchaos.data.pdf import PdfPage, page_count

    if not path.is_file():
        raise DataError(f"{where}: PDF file not found: {path}", code="data_missing_file")
    raw = row.get("page") or 1
    try:
        number = int(raw)
    except (TypeError, ValueError):
        raise DataError(f"{where}: 'page' must be a page number, got {raw!r}", code="data_bad_row") from None
    try:
        count = page_count(path)
    except DataError as exc:
        raise DataError(f"{where}: {exc.message}", code=exc.code) from exc
    if not 1 <= number <= count:
        raise DataError(f"{where}: {path.name} has no page {number} (it has {count})", code="data_bad_row")
    pages = [PdfPage(path, i) for i in range(count)]
    return Sample(
        id=str(row.get("id") or f"{index}"),
        page=pages[number - 1],
        caption=values["caption"],
        label=values["label"],
        text=values["text"],
        question=values["question"],
        answer=values["answer"],
        meta={"pages": pages},
    )


def load_pdf(path: Path) -> Dataset:
    """A PDF as a dataset: one sample per page, the page's text layer as its transcription."""
    from mmchaos.data.pdf import PdfPage, page_texts

    texts = page_texts(path)
    if not texts:
        raise DataError(f"{path}: the PDF has no pages", code="data_empty")
    if not any(texts):
        raise DataError(
            f"{path}: no page has a text layer to score against; give a .jsonl whose rows name the PDF, "
            "a page and a question with its answer",
            code="data_empty",
        )
    pages = [PdfPage(path, i) for i in range(len(texts))]
    samples = [
        Sample(id=f"{path.name}#page={i + 1}", page=p, text=t, meta={"pages": pages})
        for i, (p, t) in enumerate(zip(pages, texts, strict=True))
    ]
    return Dataset(name=path.stem, samples=samples, source=str(path))


def _finish(name: str, samples: list[Sample], source: Path) -> Dataset:
    if not samples:
        raise DataError(f"{source}: no samples", code="data_empty")
    for field in _TEXT_FIELDS:
        have = sum(getattr(s, field) is not None for s in samples)
        if 0 < have < len(samples):
            raise DataError(
                f"{source}: {have} of {len(samples)} rows have '{field}'; give it on every row or none",
                code="data_inconsistent",
            )
    return Dataset(name=name, samples=samples, source=str(source))


def load_jsonl(path: Path) -> Dataset:
    samples: list[Sample] = []
    with path.open("r", encoding="utf-8", errors="strict") as fh:
        try:
            lines = list(fh)
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: not UTF-8: {exc}", code="data_bad_encoding") from exc
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON: {exc.msg}", code="data_bad_row") from exc
        if not isinstance(row, dict):
            raise DataError(f"{where}: each line must be a JSON object", code="data_bad_row")
        samples.append(_row_to_sample(row, path.parent, where, len(samples)))
    return _finish(path.stem, samples, path)


def load_csv(path: Path) -> Dataset:
    samples: list[Sample] = []
    try:
        with path.open("r", encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None or "image" not in reader.fieldnames:
                raise DataError(f"{path}:1: the header must name an 'image' column", code="data_bad_row")
            for row in reader:
                where = f"{path}:{reader.line_num}"
                if None in row:
                    raise DataError(f"{where}: more values than header columns", code="data_bad_row")
                clean = {k: v for k, v in row.items() if v is not None}
                samples.append(_row_to_sample(clean, path.parent, where, len(samples)))
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8: {exc}", code="data_bad_encoding") from exc
    except csv.Error as exc:
        raise DataError(f"{path}: bad CSV: {exc}", code="data_bad_row") from exc
    return _finish(path.stem, samples, path)


def load_folder(path: Path) -> Dataset:
    """``root/<class name>/<image>``: the folder name is the label; other files are an error."""
    samples: list[Sample] = []
    classes = sorted(d.name for d in path.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise DataError(f"{path}: expected one subfolder per class", code="data_empty")
    for cls in classes:
        for file in sorted((path / cls).iterdir()):
            if file.name.startswith("."):
                continue
            where = str(file)
            if file.suffix.lower() not in IMAGE_SUFFIXES:
                raise DataError(f"{where}: not an image file (suffix {file.suffix or 'none'})", code="data_bad_row")
            _check_image(file, where)
            samples.append(Sample(id=f"{cls}/{file.name}", image_path=file, label=cls.replace("_", " ")))
    return _finish(path.name, samples, path)
