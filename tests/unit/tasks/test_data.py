"""Data loaders on good and bad files: every problem is a DataError naming file and line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmchaos.data import load_dataset
from mmchaos.data.shapes import CLASSES, make_shapes
from mmchaos.errors import DataError


@pytest.fixture()
def images(tmp_path: Path) -> Path:
    root = tmp_path / "imgs"
    root.mkdir()
    for i, colour in enumerate([(255, 0, 0), (0, 0, 255)]):
        Image.new("RGB", (16, 16), colour).save(root / f"{i}.png")
    return root


def test_shapes_is_deterministic_and_index_stable() -> None:
    a, b = make_shapes(10, seed=4), make_shapes(20, seed=4)
    assert all(x.image.tobytes() == y.image.tobytes() and x.caption == y.caption for x, y in zip(a, b))
    assert make_shapes(5, seed=4, split="train")[0].image.tobytes() != a[0].image.tobytes()
    assert len(CLASSES) >= 24 and set(a.classes) == set(CLASSES)
    assert all(s.label in CLASSES and s.label.split()[0] in s.caption for s in a)


def test_builtin_spec_options_and_errors() -> None:
    d = load_dataset("builtin:shapes?n=7&seed=2&split=val")
    assert len(d) == 7 and d.source.endswith("n=7")
    with pytest.raises(DataError, match="split"):
        load_dataset("builtin:shapes?split=holdout")
    with pytest.raises(DataError, match="unknown built-in dataset"):
        load_dataset("builtin:mnist")
    with pytest.raises(DataError, match="builtin:shapes"):
        load_dataset("shapes")


def test_jsonl_good(images: Path, tmp_path: Path) -> None:
    f = tmp_path / "eval.jsonl"
    rows = [
        {"image": "imgs/0.png", "caption": "a red square", "label": "red"},
        {"image": "imgs/1.png", "caption": "blue", "label": "blue"},
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    d = load_dataset(str(f))
    assert len(d) == 2 and d.has_captions and d.has_labels and d.classes == ["blue", "red"]
    assert d[0].load_image().shape == (16, 16, 3)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            '{"image": "imgs/0.png", "caption": "ok"}\n{"image": "imgs/missing.png", "caption": "x"}\n',
            r"eval.jsonl:2: image file not found",
        ),
        ('{"image": "imgs/0.png", "caption": "ok"}\nnot json\n', r"eval.jsonl:2: not valid JSON"),
        ('{"image": "imgs/0.png"}\n', r"eval.jsonl:1: a row needs at least one of"),
        ('{"image": "imgs/0.png", "caption": 3}\n', r"eval.jsonl:1: 'caption' must be a string"),
        ('{"image": "imgs/0.png", "capton": "x"}\n', r"eval.jsonl:1: unknown field"),
        ('["imgs/0.png"]\n', r"eval.jsonl:1: each line must be a JSON object"),
        (
            '{"image": "imgs/0.png", "caption": "a"}\n{"image": "imgs/1.png", "label": "b"}\n',
            r"1 of 2 rows have 'caption'",
        ),
        ("", r"no samples"),
    ],
)
def test_jsonl_bad_rows_name_the_line(images: Path, tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "eval.jsonl"
    f.write_text(content)
    with pytest.raises(DataError, match=message):
        load_dataset(str(f))


def test_unreadable_image_is_reported(images: Path, tmp_path: Path) -> None:
    (images / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    f = tmp_path / "eval.csv"
    f.write_text("image,caption\nimgs/0.png,red\nimgs/broken.png,broken\n")
    with pytest.raises(DataError, match=r"eval.csv:3: unreadable image") as info:
        load_dataset(str(f))
    assert info.value.code == "data_unreadable_image"


def test_csv_good_and_bad_header(images: Path, tmp_path: Path) -> None:
    f = tmp_path / "eval.csv"
    f.write_text("image,label\nimgs/0.png,red\nimgs/1.png,blue\n")
    assert load_dataset(str(f)).classes == ["blue", "red"]
    f.write_text("path,label\nimgs/0.png,red\n")
    with pytest.raises(DataError, match="'image' column"):
        load_dataset(str(f))
    f.write_text("image,label\nimgs/0.png,red,extra\n")
    with pytest.raises(DataError, match="eval.csv:2: more values"):
        load_dataset(str(f))


def test_folder_of_class_subfolders(tmp_path: Path) -> None:
    root = tmp_path / "data"
    for cls in ("red_square", "blue"):
        (root / cls).mkdir(parents=True)
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / cls / "a.png")
    d = load_dataset(str(root))
    assert d.classes == ["blue", "red square"] and len(d) == 2
    (root / "blue" / "notes.txt").write_text("hi")
    with pytest.raises(DataError, match="notes.txt: not an image file"):
        load_dataset(str(root))


def test_missing_dataset_path() -> None:
    with pytest.raises(DataError, match="dataset not found"):
        load_dataset("/nonexistent/eval.jsonl")


# -- the one EXIF-aware image loader (issue 9) ------------------------------------------------------


def _exif_rotated_jpeg(path: Path) -> np.ndarray:
    """A JPEG stored sideways with EXIF orientation 6; returns the upright picture it shows."""
    upright = np.zeros((24, 40, 3), np.uint8)
    upright[:, :20] = (250, 10, 10)
    upright[:, 20:] = (10, 10, 250)
    stored = Image.fromarray(upright).transpose(Image.Transpose.ROTATE_90)  # what the camera wrote
    exif = Image.Exif()
    exif[0x0112] = 6
    stored.save(path, "JPEG", quality=95, exif=exif)
    return upright


def test_targets_datasets_and_the_cli_read_images_through_one_loader(tmp_path: Path) -> None:
    from mmchaos.cli.perturb_cmd import _read_image
    from mmchaos.data.base import load_image_file
    from mmchaos.data.images import load_image
    from mmchaos.targets.decode import decode_image_bytes

    path = tmp_path / "sideways.jpg"
    upright = _exif_rotated_jpeg(path)
    decoded = decode_image_bytes(path.read_bytes())
    assert decoded.shape == upright.shape, "EXIF orientation applied"
    # Red on the left, blue on the right (away from the edge, where JPEG's chroma blurs).
    assert np.abs(decoded[:, :12].astype(int) - upright[:, :12]).max() < 40
    assert np.abs(decoded[:, 28:].astype(int) - upright[:, 28:]).max() < 40
    for other in (load_image(path), load_image(path.read_bytes()), load_image_file(path), _read_image(path)):
        np.testing.assert_array_equal(other, decoded)


@pytest.mark.parametrize(
    ("width", "height", "color_type", "code"),
    [
        (24_000, 24_000, 6, "element_count_overflow"),  # RGBA: 4 channels while compositing
        (50_000, 50_000, 2, "element_count_overflow"),
        (20_000, 20_000, 2, "image_too_large"),
        (12_000, 12_000, 3, "image_too_large"),  # a palette picture
    ],
)
def test_loader_refuses_declared_sizes_with_preflights_codes(
    tmp_path: Path, width: int, height: int, color_type: int, code: str
) -> None:
    from prometheus_client import CollectorRegistry

    from mmchaos.data.base import load_image_file
    from mmchaos.data.images import ImageLoadError, load_image
    from mmchaos.guard import Preflight, PreflightError
    from tests.support.images import png_declaring

    blob = png_declaring(width, height, color_type)
    pf = Preflight(registry=CollectorRegistry(), tracer=False, max_pixels=89_478_485, max_side=65_535)
    with pytest.raises(PreflightError) as guard:
        pf.image(blob)
    with pytest.raises(ImageLoadError) as loader:
        load_image(blob)
    assert loader.value.code == guard.value.code == code
    (tmp_path / "big.png").write_bytes(blob)
    with pytest.raises(DataError, match=code.replace("_", " ").split()[0]) as data:
        load_image_file(tmp_path / "big.png")
    assert data.value.code == "data_unreadable_image"


def test_loader_codes_for_empty_missing_and_truncated(tmp_path: Path) -> None:
    from mmchaos.data.images import ImageLoadError, load_image

    good = tmp_path / "good.jpg"
    _exif_rotated_jpeg(good)
    cases = {
        "image_empty": b"",
        "data_missing_file": tmp_path / "absent.png",
        "truncated_image": good.read_bytes()[:300],
        "image_undecodable": b"<html>502 Bad Gateway</html>",
    }
    for code, source in cases.items():
        with pytest.raises(ImageLoadError) as info:
            load_image(source)
        assert info.value.code == code, (code, info.value.message)
        assert isinstance(info.value, DataError)


def test_a_dataset_row_with_a_giant_declared_image_is_a_data_error(images: Path, tmp_path: Path) -> None:
    # Pillow's own bomb check raised DecompressionBombError (not OSError) out of the row check.
    from tests.support.images import png_declaring

    (images / "giant.png").write_bytes(png_declaring(50_000, 50_000))
    f = tmp_path / "eval.csv"
    f.write_text("image,caption\nimgs/0.png,red\nimgs/giant.png,giant\n")
    with pytest.raises(DataError, match=r"eval.csv:3: unreadable image .*element") as info:
        load_dataset(str(f))
    assert info.value.code == "data_unreadable_image"
