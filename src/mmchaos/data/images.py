"""The one EXIF-aware image loader: encoded bytes or a file -> an upright RGB uint8 array.

What a careful reader does with an image it did not make, in order: refuse empty input, read
only the header, refuse declared sizes over the limits (:mod:`mmchaos.guard.limits`, 64-bit
arithmetic, before any pixel is decoded), decode the first frame, apply the EXIF orientation,
and convert every mode that occurs in the wild to 8-bit RGB without silently clipping 16-bit
data. Targets (``decode_image``), datasets and ``mmchaos perturb`` all read images here; every
refusal is an :class:`ImageLoadError` with a stable code, which each caller may re-type.

Pillow's own decompression-bomb check (a process-wide threshold, raised inside ``Image.open``)
is bypassed on purpose: the declared-size rules decide, so the same file gets the same code here
and in :class:`~mmchaos.guard.Preflight`.
"""

from __future__ import annotations

import io
import logging
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from mmchaos.errors import DataError
from mmchaos.guard.limits import PILLOW_MAX_IMAGE_PIXELS, SizeLimits, check_declared_size, working_channels

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["ImageLoadError", "ImageSource", "load_image", "open_upright", "probe_image", "to_rgb"]

log = logging.getLogger(__name__)

ImageArray = npt.NDArray[np.uint8]
ImageSource = bytes | bytearray | memoryview | str | os.PathLike[str]

_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
_SIXTEEN_BIT = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})
# What Pillow's header parsers raise for "not my format": try the next plugin (as Image.open does).
_NOT_THIS_FORMAT = (SyntaxError, IndexError, TypeError, struct.error)


class ImageLoadError(DataError):
    """An image that cannot be loaded; ``code`` says why (``truncated_image``, ``image_too_large``...)."""

    code = "image_undecodable"


def _identify(fp: IO[bytes], name: str) -> Image.Image:
    """Open the header with the first plugin that accepts it, without Pillow's global bomb check."""
    from PIL import Image, UnidentifiedImageError

    Image.init()
    prefix = fp.read(16)
    for fmt in Image.ID:
        factory, accept = Image.OPEN[fmt]
        try:
            verdict = accept(prefix) if accept is not None else True
        except Exception:  # a short prefix makes some plugins' struct reads fail
            continue
        if not verdict or isinstance(verdict, str):
            continue
        fp.seek(0)
        try:
            return factory(fp, name)
        except _NOT_THIS_FORMAT:
            continue
    raise UnidentifiedImageError(f"cannot identify image file {name or '<bytes>'}")


def _truncated(exc: BaseException) -> bool:
    """Whether Pillow's error says the data stopped early."""
    return isinstance(exc, EOFError | struct.error) or "truncated" in str(exc).lower()


def _limits(max_pixels: int | None, max_side: int | None) -> SizeLimits:
    return SizeLimits(max_pixels=max_pixels, max_side=max_side)


def _checked_header(fp: IO[bytes], name: str, max_pixels: int | None, max_side: int | None) -> Image.Image:
    """The opened (not decoded) image, refused first by its declared size."""
    from PIL import Image, UnidentifiedImageError

    try:
        img = _identify(fp, name)
    except Image.DecompressionBombError as exc:  # a GIF frame larger than the screen its header declares
        raise ImageLoadError(f"image refused before decoding: {exc}", code="image_too_large") from exc
    except UnidentifiedImageError as exc:
        fp.seek(0)
        head = fp.read(8)
        raise ImageLoadError(f"not an image in a known format (starts {head!r})", code="image_undecodable") from exc
    except (OSError, ValueError, EOFError) as exc:
        code = "truncated_image" if _truncated(exc) else "image_undecodable"
        raise ImageLoadError(f"corrupt image header: {exc}", code=code) from exc
    width, height = img.size
    problem = check_declared_size((height, width, working_channels(img.mode)), _limits(max_pixels, max_side))
    if problem is not None:
        img.close()
        raise ImageLoadError(f"image refused before decoding: {problem.message}", code=problem.code)
    return img


@contextmanager
def open_upright(
    source: ImageSource, *, max_pixels: int | None = PILLOW_MAX_IMAGE_PIXELS, max_side: int | None = None
) -> Iterator[Image.Image]:
    """A decoded Pillow image, EXIF orientation applied, refused first by its declared size.

    Callers that need another layout than RGB (``mmchaos perturb`` keeps grey and RGBA) convert
    the image themselves; everyone else calls :func:`load_image`.
    """
    from PIL import Image, ImageOps

    fp, name = _source(source)
    try:
        with _checked_header(fp, name, max_pixels, max_side) as img:
            try:
                img.load()
            except Image.DecompressionBombError as exc:  # a frame larger than the header declared (GIF)
                raise ImageLoadError(f"image refused while decoding: {exc}", code="image_too_large") from exc
            except (OSError, SyntaxError, ValueError, EOFError, struct.error) as exc:
                raise ImageLoadError(
                    f"cannot decode the {img.format} image: {exc}",
                    code="truncated_image" if _truncated(exc) else "image_undecodable",
                ) from exc
            try:
                upright = ImageOps.exif_transpose(img) or img
            except Exception as exc:  # a corrupt EXIF block must not reject an otherwise good picture
                log.warning("ignoring unreadable EXIF orientation: %s", exc)
                upright = img
            yield upright
    finally:
        fp.close()


def probe_image(
    source: ImageSource, *, max_pixels: int | None = PILLOW_MAX_IMAGE_PIXELS, max_side: int | None = None
) -> tuple[int, int]:
    """Width and height of a loadable image, checked cheaply: header, declared size, structure.

    No pixel is decoded (datasets check every row this way when they are opened).
    """
    fp, name = _source(source)
    try:
        with _checked_header(fp, name, max_pixels, max_side) as img:
            size = img.size
            try:
                img.verify()
            except Exception as exc:  # Pillow's verify raises what the format's parser raises
                raise ImageLoadError(
                    f"damaged {img.format} data: {exc}",
                    code="truncated_image" if _truncated(exc) else "image_undecodable",
                ) from exc
            return int(size[0]), int(size[1])
    finally:
        fp.close()


def _source(source: ImageSource) -> tuple[IO[bytes], str]:
    """A readable binary stream and a name for messages ('' for bytes)."""
    if isinstance(source, bytes | bytearray | memoryview):
        blob = bytes(source)
        if not blob:
            raise ImageLoadError("empty image payload (0 bytes)", code="image_empty")
        return io.BytesIO(blob), ""
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        try:
            fp = path.open("rb")
        except FileNotFoundError as exc:
            raise ImageLoadError(f"image file not found: {path}", code="data_missing_file") from exc
        except OSError as exc:
            raise ImageLoadError(f"cannot read image {path}: {exc}", code="image_undecodable") from exc
        if path.stat().st_size == 0:
            fp.close()
            raise ImageLoadError(f"empty image file: {path}", code="image_empty")
        return fp, str(path)
    raise ImageLoadError(f"expected encoded image bytes or a path, got {type(source).__name__}", code="image_not_bytes")


def _rgb3(gray: ImageArray) -> ImageArray:
    return np.ascontiguousarray(np.repeat(gray[:, :, None], 3, axis=2))


def to_rgb(img: Any) -> ImageArray:
    """A decoded Pillow image as ``(H, W, 3)`` RGB uint8; transparency is composited on white.

    16-bit grey (``I;16*``, and ``I``, which Pillow uses for 16-bit data) keeps its high byte
    instead of being clipped to white, which is what ``Image.convert("RGB")`` would do.
    Float images (``F``) have no agreed range and are refused.
    """
    from PIL import Image

    mode = img.mode
    if mode in _SIXTEEN_BIT:
        arr16 = np.asarray(img).astype(np.uint32)
        return _rgb3((arr16 >> 8).astype(np.uint8))
    if mode == "I":
        arr32 = np.clip(np.asarray(img).astype(np.int64), 0, 65535)
        return _rgb3((arr32 >> 8).astype(np.uint8))
    if mode == "F":
        raise ImageLoadError(
            "float (mode F) images have no agreed value range; convert to 8 or 16 bits first",
            code="image_unsupported_mode",
        )
    try:
        if mode in _ALPHA_MODES or "transparency" in img.info:
            rgba = img.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return np.asarray(Image.alpha_composite(white, rgba).convert("RGB"), dtype=np.uint8)
        return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (ValueError, OSError) as exc:
        raise ImageLoadError(f"cannot convert a {mode} image to RGB: {exc}", code="image_unsupported_mode") from exc


def load_image(
    source: ImageSource, *, max_pixels: int | None = PILLOW_MAX_IMAGE_PIXELS, max_side: int | None = None
) -> ImageArray:
    """Encoded bytes or an image file as an upright ``(H, W, 3)`` RGB uint8 array, or raise typed."""
    with open_upright(source, max_pixels=max_pixels, max_side=max_side) as img:
        return to_rgb(img)
