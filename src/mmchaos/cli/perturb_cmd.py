"""``mmchaos perturb``: list the catalog, perturb one image, text or PDF, or draw a contact sheet.

A PDF is rendered with PDFium at ``--dpi`` (the ``pdf`` extra); ``--page`` picks one page, and
``-o OUT.pdf`` writes the perturbed pages as a scanned-looking PDF (Pillow's PDF writer).

A thin layer over :mod:`mmchaos.perturb`; every error is a :class:`~mmchaos.errors.UsageError`
(one line, exit code 2). Registered on the main app by :func:`register`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from mmchaos.errors import ConfigError, DataError, UsageError

__all__ = ["register"]

_IMAGE_SUFFIXES = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".bmp": "BMP", ".webp": "WEBP", ".tif": "TIFF",
                   ".tiff": "TIFF"}  # fmt: skip
_TEXT_SUFFIXES = {".txt", ".text", ".md"}


def register(app: typer.Typer) -> None:
    """Add the ``perturb`` command to ``app`` (once, however often it is called)."""
    if any(info.name == "perturb" for info in app.registered_commands):
        return
    app.command("perturb")(perturb_command)


def perturb_command(
    source: Annotated[Path | None, typer.Argument(help="image file, or a .txt file", show_default=False)] = None,
    name: Annotated[str | None, typer.Option("--name", "-n", help="perturbation name (see --list)")] = None,
    severity: Annotated[int, typer.Option("--severity", "-s", help="0 (clean) to 5")] = 3,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="output file (a text goes to stdout without)")] = None,
    seed: Annotated[int, typer.Option("--seed", help="random seed of the parameter draw")] = 0,
    text: Annotated[str | None, typer.Option("--text", help="perturb this literal text instead of a file")] = None,
    record: Annotated[Path | None, typer.Option("--record", help="write the replayable record (JSON) here")] = None,
    replay: Annotated[Path | None, typer.Option("--replay", help="apply a record written by --record")] = None,
    list_: Annotated[bool, typer.Option("--list", help="list the perturbations and exit")] = False,
    gallery: Annotated[
        Path | None, typer.Option("--gallery", help="write a contact sheet (perturbation x severity) here")
    ] = None,
    group: Annotated[list[str] | None, typer.Option("--group", "-g", help="gallery: only these groups")] = None,
    names: Annotated[list[str] | None, typer.Option("--names", help="gallery: only these perturbations")] = None,
    cell: Annotated[int, typer.Option("--cell", help="gallery: cell size in pixels", min=32, max=512)] = 112,
    page: Annotated[
        int | None, typer.Option("--page", help="PDF input: only this page (1-based); default all", min=1)
    ] = None,
    dpi: Annotated[int, typer.Option("--dpi", help="PDF input: render resolution", min=36, max=600)] = 200,
) -> None:
    """Perturb an image or a text; --list the catalog; --gallery draw a contact sheet."""
    if list_:
        _list(group)
        return
    if gallery is not None:
        _gallery(gallery, source, names, group, cell, seed)
        return
    if replay is not None:
        applied = _read_record(replay)
        name, severity = applied.name, applied.severity
    if name is None:
        raise UsageError("give --name (see `mmchaos perturb --list`), --list or --gallery")
    if (source is None) == (text is None):
        raise UsageError("give an input: an image, .pdf or .txt file, or --text 'literal text' (not both)")
    if source is not None and source.suffix.lower() == ".pdf":
        _perturb_pdf(source, page, dpi, name, severity, seed, out, record, replay)
        return
    _perturb_one(source, text, name, severity, seed, out, record, replay)


def _list(groups: list[str] | None) -> None:
    from mmchaos import perturb

    table = Table(title="mmchaos perturbations")
    table.add_column("name", no_wrap=True)
    table.add_column("modality", no_wrap=True)
    table.add_column("group", no_wrap=True)
    table.add_column("description", overflow="fold", ratio=3)
    table.add_column("source", overflow="fold", ratio=2)
    selected = perturb.select(None, groups) if groups else perturb.select()
    for n in selected:
        cls = perturb.REGISTRY.get(n)
        table.add_row(n, cls.modality.value, cls.group, cls.summary(), cls.source)
    Console().print(table)


def _read_record(path: Path) -> Any:
    from mmchaos.perturb import Applied

    try:
        data = json.loads(path.read_text("utf-8"))
        return Applied.from_dict(data)
    except FileNotFoundError as exc:
        raise DataError(f"record not found: {path}", code="data_missing_file") from exc
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is not a perturbation record ({type(exc).__name__}: {exc})") from exc


def _perturb_one(
    source: Path | None,
    text: str | None,
    name: str,
    severity: int,
    seed: int,
    out: Path | None,
    record: Path | None,
    replay: Path | None,
) -> None:
    from mmchaos import perturb
    from mmchaos.perturb import Modality, MultimodalSample

    pert = perturb.get(name)
    is_text = text is not None or (source is not None and source.suffix.lower() in _TEXT_SUFFIXES)
    item: Any = text if text is not None else (_read_text(source) if is_text else _read_image(source))  # type: ignore[arg-type]
    wanted = Modality.TEXT if is_text else Modality.IMAGE
    wrapped = pert.modality == Modality.MULTIMODAL
    if pert.modality not in (wanted, Modality.MULTIMODAL):
        article = "an" if wanted == Modality.IMAGE else "a"
        raise UsageError(f"{name} perturbs {pert.modality.value}s, and the input is {article} {wanted.value}")
    if wrapped:
        item = MultimodalSample(text=item) if is_text else MultimodalSample(image=item)
    if replay is not None:
        applied = _read_record(replay)
        outputs = pert.replay([item], applied)
    else:
        outputs, applied = pert([item], severity, rng=seed)
    result = outputs[0]
    if wrapped:
        result = result.text if is_text else result.image
    if record is not None:
        record.write_text(json.dumps(applied.to_dict(), indent=2, ensure_ascii=False), "utf-8")
    if is_text:
        if out is None:
            typer.echo(result)
            return
        out.write_text(result, "utf-8")
    else:
        if out is None:
            raise UsageError("give -o OUT.png (or .jpg, .webp, ...) for the perturbed image")
        _write_image(out, result)
    typer.echo(f"wrote {out} ({name}, severity {applied.severity}, seed {seed})")


def _perturb_pdf(
    source: Path,
    page: int | None,
    dpi: int,
    name: str,
    severity: int,
    seed: int,
    out: Path | None,
    record: Path | None,
    replay: Path | None,
) -> None:
    """Render the chosen pages, perturb them as one batch, write an image (one page) or a PDF."""
    from mmchaos import perturb
    from mmchaos.data.pdf import page_count, render_page
    from mmchaos.perturb import Modality

    pert = perturb.get(name)
    if pert.modality != Modality.IMAGE:
        raise UsageError(f"{name} perturbs {pert.modality.value}s; the pages of a PDF are images")
    if out is None:
        raise UsageError("give -o OUT.pdf for the perturbed pages (or -o OUT.png with --page N)")
    count = page_count(source)
    if page is not None and page > count:
        raise UsageError(f"{source} has no page {page} (it has {count})")
    numbers = [page] if page is not None else list(range(1, count + 1))
    to_pdf = out.suffix.lower() == ".pdf"
    if not to_pdf and len(numbers) != 1:
        raise UsageError(f"{source} has {count} pages: give --page N to write one as an image, or -o OUT.pdf")
    pages = [render_page(source, n - 1, dpi) for n in numbers]
    outputs, applied = (
        pert.replay(pages, _read_record(replay)) if replay is not None else pert(pages, severity, rng=seed)
    )
    if record is not None:
        record.write_text(json.dumps(applied.to_dict(), indent=2, ensure_ascii=False), "utf-8")
    if to_pdf:
        _write_pdf(out, list(outputs), dpi)
    else:
        _write_image(out, outputs[0])
    what = f"page {numbers[0]}" if len(numbers) == 1 else f"{len(numbers)} pages"
    typer.echo(f"wrote {out} ({what} of {source.name} at {dpi} dpi, {name}, severity {applied.severity}, seed {seed})")


def _write_pdf(path: Path, pages: list[Any], dpi: int) -> None:
    from PIL import Image

    arrays = [np.asarray(p) for p in pages]
    images = [Image.fromarray(np.ascontiguousarray(a if a.ndim == 2 else a[..., :3])) for a in arrays]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        images[0].save(path, format="PDF", save_all=True, append_images=images[1:], resolution=float(dpi))
    except OSError as exc:
        raise DataError(f"cannot write {path}: {exc}", code="data_unwritable") from exc


def _read_text(path: Path) -> str:
    try:
        return path.read_text("utf-8")
    except FileNotFoundError as exc:
        raise DataError(f"input not found: {path}", code="data_missing_file") from exc
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{path} is not valid UTF-8 ({exc.reason} at byte {exc.start})", code="data_bad_encoding"
        ) from exc
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc}", code="data_unreadable") from exc


def _read_image(path: Path) -> Any:
    """Decode keeping the layout mmchaos perturbs: L stays gray, transparency stays RGBA, rest RGB."""
    from mmchaos.data.images import ImageLoadError, open_upright

    try:
        with open_upright(path) as img:
            if img.mode in ("L", "RGB", "RGBA"):
                pass
            elif img.mode in ("LA", "PA") or (img.mode == "P" and "transparency" in img.info):
                img = img.convert("RGBA")
            elif img.mode == "1":
                img = img.convert("L")
            elif img.mode in ("I", "I;16", "I;16B", "F"):
                img = _to_gray8(img)
            else:
                img = img.convert("RGB")
            return np.asarray(img, dtype=np.uint8).copy()
    except ImageLoadError as exc:
        if exc.code == "data_missing_file":
            raise DataError(f"input not found: {path}", code="data_missing_file") from exc
        raise DataError(f"cannot read image {path}: {exc.message}", code="data_unreadable_image") from exc
    except (OSError, ValueError) as exc:  # a mode conversion Pillow cannot do
        raise DataError(f"cannot read image {path}: {exc}", code="data_unreadable_image") from exc


def _to_gray8(img: Any) -> Any:
    from PIL import Image

    arr = np.asarray(img, dtype=np.float64)
    lo, hi = float(arr.min()), float(arr.max())
    scaled = (arr - lo) / (hi - lo) * 255 if hi > lo else np.zeros_like(arr)
    return Image.fromarray(np.clip(np.rint(scaled), 0, 255).astype(np.uint8), "L")


def _write_image(path: Path, image: Any) -> None:
    from PIL import Image

    fmt = _IMAGE_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise ConfigError(f"cannot tell the image format from {path.name!r}; use .png, .jpg, .webp, .bmp or .tif")
    arr = np.asarray(image)
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[..., 0]
    if fmt == "JPEG" and arr.ndim == 3 and arr.shape[2] == 4:
        raise ConfigError("JPEG cannot store transparency; write the RGBA result to a .png")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.ascontiguousarray(arr)).save(path, format=fmt)
    except OSError as exc:
        raise DataError(f"cannot write {path}: {exc}", code="data_unwritable") from exc


def _gallery(
    path: Path, source: Path | None, names: list[str] | None, groups: list[str] | None, cell: int, seed: int
) -> None:
    from mmchaos import perturb
    from mmchaos.perturb import Modality

    image = _read_image(source) if source is not None else _sample_image(cell)
    if image.ndim == 2:
        image = np.repeat(image[..., None], 3, axis=2)
    image = np.ascontiguousarray(image[..., :3])
    chosen = perturb.select(names, groups) if (names or groups) else perturb.select()
    rows = [n for n in chosen if perturb.REGISTRY.get(n).modality == Modality.IMAGE]
    if not rows:
        raise UsageError("the gallery shows image perturbations; the selection has none")
    sheet = contact_sheet(image, rows, cell, seed)
    _write_image(path, sheet)
    typer.echo(f"wrote {path}: {len(rows)} perturbations x severities 0-5")


def _sample_image(size: int) -> Any:
    from mmchaos.data.shapes import make_sample

    return make_sample(0, "test", 3, image_size=size).image


def contact_sheet(image: Any, names: list[str], cell: int = 112, seed: int = 0) -> Any:
    """Rows: perturbations; columns: clean, then severities 1-5; names on the left."""
    import cv2
    from PIL import Image, ImageDraw, ImageFont

    from mmchaos import perturb

    label_w, head_h, pad = 168, 22, 4
    width = label_w + 6 * (cell + pad)
    height = head_h + len(names) * (cell + pad)
    sheet = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default(size=13)
    for col, title in enumerate(["clean", "1", "2", "3", "4", "5"]):
        draw.text((label_w + col * (cell + pad) + cell // 2 - 12, 4), title, fill=(0, 0, 0), font=font)
    for row, name in enumerate(names):
        y = head_h + row * (cell + pad)
        draw.text((4, y + cell // 2 - 8), name, fill=(0, 0, 0), font=font)
        pert = perturb.get(name)
        for col in range(6):
            out = pert([image], severity=col, rng=seed)[0][0]
            tile = _fit(out, cell, cv2)
            sheet.paste(Image.fromarray(tile), (label_w + col * (cell + pad), y))
    return np.asarray(sheet)


def _fit(image: Any, cell: int, cv2: Any) -> Any:
    """Letterbox ``image`` into a ``cell`` x ``cell`` RGB tile."""
    rgb = image if image.ndim == 3 else np.repeat(image[..., None], 3, axis=2)
    rgb = np.ascontiguousarray(rgb[..., :3])
    h, w = rgb.shape[:2]
    scale = cell / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    resized = cv2.resize(rgb, (nw, nh), interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_NEAREST)
    tile = np.full((cell, cell, 3), 255, np.uint8)
    top, left = (cell - nh) // 2, (cell - nw) // 2
    tile[top : top + nh, left : left + nw] = resized
    return tile
