"""Preflight: a declarative input contract, checked from the header before any pixel is decoded.

An image is identified only by the decoders of the allowed formats, its declared size and mode are
checked (element counts in Python ints, so nothing overflows) before Pillow allocates anything,
then it is decoded once (JPEGs at a reduced DCT scale when ``draft_min_side`` allows), EXIF
orientation is applied, alpha is composited onto a background, and an ``(H, W, 3)`` uint8 RGB
array comes back. Texts are checked for UTF-8, bytes and tokens. Every rejection is a
:class:`PreflightError` with a stable ``code`` and the HTTP status a server should answer.
"""

from __future__ import annotations

import base64
import binascii
import io
import struct
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageFile
from prometheus_client import CollectorRegistry, Counter, Histogram
from pydantic import BaseModel, ConfigDict, Field, field_validator

from mmchaos.error_codes import statuses
from mmchaos.errors import MMChaosError
from mmchaos.guard import _telemetry
from mmchaos.guard._config import build_config, load_yaml_config
from mmchaos.guard.limits import INT32_MAX, SIZE_CODES, SizeLimits, check_declared_size, working_channels

__all__ = [
    "PREFLIGHT_CODES",
    "CheckedImage",
    "InputContract",
    "InputTooLargeError",
    "MalformedInputError",
    "Preflight",
    "PreflightError",
    "PreflightResult",
    "UnprocessableInputError",
    "UnsupportedInputError",
    "estimate_tokens",
]

ImageArray = npt.NDArray[np.uint8]
A = TypeVar("A")
R = TypeVar("R")

#: Every rejection code and the HTTP status a server answers with it (from :mod:`mmchaos.error_codes`,
#: which also picks the error class below). The declared-size codes
#: (``element_count_overflow``, ``image_too_large``, ``image_too_small``, ``bad_aspect_ratio``)
#: come from :mod:`mmchaos.guard.limits`, the rule set the targets' decoders use too.
PREFLIGHT_CODES: Mapping[str, int] = {
    **SIZE_CODES,
    **statuses(
        "empty_input",
        "bad_input_type",
        "bad_image",
        "truncated_image",
        "bad_utf8",
        "bad_data_url",
        "bad_array",
        "payload_too_large",
        "decompression_bomb",
        "text_too_long",
        "too_many_tokens",
        "unsupported_format",
        "unsupported_mode",
        "animated_image",
        "non_finite",
    ),
}


class PreflightError(MMChaosError):
    """An input broke the contract; ``code`` is stable and ``http_status`` (the code's, from the
    table) is what to answer."""

    code = "preflight_rejected"

    def __init__(self, message: str, *, code: str | None = None, detail: Mapping[str, Any] | None = None) -> None:
        super().__init__(message, code=code)
        self.detail: dict[str, Any] = dict(detail or {})

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready body: code, message, HTTP status and the numbers behind the rejection."""
        return {"code": self.code, "message": self.message, "status": self.http_status, "detail": self.detail}


class MalformedInputError(PreflightError):
    """The input is not what it claims to be (corrupt, truncated, invalid UTF-8): HTTP 400."""

    code = "malformed_input"


class InputTooLargeError(PreflightError):
    """The input exceeds a size, pixel, element or token limit: HTTP 413."""

    code = "input_too_large"


class UnsupportedInputError(PreflightError):
    """A well-formed input of a format or mode the contract does not accept: HTTP 415."""

    code = "unsupported_input"


class UnprocessableInputError(PreflightError):
    """Well-formed and supported, but not processable (too small, animated, NaN): HTTP 422."""

    code = "unprocessable_input"


_ERROR_BY_STATUS: dict[int, type[PreflightError]] = {
    400: MalformedInputError,
    413: InputTooLargeError,
    415: UnsupportedInputError,
    422: UnprocessableInputError,
}


def _reject(code: str, message: str, **detail: Any) -> PreflightError:
    return _ERROR_BY_STATUS[PREFLIGHT_CODES[code]](message, code=code, detail=detail)


# Modes we know how to turn into RGB correctly; "I" is read as 16-bit data (PNG's old mapping).
_CONVERTIBLE_MODES = frozenset(
    {
        "1",
        "L",
        "LA",
        "La",
        "P",
        "PA",
        "RGB",
        "RGBA",
        "RGBa",
        "RGBX",
        "CMYK",
        "YCbCr",
        "I",
        "I;16",
        "I;16L",
        "I;16B",
        "I;16N",
    }
)
_ALPHA_MODES = frozenset({"LA", "La", "PA", "RGBA", "RGBa"})
_DEFAULT_MODES = frozenset(
    {"1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr", "I;16", "I;16L", "I;16B", "I;16N"}
)
_FORMAT_ALIASES = {"JPG": "JPEG", "TIF": "TIFF"}
_JPEG_FAMILY = frozenset({"JPEG", "MPO"})
# Formats whose EXIF and XMP Pillow puts in ``info`` when it opens them (no decode needed to know).
_INFO_EXIF_FORMATS = frozenset({"JPEG", "MPO", "WEBP"})
_ORIENTATION_KEYS = ("exif", "xmp", "XML:com.adobe.xmp")
# EXIF orientation -> the transpose that undoes it.
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
# How Pillow's decoders say that the data stopped early (they raise OSError or SyntaxError).
_TRUNCATION_HINTS = ("truncated", "premature end", "requires a buffer", "not enough data")


class InputContract(BaseModel):
    """What the serving code accepts. Sizes are in pixels, bytes and tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # images, checked from the header
    max_encoded_bytes: int = Field(20 * 2**20, ge=1)
    max_pixels: int = Field(25_000_000, ge=1)
    max_side: int = Field(16_384, ge=1)
    min_side: int = Field(8, ge=1)
    max_aspect_ratio: float | None = Field(200.0, ge=1.0)
    #: Largest element count (width x height x channels, in the widest intermediate) allowed;
    #: the default keeps every index into the decoded array within int32.
    max_elements: int = Field(INT32_MAX, ge=1)
    formats: frozenset[str] = frozenset({"JPEG", "PNG", "WEBP", "GIF", "BMP"})
    modes: frozenset[str] = _DEFAULT_MODES
    #: Decoded bytes per encoded byte above which a large image is a bomb. PNG's deflate cannot
    #: exceed ~1032:1, so no honest PNG trips the default; checked above ``bomb_min_decoded_bytes``.
    max_decompression_ratio: float | None = Field(1100.0, gt=1.0)
    bomb_min_decoded_bytes: int = Field(16 * 2**20, ge=0)
    animated: Literal["first_frame", "reject"] = "first_frame"
    exif_transpose: bool = True
    alpha_background: tuple[int, int, int] = (255, 255, 255)
    #: When set, JPEGs are decoded by libjpeg at the coarsest 1/2, 1/4 or 1/8 scale whose shorter
    #: side stays >= this many pixels (the model resizes anyway; this makes decoding 2-10x faster).
    draft_min_side: int | None = Field(None, ge=1)

    # texts
    max_text_bytes: int = Field(65_536, ge=1)
    max_text_tokens: int | None = Field(8192, ge=1)
    require_utf8: bool = True
    allow_empty_text: bool = False

    @field_validator("formats", mode="before")
    @classmethod
    def _canonical_formats(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple, set, frozenset)):
            return value
        Image.init()
        out = set()
        for item in value:
            name = _FORMAT_ALIASES.get(str(item).upper(), str(item).upper())
            if name not in Image.OPEN:
                known = ", ".join(sorted(Image.OPEN))
                raise ValueError(f"unknown image format {item!r} (Pillow reads: {known})")
            out.add(name)
        if not out:
            raise ValueError("at least one image format must be allowed")
        return frozenset(out)

    @field_validator("modes", mode="after")
    @classmethod
    def _convertible_modes(cls, value: frozenset[str]) -> frozenset[str]:
        unknown = sorted(value - _CONVERTIBLE_MODES)
        if unknown:
            raise ValueError(f"cannot convert modes {unknown} to RGB (supported: {sorted(_CONVERTIBLE_MODES)})")
        if not value:
            raise ValueError("at least one image mode must be allowed")
        return value

    @field_validator("alpha_background")
    @classmethod
    def _rgb(cls, value: tuple[int, int, int]) -> tuple[int, int, int]:
        if not all(0 <= c <= 255 for c in value):
            raise ValueError("alpha_background channels must be within 0..255")
        return value

    @classmethod
    def from_yaml(cls, source: str | Path) -> InputContract:
        """Load a contract from a YAML file (or YAML text); unknown keys are an error."""
        return load_yaml_config(cls, source, "input contract")


@dataclass(frozen=True, slots=True)
class CheckedImage:
    """A decoded image that passed the contract. ``array`` is read-only ``(H, W, 3)`` uint8 RGB."""

    array: ImageArray
    format: str
    mode: str
    #: Width and height declared in the file, before draft scaling and EXIF rotation.
    declared_size: tuple[int, int]
    encoded_bytes: int
    orientation: int = 1
    animated: bool = False
    draft_scale: int = 1

    @property
    def size(self) -> tuple[int, int]:
        """Width and height of ``array``."""
        return int(self.array.shape[1]), int(self.array.shape[0])


@dataclass(frozen=True, slots=True)
class PreflightResult:
    image: CheckedImage | None = None
    text: str | None = None


def _accepts(accept: Callable[[bytes], bool | str] | None, prefix: bytes) -> bool:
    """Whether a Pillow plugin claims ``prefix``; a plugin that chokes on it does not."""
    if accept is None:
        return True
    try:
        verdict = accept(prefix)
    except Exception:  # short prefixes make some plugins' struct reads fail
        return False
    return bool(verdict) and not isinstance(verdict, str)


def estimate_tokens(text: str) -> int:
    """A tokenizer-free upper-ish estimate: words, or UTF-8 bytes / 4, whichever is larger."""
    return max(len(text.split()), (len(text.encode("utf-8", "surrogatepass")) + 3) // 4)


class Preflight:
    """Validate and decode request inputs against an :class:`InputContract`.

    ``Preflight(max_pixels=4_000_000)`` lays keyword limits over the default contract;
    ``token_counter`` (e.g. ``lambda s: len(tokenizer(s).input_ids)``) replaces the heuristic.
    """

    def __init__(
        self,
        contract: InputContract | None = None,
        *,
        name: str = "preflight",
        token_counter: Callable[[str], int] | None = None,
        registry: CollectorRegistry | None = None,
        tracer: object = None,
        **limits: Any,
    ) -> None:
        self.contract = build_config(InputContract, contract, limits, "input contract")
        c = self.contract
        self._size_limits = SizeLimits(
            max_elements=c.max_elements,
            max_pixels=c.max_pixels,
            max_side=c.max_side,
            min_side=c.min_side,
            max_aspect_ratio=c.max_aspect_ratio,
        )
        self.name = name
        self.token_counter = token_counter
        self.registry = _telemetry.resolve_registry(registry)
        self._tracer = _telemetry.resolve_tracer(tracer)
        Image.init()
        self._open_order = tuple(f for f in Image.ID if f in self.contract.formats)
        self._inputs = _telemetry.family(
            self.registry,
            Counter,
            "mmchaos_preflight_inputs",
            "Inputs checked by Preflight, by outcome code.",
            ("name", "kind", "code"),
        )
        self._seconds = _telemetry.family(
            self.registry,
            Histogram,
            "mmchaos_preflight_seconds",
            "Time to check (and decode) one input.",
            ("name", "kind"),
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
        )
        self._ok = {k: self._inputs.labels(name, k, "ok") for k in ("image", "text")}
        self._time = {k: self._seconds.labels(name, k) for k in ("image", "text")}

    @classmethod
    def from_yaml(cls, source: str | Path, **kwargs: Any) -> Preflight:
        return cls(InputContract.from_yaml(source), **kwargs)

    # -- public checks ---------------------------------------------------------------------------

    def check(
        self, *, image: bytes | bytearray | memoryview | None = None, text: str | bytes | None = None
    ) -> PreflightResult:
        """Check an image and/or a text; at least one must be given."""
        if image is None and text is None:
            raise _reject("empty_input", "the request has neither an image nor a text")
        return PreflightResult(
            image=None if image is None else self.image(image),
            text=None if text is None else self.text(text),
        )

    def image(self, data: bytes | bytearray | memoryview) -> CheckedImage:
        """Decode an encoded image (JPEG, PNG, ...) into RGB after checking its header."""
        return self._observed("image", self._image, data)

    def image_from_data_url(self, url: str) -> CheckedImage:
        """Decode a ``data:image/...;base64,...`` URL, refusing oversized payloads before decoding."""
        return self._observed("image", self._image_from_data_url, url)

    def text(self, data: str | bytes) -> str:
        """Check a text (``str``, or ``bytes`` that must be UTF-8) and return it as ``str``."""
        return self._observed("text", self._text, data)

    def image_array(self, array: Any) -> ImageArray:
        """Check an already-decoded array (H, W), (H, W, 1|3|4); uint8 or float in [0, 1]."""
        return self._observed("image", self._array, array)

    def data_url_bytes(self, url: str) -> bytes:
        """The bytes of a ``data:`` URL; its size is checked before the base64 is decoded."""
        if not isinstance(url, str):
            raise _reject("bad_input_type", f"a data URL must be a string, got {type(url).__name__}")
        head, sep, payload = url.partition(",")
        if not sep or head[:5].lower() != "data:":
            raise _reject("bad_data_url", "not a data: URL (expected data:<type>;base64,<data>)")
        is_base64 = head.lower().endswith(";base64")
        limit = self.contract.max_encoded_bytes
        estimate = len(payload) * 3 // 4 if is_base64 else len(payload) // 3
        if estimate > limit:
            raise _reject(
                "payload_too_large",
                f"the data URL carries about {estimate} bytes; the limit is {limit}",
                bytes=estimate,
                limit=limit,
            )
        try:
            raw = base64.b64decode(payload, validate=True) if is_base64 else urllib.parse.unquote_to_bytes(payload)
        except (binascii.Error, ValueError) as exc:
            raise _reject("bad_data_url", f"the data URL's base64 payload is invalid: {exc}") from exc
        if not raw:
            raise _reject("empty_input", "the data URL is empty")
        return raw

    # -- internals -------------------------------------------------------------------------------

    def _observed(self, kind: str, fn: Callable[[A], R], data: A) -> R:
        start = time.perf_counter()
        if self._tracer is not None and _telemetry.recording():  # spans only inside a traced request
            with _telemetry.span(self._tracer, f"mmchaos.preflight.{kind}", {"mmchaos.guard": self.name}) as sp:
                return self._counted(kind, fn, data, start, sp)
        return self._counted(kind, fn, data, start, None)

    def _counted(self, kind: str, fn: Callable[[A], R], data: A, start: float, sp: Any) -> R:
        try:
            out = fn(data)
        except PreflightError as err:
            self._inputs.labels(self.name, kind, err.code).inc()
            if sp is not None:
                sp.set_attribute("mmchaos.preflight.code", err.code)
            raise
        self._ok[kind].inc()
        self._time[kind].observe(time.perf_counter() - start)
        return out

    def _image_from_data_url(self, url: str) -> CheckedImage:
        return self._image(self.data_url_bytes(url))

    def _image(self, data: bytes | bytearray | memoryview) -> CheckedImage:
        c = self.contract
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise _reject("bad_input_type", f"an image must be bytes, got {type(data).__name__}")
        size = len(data) if not isinstance(data, memoryview) else data.nbytes
        if size == 0:
            raise _reject("empty_input", "the image is empty")
        if size > c.max_encoded_bytes:
            raise _reject(
                "payload_too_large",
                f"the image is {size} bytes; the limit is {c.max_encoded_bytes}",
                bytes=size,
                limit=c.max_encoded_bytes,
            )
        im = self._open(data)
        fmt = im.format or "?"
        width, height = im.size
        mode = im.mode
        self._check_header(width, height, mode, fmt, size)
        animated = False
        if fmt != "MPO":  # an MPO's extra frames are previews or depth maps, not animation
            try:
                animated = bool(getattr(im, "is_animated", False))
            except Image.DecompressionBombError as exc:
                raise _reject("decompression_bomb", f"a later frame is too large: {exc}") from exc
            except Exception as exc:
                if c.animated == "reject":
                    raise _reject("bad_image", f"cannot read the frames of this {fmt}: {exc}") from exc
            if animated and c.animated == "reject":
                raise _reject("animated_image", f"animated {fmt} images are not accepted", format=fmt)
        scale = 1
        if c.draft_min_side is not None and fmt in _JPEG_FAMILY and min(width, height) >= 2 * c.draft_min_side:
            # libjpeg picks the scale from the side that needs most; only the shorter side matters.
            side = c.draft_min_side
            drafted = im.draft(mode, (side, 1) if width <= height else (1, side))
            if drafted is not None:
                scale = round(width / im.size[0])
        try:
            im.load()
        except Image.DecompressionBombError as exc:
            raise _reject("decompression_bomb", str(exc)) from exc
        except Exception as exc:  # Pillow's decoders raise many types on corrupt data
            raise self._decode_error(exc, fmt) from exc
        orientation = self._orientation(im) if c.exif_transpose else 1
        upright: Image.Image = im.transpose(_TRANSPOSE[orientation]) if orientation in _TRANSPOSE else im
        array = self._to_rgb(upright)
        return CheckedImage(
            array=array,
            format=fmt,
            mode=mode,
            declared_size=(width, height),
            encoded_bytes=size,
            orientation=orientation,
            animated=animated,
            draft_scale=scale,
        )

    def _open(self, data: bytes | bytearray | memoryview) -> ImageFile.ImageFile:
        """Identify with the allowed formats' decoders only; never Pillow's global bomb limit."""
        prefix = bytes(data[:16])
        fp = io.BytesIO(data)
        first_error: Exception | None = None
        for fmt in self._open_order:
            factory, accept = Image.OPEN[fmt]
            if not _accepts(accept, prefix):
                continue
            fp.seek(0)
            try:
                return factory(fp, "")
            except Image.DecompressionBombError as exc:
                raise _reject("decompression_bomb", str(exc)) from exc
            except Exception as exc:  # a header parser's SyntaxError, struct.error, EOFError, ...
                first_error = first_error or exc
        if first_error is not None:
            raise self._decode_error(first_error, "image")
        for fmt, (_, accept) in Image.OPEN.items():
            if accept is not None and fmt not in self.contract.formats and _accepts(accept, prefix):
                allowed = sorted(self.contract.formats)
                raise _reject(
                    "unsupported_format",
                    f"{fmt} images are not accepted (allowed: {allowed})",
                    format=fmt,
                    allowed=allowed,
                )
        raise _reject("bad_image", "the data is not a recognised image")

    def _check_size(self, width: int, height: int, channels: int) -> None:
        """Refuse from the declared size alone, before any pixel buffer exists (the shared rules)."""
        problem = check_declared_size((height, width, channels), self._size_limits)
        if problem is not None:
            raise _reject(problem.code, problem.message, **problem.detail)

    def _check_header(self, width: int, height: int, mode: str, fmt: str, encoded: int) -> None:
        c = self.contract
        bands = Image.getmodebands(mode) if mode in _CONVERTIBLE_MODES else 4
        self._check_size(width, height, working_channels(mode))
        if mode not in c.modes:
            raise _reject(
                "unsupported_mode",
                f"{fmt} mode {mode} is not accepted (allowed: {sorted(c.modes)})",
                mode=mode,
                allowed=sorted(c.modes),
            )
        decoded = int(width) * int(height) * bands
        if (
            c.max_decompression_ratio is not None
            and decoded >= c.bomb_min_decoded_bytes
            and decoded > c.max_decompression_ratio * encoded
        ):
            raise _reject(
                "decompression_bomb",
                f"{encoded} bytes declare {decoded} decoded bytes (ratio over {c.max_decompression_ratio})",
                encoded_bytes=encoded,
                decoded_bytes=decoded,
            )

    @staticmethod
    def _decode_error(exc: Exception, fmt: str) -> PreflightError:
        text = str(exc)
        lowered = text.lower()
        if isinstance(exc, (EOFError, struct.error)) or any(hint in lowered for hint in _TRUNCATION_HINTS):
            return _reject("truncated_image", f"the {fmt} data ends early: {text}", format=fmt)
        return _reject("bad_image", f"cannot decode the {fmt} data: {text or type(exc).__name__}", format=fmt)

    @staticmethod
    def _orientation(im: Image.Image) -> int:
        info = im.info
        if im.format in _INFO_EXIF_FORMATS and not any(key in info for key in _ORIENTATION_KEYS):
            return 1  # these formats keep EXIF and XMP in info: nothing to parse
        try:
            value = im.getexif().get(0x0112, 1)
            return int(value) if isinstance(value, int) else 1
        except Exception:  # broken EXIF is common in real photos; it must not reject the image
            return 1

    def _to_rgb(self, im: Image.Image) -> ImageArray:
        mode = im.mode
        if mode == "RGB":
            return np.asarray(im)
        if mode.startswith("I"):  # 16-bit grey (and "I" read as 16-bit): keep the top 8 bits
            wide = np.asarray(im)
            grey = (np.clip(wide, 0, 65535) >> 8).astype(np.uint8) if mode == "I" else (wide >> 8).astype(np.uint8)
            out = np.repeat(grey[:, :, None], 3, axis=2)
            out.flags.writeable = False
            return out
        if mode in _ALPHA_MODES or "transparency" in im.info:
            rgba = im.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (*self.contract.alpha_background, 255))
            return np.asarray(Image.alpha_composite(background, rgba).convert("RGB"))
        return np.asarray(im.convert("RGB"))

    def _text(self, data: str | bytes) -> str:
        c = self.contract
        if isinstance(data, str):
            if len(data) > c.max_text_bytes:  # every character is at least one byte
                raise _reject("text_too_long", f"the text has over {c.max_text_bytes} bytes", limit=c.max_text_bytes)
            try:
                n_bytes = len(data.encode("utf-8"))
                text = data
            except UnicodeEncodeError as exc:
                if c.require_utf8:
                    raise _reject(
                        "bad_utf8", f"the text is not valid Unicode at character {exc.start}", position=exc.start
                    ) from exc
                text = data.encode("utf-8", "replace").decode("utf-8")
                n_bytes = len(text.encode("utf-8"))
        elif isinstance(data, (bytes, bytearray, memoryview)):
            raw = bytes(data)
            n_bytes = len(raw)
            if n_bytes > c.max_text_bytes:
                raise _reject(
                    "text_too_long",
                    f"the text is {n_bytes} bytes; the limit is {c.max_text_bytes}",
                    bytes=n_bytes,
                    limit=c.max_text_bytes,
                )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                if c.require_utf8:
                    raise _reject(
                        "bad_utf8", f"the text is not valid UTF-8 at byte {exc.start}", position=exc.start
                    ) from exc
                text = raw.decode("utf-8", "replace")
        else:
            raise _reject("bad_input_type", f"a text must be str or bytes, got {type(data).__name__}")
        if n_bytes > c.max_text_bytes:
            raise _reject(
                "text_too_long",
                f"the text is {n_bytes} bytes; the limit is {c.max_text_bytes}",
                bytes=n_bytes,
                limit=c.max_text_bytes,
            )
        if not c.allow_empty_text and (not text or text.isspace()):
            raise _reject("empty_input", "the text is empty")
        if c.max_text_tokens is not None:
            if self.token_counter is None:
                tokens = max(len(text.split()), (n_bytes + 3) // 4)
            else:
                tokens = int(self.token_counter(text))
            if tokens > c.max_text_tokens:
                raise _reject(
                    "too_many_tokens",
                    f"the text has {tokens} tokens; the limit is {c.max_text_tokens}",
                    tokens=tokens,
                    limit=c.max_text_tokens,
                )
        return text

    def _array(self, array: Any) -> ImageArray:
        c = self.contract
        if not isinstance(array, np.ndarray):
            raise _reject("bad_input_type", f"an image array must be a numpy array, got {type(array).__name__}")
        if array.size == 0:
            raise _reject("empty_input", "the image array is empty")
        if array.ndim == 3 and array.shape[2] == 1:
            array = array[:, :, 0]
        if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (3, 4)):
            raise _reject(
                "bad_array",
                f"expected (H, W) or (H, W, 1|3|4), got shape {tuple(array.shape)}",
                shape=list(array.shape),
            )
        height, width = int(array.shape[0]), int(array.shape[1])
        bands = 1 if array.ndim == 2 else int(array.shape[2])
        self._check_size(width, height, max(bands, 3))
        u8: ImageArray
        if array.dtype == np.uint8:
            u8 = array
        elif array.dtype.kind == "f":
            if not np.isfinite(array).all():
                raise _reject("non_finite", "the image array has NaN or infinite values")
            if array.min() < 0.0 or array.max() > 1.0:
                raise _reject("bad_array", "float image arrays must lie within [0, 1]")
            u8 = np.rint(array * 255.0).astype(np.uint8)
        else:
            raise _reject(
                "bad_array", f"image arrays must be uint8 or float, got {array.dtype}", dtype=str(array.dtype)
            )
        out: ImageArray
        if bands == 3:
            out = np.ascontiguousarray(u8)
            return out
        if bands == 1:
            out = np.repeat(u8[:, :, None], 3, axis=2)
            return out
        alpha = u8[:, :, 3:4].astype(np.uint16)
        background = np.asarray(c.alpha_background, dtype=np.uint16)
        blended = (u8[:, :, :3].astype(np.uint16) * alpha + background * (255 - alpha) + 127) // 255
        out = blended.astype(np.uint8)
        return out
