"""Datasets: the built-in generators (``builtin:shapes``, ``textlines``, ``vqa``, ``frames``, ``grounding``,
``documents``) and user files (a folder, CSV, JSONL, or a PDF)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl

from mmchaos._lazy import require
from mmchaos.data.base import Dataset, Sample
from mmchaos.errors import DataError

__all__ = ["BUILTIN_DATASETS", "Dataset", "Sample", "load_dataset"]

BUILTIN_DATASETS = {
    "shapes": "coloured shapes (24 classes) with captions; held-out test split by default",
    "textlines": "rendered text lines (words, numbers, dates, prices) with transcriptions",
    "vqa": "questions about the shapes images (colour, shape, position, count; some empty) with short answers",
    "frames": "clips of 4 shapes frames with a question that needs more than one frame (which, how many, frame k)",
    "grounding": "images of 2-3 shapes: where is the X (a box, scored by IoU) and what is in box B",
    "documents": "multi-page PDF reports with tables at 200 dpi: a page's cell, total, region; compare two pages",
}


def _builtin(spec: str) -> Dataset:
    name, _, query = spec.partition("?")
    try:
        opts = {k: v for k, v in parse_qsl(query, strict_parsing=bool(query))}
        n = int(opts.pop("n", 0)) or None
        seed = int(opts.pop("seed", 0))
    except ValueError as exc:
        raise DataError(f"bad options in builtin:{spec}: {exc}", code="data_bad_spec") from exc
    if name == "shapes":
        from mmchaos.data.shapes import make_shapes

        split = opts.pop("split", "test")
        if split not in ("train", "val", "test") or opts:
            raise DataError(
                f"builtin:shapes takes n, seed and split=train|val|test; got {query!r}", code="data_bad_spec"
            )
        return make_shapes(n or 512, seed=seed, split=split)
    if name == "textlines":
        from mmchaos.data.textlines import make_textlines

        if opts:
            raise DataError(f"builtin:textlines takes n and seed; got {query!r}", code="data_bad_spec")
        return make_textlines(n or 200, seed=seed)
    if name == "vqa":
        from mmchaos.data.vqa import make_vqa

        split = opts.pop("split", "test")
        if split not in ("train", "val", "test") or opts:
            raise DataError(f"builtin:vqa takes n, seed and split=train|val|test; got {query!r}", code="data_bad_spec")
        return make_vqa(n or 200, seed=seed, split=split)
    if name == "frames":
        from mmchaos.data.frames import make_frames

        split = opts.pop("split", "test")
        try:
            frames = int(opts.pop("frames", 4))
        except ValueError as exc:
            raise DataError(f"bad options in builtin:{spec}: {exc}", code="data_bad_spec") from exc
        if split not in ("train", "val", "test") or opts or not 2 <= frames <= 8:
            raise DataError(
                f"builtin:frames takes n, seed, split=train|val|test and frames=2-8; got {query!r}",
                code="data_bad_spec",
            )
        return make_frames(n or 100, seed=seed, split=split, frames=frames)
    if name == "grounding":
        from mmchaos.data.grounding import make_grounding

        split = opts.pop("split", "test")
        if split not in ("train", "val", "test") or opts:
            raise DataError(
                f"builtin:grounding takes n, seed and split=train|val|test; got {query!r}", code="data_bad_spec"
            )
        return make_grounding(n or 100, seed=seed, split=split)
    if name == "documents":
        return _documents(opts, n, seed, query)
    raise DataError(f"unknown built-in dataset {name!r} (known: {', '.join(BUILTIN_DATASETS)})", code="data_bad_spec")


def _documents(opts: dict[str, str], n: int | None, seed: int, query: str) -> Dataset:
    from mmchaos.data.documents import make_documents
    from mmchaos.data.pdf import pdfium

    try:
        pages, dpi = int(opts.pop("pages", 4)), int(opts.pop("dpi", 200))
    except ValueError as exc:
        raise DataError(f"bad options in builtin:documents?{query}: {exc}", code="data_bad_spec") from exc
    if opts or not 2 <= pages <= 8 or not 72 <= dpi <= 300:
        raise DataError(
            f"builtin:documents takes n, seed, pages=2-8 and dpi=72-300; got {query!r}", code="data_bad_spec"
        )
    require("reportlab")
    pdfium()  # both libraries, before any sample is made: one install hint, not a traceback
    return make_documents(n or 12, seed=seed, pages=pages, dpi=dpi)


def load_dataset(spec: str) -> Dataset:
    """``builtin:NAME[?n=..&seed=..]``, a folder of class subfolders, a .csv/.jsonl file or a .pdf."""
    if spec.startswith("builtin:"):
        return _builtin(spec.removeprefix("builtin:"))
    path = Path(spec).expanduser()
    if not path.exists():
        known = ", builtin:".join(BUILTIN_DATASETS)
        hint = f" (built-in sets are builtin:{known})" if spec in BUILTIN_DATASETS else ""
        raise DataError(f"dataset not found: {spec}{hint}", code="data_missing_file")
    from mmchaos.data import files

    if path.is_dir():
        return files.load_folder(path)
    if path.suffix.lower() == ".jsonl":
        return files.load_jsonl(path)
    if path.suffix.lower() == ".csv":
        return files.load_csv(path)
    if path.suffix.lower() == ".pdf":
        return files.load_pdf(path)
    raise DataError(f"{path}: unsupported dataset file (use a folder, .csv, .jsonl or .pdf)", code="data_bad_spec")
