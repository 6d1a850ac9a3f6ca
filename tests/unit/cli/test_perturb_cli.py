"""``mmchaos perturb``: --list, one image or text in and out, records and replay, the gallery,
and one-line errors with exit code 2."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmchaos.cli import app
from mmchaos.cli.perturb_cmd import register
from mmchaos.data.shapes import make_sample

register(app)
register(app)  # idempotent: the lead may also register it when building the app


@pytest.fixture()
def image_file(tmp_path: Path) -> Path:
    path = tmp_path / "in.png"
    Image.fromarray(make_sample(0, "test", 1, image_size=64).image).save(path)
    return path


def test_list_shows_every_perturbation(run_cli) -> None:  # type: ignore[no-untyped-def]
    from mmchaos import perturb

    code, out, _ = run_cli("perturb", "--list")
    assert code == 0
    for name in ("gaussian_noise", "screenshot_moire", "code_switch", "missing_modality", "typographic"):
        assert name in out
    assert len(perturb.names()) >= 55


def test_image_in_image_out_with_record_and_replay(run_cli, image_file: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out, rec = tmp_path / "out.png", tmp_path / "rec.json"
    code, stdout, err = run_cli("perturb", str(image_file), "--name", "screenshot_moire", "-s", "4", "-o", str(out),
                                "--record", str(rec))  # fmt: skip
    assert code == 0, err
    assert "wrote" in stdout and out.exists()
    first = np.asarray(Image.open(out))
    assert first.shape == (64, 64, 3) and not np.array_equal(first, np.asarray(Image.open(image_file)))
    record = json.loads(rec.read_text())
    assert record["name"] == "screenshot_moire" and record["severity"] == 4
    again = tmp_path / "again.png"
    code, _, err = run_cli("perturb", str(image_file), "--replay", str(rec), "-o", str(again))
    assert code == 0, err
    assert np.array_equal(np.asarray(Image.open(again)), first), "replaying the record gives the same bytes"


def test_grayscale_and_rgba_files_keep_their_layout(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gray = tmp_path / "gray.png"
    Image.fromarray(np.full((40, 50), 120, np.uint8), "L").save(gray)
    rgba = tmp_path / "rgba.png"
    Image.fromarray(np.full((40, 50, 4), 200, np.uint8), "RGBA").save(rgba)
    for src, mode in ((gray, "L"), (rgba, "RGBA")):
        out = tmp_path / f"out-{mode}.png"
        code, _, err = run_cli("perturb", str(src), "--name", "gaussian_noise", "-o", str(out))
        assert code == 0, err
        assert Image.open(out).mode == mode


def test_text_literal_and_file(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    code, out, err = run_cli("perturb", "--text", "a small red circle at the top left", "--name", "attribute_swap",
                             "-s", "2")  # fmt: skip
    assert code == 0, err
    assert out.strip() != "a small red circle at the top left" and len(out.split()) == 8
    src, dst = tmp_path / "caption.txt", tmp_path / "out.txt"
    src.write_text("café crème, s'il vous plaît\n", "utf-8")
    code, _, err = run_cli("perturb", str(src), "--name", "unicode_nfd", "-s", "5", "-o", str(dst))
    assert code == 0, err
    result = dst.read_text("utf-8")
    assert result != src.read_text("utf-8") and unicodedata.normalize("NFC", result) == src.read_text("utf-8")
    code, out, _ = run_cli("perturb", "--text", "a photo", "--name", "keyboard_typo", "-s", "0")
    assert code == 0 and out.strip() == "a photo", "severity 0 is the clean input"


def test_multimodal_perturbation_on_an_image(run_cli, image_file: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "blank.png"
    code, _, err = run_cli("perturb", str(image_file), "--name", "missing_modality", "-s", "5", "-o", str(out))
    assert code == 0, err
    blank = np.asarray(Image.open(out))
    assert blank.shape == (64, 64, 3) and not np.array_equal(blank, np.asarray(Image.open(image_file)))


def test_gallery_contact_sheet(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "sheet.png"
    code, stdout, err = run_cli("perturb", "--gallery", str(out), "--group", "noise", "--names", "typographic",
                                "--cell", "48")  # fmt: skip
    assert code == 0, err
    sheet = np.asarray(Image.open(out))
    assert sheet.shape[0] == 22 + 5 * (48 + 4) and sheet.shape[1] == 168 + 6 * (48 + 4)
    assert "5 perturbations" in stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["perturb"], "give --name"),
        (["perturb", "--name", "fog"], "give an input"),
        (["perturb", "--text", "hi", "--name", "fog"], "fog perturbs images, and the input is a text"),
        (["perturb", "--text", "hi", "--name", "fgo"], "did you mean fog"),
        (["perturb", "--text", "hi", "--name", "keyboard_typo", "-s", "9"], "severity must be one of 0-5"),
        (["perturb", "/no/such/file.png", "--name", "fog", "-o", "x.png"], "input not found"),
        (["perturb", "--gallery", "x.png", "--group", "text-char"], "the selection has none"),
        (["perturb", "--gallery", "x.png", "--group", "nois"], "did you mean noise"),
        (["perturb", "--replay", "/no/such/rec.json", "--text", "hi"], "record not found"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(run_cli, argv: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run_cli(*argv)
    assert code == 2
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_unreadable_image_and_bad_output_suffix(run_cli, tmp_path: Path, image_file: Path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    code, _, err = run_cli("perturb", str(bad), "--name", "fog", "-o", str(tmp_path / "o.png"))
    assert code == 2 and "cannot read image" in err
    code, _, err = run_cli("perturb", str(image_file), "--name", "fog", "-o", str(tmp_path / "o.xyz"))
    assert code == 2 and "image format" in err
    code, _, err = run_cli("perturb", str(image_file), "--name", "fog")
    assert code == 2 and "give -o" in err
