"""Preflight: every bad input class is refused with its stable code and HTTP status; good inputs
decode to correct RGB arrays; nothing (fuzzed bytes, mutated files, any text) escapes as a crash."""

from __future__ import annotations

import base64
import io
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from prometheus_client import CollectorRegistry

from mmchaos.errors import ConfigError, MMChaosError
from mmchaos.guard import (
    PREFLIGHT_CODES,
    InputContract,
    InputTooLargeError,
    MalformedInputError,
    Preflight,
    PreflightError,
    UnprocessableInputError,
    UnsupportedInputError,
)
from tests.support.images import png_declaring


def encode(im: Image.Image, fmt: str, **kwargs: Any) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kwargs)
    return buf.getvalue()


RNG = np.random.default_rng(0)
_YY, _XX = np.mgrid[0:48, 0:64]
PHOTO = Image.fromarray(np.stack([_XX * 4, _YY * 5, 255 - _XX * 2], axis=-1).astype(np.uint8))
JPEG = encode(PHOTO, "JPEG", quality=95)
PNG = encode(PHOTO, "PNG")
ANIMATED_GIF = encode(PHOTO.convert("P"), "GIF", save_all=True, append_images=[PHOTO.rotate(90).convert("P")])


@pytest.fixture()
def pf() -> Preflight:
    return Preflight(registry=CollectorRegistry(), tracer=False)


def reject(pf: Preflight, fn: str, data: Any, code: str) -> PreflightError:
    with pytest.raises(PreflightError) as info:
        getattr(pf, fn)(data)
    err = info.value
    assert err.code == code, err.message
    assert err.http_status == PREFLIGHT_CODES[code]
    assert isinstance(err, MMChaosError)
    body = err.to_dict()
    assert body["code"] == code and body["status"] == err.http_status and body["message"]
    return err


BAD_IMAGES = {
    "empty": (b"", "empty_input", MalformedInputError),
    "not_an_image": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 3, "bad_image", MalformedInputError),
    "truncated_jpeg": (JPEG[: len(JPEG) // 2], "truncated_image", MalformedInputError),
    "truncated_png": (PNG[: len(PNG) // 2], "truncated_image", MalformedInputError),
    "png_cut_in_header": (PNG[:33], "truncated_image", MalformedInputError),
    "tiff_not_allowed": (encode(PHOTO, "TIFF"), "unsupported_format", UnsupportedInputError),
    "20000x20000": (png_declaring(20000, 20000), "image_too_large", InputTooLargeError),
    "50000x50000": (png_declaring(50000, 50000), "element_count_overflow", InputTooLargeError),
    "1x1": (encode(Image.new("RGB", (1, 1)), "PNG"), "image_too_small", UnprocessableInputError),
    "4000x10": (encode(Image.new("RGB", (4000, 10)), "PNG"), "bad_aspect_ratio", UnprocessableInputError),
    # 5000x5000 RGB is 75 MB decoded from a file of ~100 bytes.
    "bomb": (png_declaring(5000, 5000), "decompression_bomb", InputTooLargeError),
}


@pytest.mark.parametrize("case", sorted(BAD_IMAGES))
def test_each_bad_image_class_is_refused_with_its_code(pf: Preflight, case: str) -> None:
    data, code, cls = BAD_IMAGES[case]
    err = reject(pf, "image", data, code)
    assert isinstance(err, cls)


def test_huge_declared_sizes_are_refused_from_the_header_alone(pf: Preflight) -> None:
    # Decoding 20000x20000 would allocate 1.2 GB and take seconds; the header check takes microseconds.
    start = time.perf_counter()
    for _ in range(20):
        reject(pf, "image", png_declaring(20000, 20000), "image_too_large")
    assert time.perf_counter() - start < 1.0


def test_int32_overflowing_element_count_is_caught_even_when_pixel_limits_allow_it() -> None:
    pf = Preflight(registry=CollectorRegistry(), tracer=False, max_pixels=10**12, max_side=10**6)
    err = reject(pf, "image", png_declaring(30000, 30000), "element_count_overflow")
    assert err.detail["elements"] == 30000 * 30000 * 3 > 2**31 - 1  # exact, no wrap-around
    # Also with an RGBA header (4 channels while compositing).
    err = reject(pf, "image", png_declaring(24000, 24000, color_type=6), "element_count_overflow")
    assert err.detail["elements"] == 24000 * 24000 * 4


def test_mode_and_animation_and_size_limits_of_a_custom_contract() -> None:
    pf = Preflight(
        InputContract(modes=frozenset({"RGB", "P"}), animated="reject", max_encoded_bytes=50_000),
        registry=CollectorRegistry(),
        tracer=False,
    )
    reject(pf, "image", encode(PHOTO.convert("L"), "PNG"), "unsupported_mode")
    reject(pf, "image", ANIMATED_GIF, "animated_image")
    big = encode(Image.fromarray(RNG.integers(0, 255, (200, 200, 3), dtype=np.uint8)), "PNG")
    assert len(big) > 50_000
    reject(pf, "image", big, "payload_too_large")


def test_good_jpeg_and_png_decode_to_rgb(pf: Preflight) -> None:
    for data, fmt in ((JPEG, "JPEG"), (PNG, "PNG"), (encode(PHOTO, "WEBP", lossless=True), "WEBP")):
        out = pf.image(data)
        assert out.format == fmt and out.size == (64, 48) and out.declared_size == (64, 48)
        assert out.array.shape == (48, 64, 3) and out.array.dtype == np.uint8
        err = np.abs(out.array.astype(int) - np.asarray(PHOTO).astype(int)).mean()
        assert err < (6 if fmt == "JPEG" else 0.01)


def test_modes_are_converted_correctly(pf: Preflight) -> None:
    rgba = np.zeros((16, 16, 4), dtype=np.uint8)
    rgba[:, :8] = (255, 0, 0, 255)  # opaque red left, fully transparent (black) right
    out = pf.image(encode(Image.fromarray(rgba, "RGBA"), "PNG")).array
    assert (out[:, :8] == (255, 0, 0)).all() and (out[:, 8:] == 255).all(), "alpha composited on white"

    grey16 = (np.arange(256, dtype=np.uint16).reshape(16, 16) * 257).astype(np.uint16)
    img16 = pf.image(encode(Image.fromarray(grey16), "PNG"))
    assert img16.mode.startswith("I")
    assert (img16.array[:, :, 0] == (grey16 >> 8)).all(), "16-bit keeps the high byte, not clipped to 255"

    grey = pf.image(encode(PHOTO.convert("L"), "PNG")).array
    assert (grey[:, :, 0] == grey[:, :, 1]).all() and (grey[:, :, 1] == grey[:, :, 2]).all()

    cmyk = pf.image(encode(PHOTO.convert("CMYK"), "JPEG", quality=95))
    assert cmyk.mode == "CMYK" and cmyk.array.shape == (48, 64, 3)

    pal = PHOTO.convert("P")
    pal.info["transparency"] = 0
    assert pf.image(encode(pal, "PNG", transparency=0)).array.shape == (48, 64, 3)


def test_exif_orientation_is_applied(pf: Preflight) -> None:
    arr = np.zeros((20, 40, 3), dtype=np.uint8)
    arr[:, :20] = (255, 0, 0)
    arr[:, 20:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: display needs a 90-degree clockwise turn
    out = pf.image(encode(Image.fromarray(arr), "JPEG", quality=95, exif=exif))
    assert out.orientation == 6 and out.declared_size == (40, 20) and out.size == (20, 40)
    top, bottom = out.array[:20].reshape(-1, 3).mean(0), out.array[20:].reshape(-1, 3).mean(0)
    assert top[0] > 200 > top[2] and bottom[2] > 200 > bottom[0], "the left (red) half is now on top"
    webp = pf.image(encode(Image.fromarray(arr), "WEBP", lossless=True, exif=exif))
    assert webp.orientation == 6 and webp.size == (20, 40) and webp.array[0, 0, 0] == 255
    off = Preflight(registry=CollectorRegistry(), tracer=False, exif_transpose=False)
    assert off.image(encode(Image.fromarray(arr), "JPEG", exif=exif)).size == (40, 20)


def test_animated_images_take_the_first_frame_by_default(pf: Preflight) -> None:
    out = pf.image(ANIMATED_GIF)
    assert out.animated and out.size == (64, 48)


def test_multi_picture_jpeg_is_not_animation() -> None:
    mpo = encode(PHOTO, "MPO", save_all=True, append_images=[PHOTO.rotate(180)])
    pf = Preflight(registry=CollectorRegistry(), tracer=False, animated="reject")
    out = pf.image(mpo)
    assert out.format == "MPO" and not out.animated


@pytest.mark.parametrize(
    ("width", "height", "scale"), [(2048, 1536, 4), (1784, 1900, 8), (1783, 900, 4), (300, 500, 1), (448, 1000, 2)]
)
def test_jpeg_draft_decodes_at_reduced_scale_keeping_the_needed_side(width: int, height: int, scale: int) -> None:
    big = encode(Image.new("RGB", (width, height), (200, 30, 30)), "JPEG")
    pf = Preflight(registry=CollectorRegistry(), tracer=False, draft_min_side=223)
    out = pf.image(big)
    assert out.declared_size == (width, height) and out.draft_scale == scale
    assert min(out.size) >= 223 and out.size == (-(-width // scale), -(-height // scale))


BAD_TEXTS = {
    "invalid_utf8_bytes": (b"caf\xc3(", "bad_utf8"),
    "lone_surrogate": ("abc\udcff", "bad_utf8"),
    "empty": ("", "empty_input"),
    "whitespace": (" \n\t ", "empty_input"),
    "too_long_str": ("x" * 70_000, "text_too_long"),
    "too_long_bytes": ("é".encode() * 40_000, "text_too_long"),
    "too_many_tokens": (" ".join(["w"] * 9000), "too_many_tokens"),
    "not_text": (12345, "bad_input_type"),
}


@pytest.mark.parametrize("case", sorted(BAD_TEXTS))
def test_each_bad_text_class_is_refused_with_its_code(pf: Preflight, case: str) -> None:
    data, code = BAD_TEXTS[case]
    reject(pf, "text", data, code)


def test_good_texts_pass_and_a_token_counter_replaces_the_heuristic() -> None:
    pf = Preflight(registry=CollectorRegistry(), tracer=False)
    assert pf.text("a photo of a cat") == "a photo of a cat"
    assert pf.text("café 猫 🐈".encode()) == "café 猫 🐈"
    counted = Preflight(
        registry=CollectorRegistry(), tracer=False, max_text_tokens=5, token_counter=lambda s: len(s) // 2
    )
    assert counted.text("abcdefghij") == "abcdefghij"
    reject(counted, "text", "abcdefghijkl", "too_many_tokens")
    lax = Preflight(registry=CollectorRegistry(), tracer=False, require_utf8=False)
    assert lax.text(b"caf\xc3(") == "caf\ufffd("


def test_data_urls(pf: Preflight) -> None:
    url = "data:image/jpeg;base64," + base64.b64encode(JPEG).decode()
    assert pf.image_from_data_url(url).size == (64, 48)
    reject(pf, "image_from_data_url", "https://example.invalid/cat.jpg", "bad_data_url")
    reject(pf, "image_from_data_url", "data:image/png;base64,@@@notbase64@@@", "bad_data_url")
    small = Preflight(registry=CollectorRegistry(), tracer=False, max_encoded_bytes=1000)
    reject(small, "image_from_data_url", "data:image/png;base64," + "A" * 100_000, "payload_too_large")


def test_arrays(pf: Preflight) -> None:
    assert pf.image_array(np.zeros((16, 16), dtype=np.uint8)).shape == (16, 16, 3)
    assert pf.image_array(np.full((16, 16, 3), 0.5, dtype=np.float32))[0, 0, 0] == 128
    bad = np.zeros((16, 16, 3), dtype=np.float32)
    bad[3, 3, 1] = np.nan
    reject(pf, "image_array", bad, "non_finite")
    reject(pf, "image_array", np.zeros((16, 16, 2), dtype=np.uint8), "bad_array")
    reject(pf, "image_array", np.zeros((4, 4, 3), dtype=np.uint8), "image_too_small")


def test_check_combines_image_and_text(pf: Preflight) -> None:
    res = pf.check(image=JPEG, text="what is this?")
    assert res.image is not None and res.text == "what is this?"
    with pytest.raises(PreflightError) as info:
        pf.check()
    assert info.value.code == "empty_input"


def test_contract_from_yaml_and_its_validation(tmp_path: Any) -> None:
    contract = InputContract.from_yaml("formats: [jpg, png]\nmax_pixels: 1000000\nanimated: reject\n")
    assert contract.formats == frozenset({"JPEG", "PNG"}) and contract.max_pixels == 1_000_000
    path = tmp_path / "contract.yaml"
    path.write_text("max_text_tokens: 77\n")
    assert Preflight.from_yaml(path, registry=CollectorRegistry()).contract.max_text_tokens == 77
    for bad in ("max_pixelz: 5\n", "formats: [jpeg, nosuchformat]\n", "modes: [F]\n", "max_pixels: -1\n", "- 1\n"):
        with pytest.raises(ConfigError):
            InputContract.from_yaml(bad)
    with pytest.raises(ConfigError):
        Preflight(max_pixelz=5)
    with pytest.raises(ConfigError):
        InputContract.from_yaml(tmp_path / "missing.yaml")


def test_rejections_and_passes_are_counted_in_metrics() -> None:
    registry = CollectorRegistry()
    pf = Preflight(name="edge", registry=registry, tracer=False)
    pf.image(JPEG)
    with pytest.raises(PreflightError):
        pf.image(b"")
    with pytest.raises(PreflightError):
        pf.text(b"\xff")
    get = registry.get_sample_value
    assert get("mmchaos_preflight_inputs_total", {"name": "edge", "kind": "image", "code": "ok"}) == 1
    assert get("mmchaos_preflight_inputs_total", {"name": "edge", "kind": "image", "code": "empty_input"}) == 1
    assert get("mmchaos_preflight_inputs_total", {"name": "edge", "kind": "text", "code": "bad_utf8"}) == 1
    assert get("mmchaos_preflight_seconds_count", {"name": "edge", "kind": "image"}) == 1


def test_code_table_covers_the_documented_codes() -> None:
    documented = {
        "image_too_large", "image_too_small", "unsupported_format", "unsupported_mode", "bad_image",
        "truncated_image", "decompression_bomb", "element_count_overflow", "bad_utf8", "text_too_long",
        "too_many_tokens", "empty_input",
    }  # fmt: skip
    assert documented <= set(PREFLIGHT_CODES)
    assert set(PREFLIGHT_CODES.values()) == {400, 413, 415, 422}


SEEDS = [JPEG, PNG, ANIMATED_GIF, encode(PHOTO, "WEBP"), encode(PHOTO, "BMP")]
FUZZ = Preflight(registry=CollectorRegistry(), tracer=False, min_side=1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.sampled_from(SEEDS),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=8),
    cut=st.integers(0, 10_000),
)
def test_mutated_images_are_decoded_or_refused_never_crash(seed: bytes, edits: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(seed)
    for pos, value in edits:
        data[pos % len(data)] = value
    data = data[: max(1, len(data) - cut)] if cut < len(data) else data
    try:
        out = FUZZ.image(bytes(data))
    except PreflightError as err:
        assert err.code in PREFLIGHT_CODES
    else:
        assert out.array.ndim == 3 and out.array.shape[2] == 3 and out.array.dtype == np.uint8


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300)))
def test_any_bytes_or_text_is_checked_without_crashing(data: bytes | str) -> None:
    for fn in (FUZZ.text, FUZZ.image) if isinstance(data, bytes) else (FUZZ.text,):
        try:
            fn(data)  # type: ignore[operator]
        except PreflightError as err:
            assert err.code in PREFLIGHT_CODES


# -- one declared-size rule set: Preflight and the targets agree (issue 9) ------------------------


@pytest.mark.parametrize(
    ("width", "height", "color_type", "code"),
    [
        (50_000, 50_000, 2, "element_count_overflow"),  # RGB: 7.5e9 elements, past int32
        (46_341, 46_341, 0, "element_count_overflow"),  # grey, decoded to RGB: past int32
        (20_000, 20_000, 2, "image_too_large"),  # fits int32, over the pixel limit
        (100_000, 100, 2, "image_too_large"),  # over the side limit
    ],
)
def test_preflight_and_targets_refuse_the_same_declared_size_with_the_same_code(
    width: int, height: int, color_type: int, code: str
) -> None:
    from mmchaos.errors import TargetCallError
    from mmchaos.guard.limits import SIZE_CODES
    from mmchaos.targets.decode import check_image_array, decode_image_bytes

    limits = {"max_pixels": 89_478_485, "max_side": 65_535, "max_aspect_ratio": None}
    pf = Preflight(registry=CollectorRegistry(), tracer=False, **limits)
    blob = png_declaring(width, height, color_type)
    err = reject(pf, "image", blob, code)
    assert err.http_status == SIZE_CODES[code]
    with pytest.raises(TargetCallError) as target_err:
        decode_image_bytes(blob, max_pixels=89_478_485, max_side=65_535)
    assert target_err.value.code == code
    # The same declared size as an array (a zero-stride view: nothing is allocated).
    view = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), (height, width, 3), (0, 0, 0))
    with pytest.raises(TargetCallError) as array_err:
        check_image_array(view, max_pixels=89_478_485, max_side=65_535)
    if color_type == 2:  # an RGB header and an RGB array declare the same elements
        assert array_err.value.code == code


def test_preflight_size_codes_come_from_the_one_rule_set() -> None:
    from mmchaos.guard.limits import SIZE_CODES

    for code, status in SIZE_CODES.items():
        assert PREFLIGHT_CODES[code] == status, code
