"""The step-1 building blocks: declared-size arithmetic, the default decoding path, the corpus."""

from __future__ import annotations

import resource

import numpy as np
import pytest

from mmchaos.data.shapes import make_sample
from mmchaos.errors import TargetCallError
from mmchaos.guard.limits import (
    INT32_MAX,
    SizeLimits,
    check_declared_size,
    declared_elements,
    int32_wrapped_product,
)
from mmchaos.hostile import CASES, CorpusBase, get_case, select_cases
from mmchaos.targets.base import Target
from mmchaos.targets.decode import check_image_array

BASE = CorpusBase(np.asarray(make_sample(0, "test", 0).image, dtype=np.uint8), "a photo of a red circle")


def test_declared_elements_are_exact_and_int32_wrap_is_shown() -> None:
    assert declared_elements((46_341, 46_341)) == 2_147_488_281 > INT32_MAX
    # what 32-bit code computes for the 000 incident's shapes: wrapped, even negative
    assert int32_wrapped_product((46_341, 46_341)) == 2_147_488_281 - 2**32
    assert int32_wrapped_product((50_000, 50_000, 3)) == 7_500_000_000 % 2**32 - 2**32
    assert int32_wrapped_product((2048, 2048, 3)) == 12_582_912  # the incident's own shape fits
    with pytest.raises(ValueError, match="negative"):
        declared_elements((3, -1))


@pytest.mark.parametrize(
    ("shape", "reason"),
    [
        ((46_341, 46_341, 1), "int32_elements"),
        ((1, 715_827_883, 3), "int32_elements"),  # pixels fit, channels do not
        ((2**40, 2**40, 3), "int64_elements"),
        ((10, -1, 3), "negative"),
    ],
)
def test_check_declared_size_flags_overflow(shape: tuple[int, ...], reason: str) -> None:
    problem = check_declared_size(shape)
    assert problem is not None and problem.reason == reason, problem
    assert problem.code == ("shape_negative" if reason == "negative" else "element_count_overflow")
    if reason == "int32_elements":
        assert "32-bit arithmetic would give" in problem.message


def test_check_declared_size_other_limits_and_acceptance() -> None:
    assert check_declared_size((2048, 2048, 3)) is None
    assert check_declared_size((1, 1, 3)) is None
    problem = check_declared_size((20_000, 20_000, 3), SizeLimits(max_pixels=89_478_485))
    assert problem is not None and (problem.code, problem.reason) == ("image_too_large", "pixels")
    problem = check_declared_size((100, 9000, 3), SizeLimits(max_side=8192))
    assert problem is not None and (problem.code, problem.reason) == ("image_too_large", "side")
    problem = check_declared_size((1000, 1000, 3), SizeLimits(max_bytes=1 << 20), itemsize=4)
    assert problem is not None and (problem.code, problem.reason) == ("image_too_large", "bytes")
    problem = check_declared_size((4, 100, 3), SizeLimits(min_side=8))
    assert problem is not None and (problem.code, problem.reason) == ("image_too_small", "min_side")
    problem = check_declared_size((10, 4000, 3), SizeLimits(max_aspect_ratio=200.0))
    assert problem is not None and (problem.code, problem.reason) == ("bad_aspect_ratio", "aspect_ratio")


def test_corpus_is_deterministic_and_complete() -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)) >= 50
    for wanted in ("zero_byte", "decompression_bomb", "size_20000x20000", "mode_I16_png", "mode_CMYK_jpeg",
                   "exif_orientation_8", "animated_webp", "array_nan", "text_invalid_utf8", "text_emoji"):  # fmt: skip
        assert wanted in names
    assert sum(c.over_int32 for c in CASES) == 5
    for case in CASES:
        if case.kind == "image_array":
            continue  # arrays are compared below
        a, b = case.build(BASE).data, case.build(BASE).data
        assert a == b, case.name
    assert [c.name for c in select_cases(["exif"], [])] == [f"exif_orientation_{o}" for o in range(2, 9)]
    assert "mode_F_tiff" not in [c.name for c in select_cases(["mode_*"], ["*_tiff"])]


def test_giant_declarations_are_tiny_files_and_views() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    bomb = get_case("decompression_bomb").build(BASE).data
    header = get_case("int32_png_50000x50000").build(BASE).data
    view = get_case("int32_array_50000x50000x3").build(BASE).data
    assert len(bomb) < 64 * 1024 and len(header) < 1024
    assert view.shape == (50_000, 50_000, 3) and 0 in view.strides
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 200, f"building the giant cases allocated {grown_mb:.0f} MB"


def test_default_decoder_rejects_what_it_must_with_stable_codes() -> None:
    target = Target()
    codes = {}
    for case in CASES:
        if case.kind != "image_bytes" or case.expect != "reject":
            continue
        with pytest.raises(TargetCallError) as info:
            target.decode_image(case.build(BASE).data)
        codes[case.name] = info.value.code
    assert codes["zero_byte"] == "image_empty"
    assert codes["truncated_png"] == codes["truncated_jpeg"] == "truncated_image"
    assert codes["random_bytes"] == codes["html_error_page"] == "image_undecodable"
    assert codes["decompression_bomb"] == "image_too_large"
    assert codes["int32_png_50000x50000"] == codes["int32_png_46341x46341"] == "element_count_overflow"
    assert codes["int32_document_page_a0_1200dpi"] == "element_count_overflow"
    assert codes["document_pdf_bytes"] == "image_undecodable"


def test_a_scanned_page_decodes_whole() -> None:
    page = Target().decode_image(get_case("document_page_a4_300dpi").build(BASE).data)
    assert page.shape == (3508, 2480, 3)
    assert int(page[0, 0].min()) == 255 and int(page[1600, 1000].max()) == 0  # white margin, a table rule


def test_default_decoder_decodes_valid_encodings_exactly() -> None:
    target = Target()
    for case in CASES:
        if case.kind != "image_bytes" or case.expect != "equivalent":
            continue
        payload = case.build(BASE)
        decoded = target.decode_image(payload.data)
        np.testing.assert_array_equal(decoded, payload.expected, err_msg=case.name)
        for bug, wrong in payload.wrong.items():
            assert not np.array_equal(decoded, wrong), f"{case.name}: the known bug {bug} is indistinguishable"
    with pytest.raises(TargetCallError, match="mode F"):
        target.decode_image(get_case("mode_F_tiff").build(BASE).data)
    with pytest.raises(TargetCallError) as info:
        target.decode_text(get_case("text_invalid_utf8").build(BASE).data)
    assert info.value.code == "bad_utf8"


def test_check_image_array_refuses_without_allocating() -> None:
    view = get_case("int32_array_1x715827883x3").build(BASE).data
    with pytest.raises(TargetCallError) as info:
        check_image_array(view)
    assert info.value.code == "element_count_overflow"
    for bad, code in [
        (np.zeros((0, 0, 3), np.uint8), "image_empty"),
        (np.zeros((4, 4), np.uint8), "image_bad_shape"),
        (np.zeros((4, 4, 3), np.float32), "image_bad_dtype"),
    ]:
        with pytest.raises(TargetCallError) as info:
            check_image_array(bad)
        assert info.value.code == code
    check_image_array(BASE.image)
