"""The fuzzer's parts without worker processes: formats, mutators, signatures, minimisation."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from mmchaos.executors.jobs import ErrorInfo, JobResult
from mmchaos.fuzz.formats import build_png, parse_ifd, parse_jpeg, parse_png, sniff
from mmchaos.fuzz.minimise import MinimiseBudget, Minimiser
from mmchaos.fuzz.mutators import MUTATORS, mutate
from mmchaos.fuzz.seeds import corpus_seeds, format_seeds, shrink, text_seeds
from mmchaos.fuzz.signature import judge
from mmchaos.hostile import CorpusBase, get_case

IMG = np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)
SEEDS = format_seeds(IMG)


def _gif_with_frame(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).convert("P").save(buf, "GIF")
    blob = bytearray(buf.getvalue())
    desc = blob.find(b"\x2c", 13)
    blob[desc + 5 : desc + 9] = struct.pack("<HH", width, height)
    return bytes(blob)


def test_the_shared_loader_refuses_a_gif_frame_larger_than_its_screen() -> None:
    """Found by the fuzzer: an 8x8 GIF screen whose frame declares 65535x65535 escaped as an
    untyped DecompressionBombError from ``load()`` (the header-only size check saw 8x8)."""
    from mmchaos.data.images import ImageLoadError, load_image

    with pytest.raises(ImageLoadError) as info:
        load_image(_gif_with_frame(0xFFFF, 0xFFFF))
    assert info.value.code == "image_too_large"


@pytest.mark.parametrize("spec", MUTATORS, ids=lambda m: m.name)
def test_every_mutator_is_deterministic_under_a_seed_and_changes_its_input(spec: object) -> None:
    from mmchaos.fuzz.mutators import MutatorSpec

    assert isinstance(spec, MutatorSpec)
    seeds = [s for s in SEEDS + text_seeds("a red circle") if not spec.formats or _fmt(s) in spec.formats]
    assert seeds, f"{spec.name} applies to no seed"
    donors = [s.data for s in seeds]
    changed = 0
    for i, seed in enumerate(seeds):
        a = spec.fn(np.random.default_rng(i), seed.data, donors)
        b = spec.fn(np.random.default_rng(i), seed.data, donors)
        assert a == b
        changed += a is not None and a != seed.data
    assert changed, f"{spec.name} never changed a seed it applies to"


def _fmt(seed: object) -> str:
    data = getattr(seed, "data", b"")
    return "text" if getattr(seed, "kind", "") == "text_bytes" else sniff(data)


def test_png_mutations_keep_every_crc_valid_so_they_reach_the_decoder() -> None:
    png = next(s.data for s in SEEDS if s.name == "png_chunks")
    rng = np.random.default_rng(3)
    tags = set()
    for _ in range(200):
        out, names = mutate(rng, png, "image_bytes", [png], structured=1.0)
        if any(not n.startswith("png_") or n == "png_bad_length_or_crc" for n in names):
            continue
        parsed = parse_png(out)
        assert parsed is not None
        for c in parsed[0]:
            tags.add(c.tag)
        raw = out[8:]
        pos = 0
        while pos + 12 <= len(raw):
            (length,) = struct.unpack(">I", raw[pos : pos + 4])
            body = raw[pos + 4 : pos + 8 + length]
            (crc,) = struct.unpack(">I", raw[pos + 8 + length : pos + 12 + length])
            assert crc == zlib.crc32(body) & 0xFFFFFFFF
            pos += 12 + length
    assert {b"sPLT", b"eXIf", b"iCCP", b"tEXt"} <= tags, "chunk insertion reaches the ancillary chunks"


def test_the_exif_mutator_reaches_out_of_range_orientations_in_jpeg_png_and_webp() -> None:
    seen: dict[str, set[int]] = {}
    for seed in SEEDS:
        fmt = sniff(seed.data)
        if fmt not in ("jpeg", "png", "webp"):
            continue
        rng = np.random.default_rng(0)
        for _ in range(60):
            out, _ = mutate(rng, seed.data, "image_bytes", [], structured=1.0)
            try:
                with Image.open(io.BytesIO(out)) as img:
                    value = img.getexif().get(0x0112)
            except Exception:
                continue
            if value is not None:
                seen.setdefault(fmt, set()).add(int(value))
    for fmt in ("jpeg", "png", "webp"):
        assert any(v == 0 or v > 8 for v in seen.get(fmt, ())), (fmt, seen.get(fmt))


def test_jpeg_and_tiff_structures_round_trip() -> None:
    jpeg = next(s.data for s in SEEDS if s.name == "jpeg_exif_icc")
    segments = parse_jpeg(jpeg)
    assert segments and {0xE1, 0xE2, 0xC0, 0xDA} <= {s.marker for s in segments}
    app1 = next(s for s in segments if s.marker == 0xE1)
    parsed = parse_ifd(app1.payload[6:])
    assert parsed is not None and any(e.tag == 0x0112 and e.value == 1 for e in parsed[2])
    png = next(s.data for s in SEEDS if s.name == "png_chunks")
    chunks, tail = parse_png(png) or ([], b"")
    assert build_png(chunks, tail) == png


def test_the_hostile_corpus_seeds_its_small_valid_files_and_texts_only() -> None:
    base = CorpusBase(shrink(IMG), "a red circle")
    seeds = corpus_seeds(base, ["image_bytes", "text_bytes"])
    names = {s.name.removeprefix("corpus:") for s in seeds}
    assert {"exif_orientation_6", "mode_CMYK_jpeg", "animated_gif", "text_invalid_utf8"} <= names
    assert not any(n.startswith(("size_", "int32_", "array_")) for n in names)  # no bombs, no arrays
    assert "zero_byte" not in names and all(0 < len(s.data) <= 1 << 16 for s in seeds)
    exif = next(s for s in seeds if s.name == "corpus:exif_orientation_6")
    assert exif.kind == "image_bytes" and exif.data == get_case("exif_orientation_6").build(base).data
    assert {s.kind for s in corpus_seeds(base, ["text_bytes"])} == {"text_bytes"}


def test_mutations_are_capped_in_length() -> None:
    text = b"a photo " * 1000
    rng = np.random.default_rng(0)
    for _ in range(200):
        text, _ = mutate(rng, text, "text_bytes", [], max_len=20_000)
        assert len(text) <= 20_000


def _test_in_process(predicate: object) -> object:
    def test(candidates: list[bytes]) -> list[bool]:
        return [bool(predicate(c)) for c in candidates]  # type: ignore[operator]

    return test


def test_ddmin_shrinks_a_png_to_the_chunk_that_matters_with_valid_crcs() -> None:
    from mmchaos.fuzz.formats import PngChunk, png_chunk_bytes

    png = next(s.data for s in SEEDS if s.name == "png_chunks")
    chunks, _ = parse_png(png) or ([], b"")
    chunks.insert(2, PngChunk(b"sPLT", b"palette\x00\x08" + b"\x00" * 30))
    bad = build_png(chunks)

    def crashes(blob: bytes) -> bool:  # the planted bug: any sPLT chunk
        parsed = parse_png(blob)
        return parsed is not None and any(c.tag == b"sPLT" for c in parsed[0])

    m = Minimiser(_test_in_process(crashes), MinimiseBudget(max_tests=500))  # type: ignore[arg-type]
    small = m.minimise(bad)
    assert crashes(small) and len(small) < 40 and m.tests <= 500
    [chunk] = (parse_png(small) or ([], b""))[0]
    assert chunk.tag == b"sPLT" and small.endswith(png_chunk_bytes(chunk))


def test_ddmin_respects_its_budget_and_keeps_a_failing_input() -> None:
    data = bytes(range(256)) * 4

    def fails(blob: bytes) -> bool:
        return b"\x10\x11" in blob and b"\xf0" in blob

    m = Minimiser(_test_in_process(fails), MinimiseBudget(max_tests=15))  # type: ignore[arg-type]
    small = m.minimise(data)
    assert fails(small) and m.tests <= 15


def _job(value: dict[str, object], status: str = "ok", **kw: object) -> JobResult:
    return JobResult(status, value=value, **kw)  # type: ignore[arg-type]


def test_signatures_name_the_failure_and_blank_what_varies() -> None:
    tb = 'Traceback:\n  File "/x/site.py", line 3, in outer\n  File "/y/dec.py", line 9, in parse_exif\nIndexError'
    a = ErrorInfo("IndexError", "index 9 is out of bounds for axis 0 with size 9", False, "", tb)
    b = ErrorInfo("IndexError", "index 255 is out of bounds for axis 0 with size 9", False, "", tb)
    ja = judge("image_bytes", _job({"status": "raised", "error": a, "method": "embed_encoded_images"}))
    jb = judge("image_bytes", _job({"status": "raised", "error": b, "method": "embed_encoded_images"}))
    assert ja.outcome == "crashed" and ja.signature == jb.signature
    assert (
        ja.signature
        == "image_bytes:crashed:IndexError@dec.py:parse_exif: index N is out of bounds for axis N with size N"
    )
    typed = ErrorInfo("TargetCallError", "corrupt", True, "image_undecodable")
    assert judge("image_bytes", _job({"status": "raised", "error": typed})).outcome == "rejected"
    seg = JobResult(
        "crashed",
        detail="SIGSEGV (exit -11)",
        stderr='Fatal Python error\n  File "/a/native.py", line 4 in read_chunk\n  File "/a/b.py", line 1 in main',
    )
    assert judge("image_bytes", seg).signature == "image_bytes:crashed:SIGSEGV@native.py:read_chunk"
    assert judge("text_bytes", JobResult("hung", detail="no answer")).signature == "text_bytes:hung"
    nan = {
        "status": "ok",
        "method": "embed_encoded_images",
        "summary": {
            "type": "array",
            "shape": [1, 4],
            "dtype": "float32",
            "nonfinite": 4,
            "all_zero": False,
            "constant": False,
        },
    }
    assert judge("image_bytes", _job(nan)).signature == "image_bytes:garbage:nonfinite"
    const = {**nan, "summary": {**nan["summary"], "nonfinite": 0, "constant": True}}  # type: ignore[dict-item]
    assert judge("image_bytes", _job(const)).signature == "image_bytes:garbage:constant"
    ok = {**nan, "summary": {**nan["summary"], "nonfinite": 0}}  # type: ignore[dict-item]
    assert judge("image_bytes", _job(ok)).outcome == "ok"


def test_the_worker_summarises_answers_and_probes_features() -> None:
    from mmchaos.fuzz.worker import probe_features, summarise_output

    s = summarise_output(np.full((1, 8), np.nan, np.float32))
    assert s["nonfinite"] == 8 and s["shape"] == [1, 8]
    assert summarise_output(np.ones((1, 8)))["constant"] is True
    assert summarise_output(["text"]) == {"type": "texts", "n": 1, "lengths": [4]}
    png = next(s.data for s in SEEDS if s.name == "png_chunks")
    feats = probe_features("image_bytes", png)
    assert "fmt:PNG:RGB" in feats and "decoded:PNG" in feats and "orientation:1" in feats
    assert any(f.startswith("pil_error:") for f in probe_features("image_bytes", png[:40]))
    assert "utf8:ok" in probe_features("text_bytes", "caf\u00e9".encode())
    assert probe_features("text_bytes", b"\xff")[0].startswith("utf8:invalid start byte")


def test_schema_examples_and_broken_bodies() -> None:
    from mmchaos.fuzz.openapi import _cases, example

    doc = {"components": {"schemas": {"Req": {"type": "object", "required": ["model", "input"], "properties": {
        "model": {"type": "string"},
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "dimensions": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}}}}  # fmt: skip
    schema = {"$ref": "#/components/schemas/Req"}
    body = example(schema, doc, {"model": "m"})
    assert body == {"model": "m", "input": "a photo of a cat"}
    cases = _cases(body, doc["components"]["schemas"]["Req"]["properties"], np.random.default_rng(0))  # type: ignore[index]
    labels = [c[0] for c in cases]
    assert "valid" in labels and "missing model" in labels and "input=null" in labels and "deeply nested" in labels
    assert len(labels) == len(set(labels))


def test_fuzz_replay_refuses_bad_usage_with_exit_code_2(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    from mmchaos.cli import main

    root = Path(str(tmp_path))
    blob = root / "x.png"
    blob.write_bytes(b"\x89PNG")
    cases = [
        (
            ["fuzz-replay", str(root / "missing.png"), "--target", "py:tests.fakes.targets:hash_embed"],
            "data_missing_file",
        ),
        (
            ["fuzz-replay", str(blob), "--target", "py:tests.fakes.targets:hash_embed", "--kind", "audio"],
            "fuzz_bad_kind",
        ),
        (
            ["fuzz-replay", str(blob), "--target", "py:tests.fakes.targets:hash_embed", "--option", "device"],
            "config_invalid",
        ),
    ]
    for argv, code in cases:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert f"error [{code}]" in capsys.readouterr().err


def _campaign(target: object, cases: int, seed: int = 0) -> object:
    from mmchaos.executors.jobs import WorkerSpec
    from mmchaos.executors.pool import InProcessRunner
    from mmchaos.fuzz import FuzzConfig, Fuzzer
    from mmchaos.fuzz.worker import fuzz_job

    runner = InProcessRunner(target, WorkerSpec(uri="inprocess"), fuzz_job)
    config = FuzzConfig(max_cases=cases, max_seconds=120.0, minimise_tests=80)
    return Fuzzer(runner, SEEDS + text_seeds("a red circle"), config, np.random.default_rng(seed)).run()


def test_a_campaign_is_deterministic_for_a_seed_and_a_case_budget() -> None:
    from tests.fakes.broken_targets import ContractSafeTarget

    a, b = (_campaign(ContractSafeTarget(), 120) for _ in range(2))
    for attr in ("cases", "outcomes", "features", "queue"):
        assert getattr(a, attr) == getattr(b, attr), attr
    assert a.cases == 120 and a.stopped_by == "cases" and not a.failures  # type: ignore[attr-defined]


def test_the_loop_finds_and_minimises_the_orientation_bug_in_process() -> None:
    from tests.fakes.fuzz_targets import OrientationTableTarget

    report = _campaign(OrientationTableTarget(), 400)
    [failure] = report.failures.values()  # type: ignore[attr-defined]
    assert failure.signature.startswith("image_bytes:crashed:IndexError@fuzz_targets.py:decode_image")
    assert failure.minimised is not None and len(failure.minimised) <= len(failure.data)
    assert report.first_failure_case <= 400  # type: ignore[attr-defined]
    with Image.open(io.BytesIO(failure.minimised)) as img:
        assert int(img.getexif()[0x0112]) >= 9, "the reproducer carries an out-of-range orientation"
