"""Shared image operations for the kernels: OpenCV equivalents of the reference helpers.

ImageNet-C's reference code (``imagecorruptions``) builds on scikit-image and SciPy filters; these
are the same operations through OpenCV, with the border modes and kernel radii chosen to match
(scikit-image ``gaussian``: ``mode='nearest'``, radius ``int(truncate * sigma + 0.5)``; SciPy
``zoom`` and ``map_coordinates``: corner-aligned linear interpolation, ``reflect`` = OpenCV's
``BORDER_REFLECT``).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
CV: Any = cv2
"""OpenCV without its stubs, for calls with scalar operands (which the stubs do not type)."""
F64 = npt.NDArray[np.float64]
U8 = npt.NDArray[np.uint8]


def gaussian_ksize(sigma: float, truncate: float = 4.0) -> int:
    return 2 * int(truncate * sigma + 0.5) + 1


@lru_cache(maxsize=64)
def gaussian_kernel(sigma: float, truncate: float = 4.0) -> F32:
    """SciPy's Gaussian taps (radius ``int(truncate * sigma + 0.5)``), normalised.

    Outer taps that together weigh under 1/1000 are dropped (and the rest renormalised): on a
    0-255 image they move no pixel by more than a quarter of a level, and the filter gets faster.
    """
    radius = int(truncate * sigma + 0.5)
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    taps = np.exp(-0.5 * (x / sigma) ** 2)
    taps /= taps.sum()
    dropped, trim = 0.0, 0
    while radius - trim > 1 and dropped + 2 * taps[trim] < 1e-3:
        dropped += 2 * taps[trim]
        trim += 1
    taps = taps[trim : len(taps) - trim]
    taps /= taps.sum()
    return taps.astype(np.float32).reshape(-1, 1)


def gaussian(img: Any, sigma: float, truncate: float = 4.0, border: int = cv2.BORDER_REPLICATE) -> Any:
    """scikit-image's ``gaussian`` (per channel, edges replicated) as a separable OpenCV filter.

    ``sepFilter2D`` with float taps is several times faster on uint8 than ``GaussianBlur``'s
    bit-exact fixed-point path, and rounds instead of truncating.
    """
    taps = gaussian_kernel(float(sigma), float(truncate))
    return cv2.sepFilter2D(img, -1, taps, taps, borderType=border)


def filter2d(img: Any, kernel: Any, border: int = cv2.BORDER_REFLECT_101) -> Any:
    """``filter2D`` of a uint8 image on the faster path of the installed OpenCV.

    OpenCV 4 filters uint8 fastest as uint8; OpenCV 5's uint8 path for large kernels is about
    twice as slow as its float32 one. Both give the same values up to rounding.
    """
    if _OPENCV_MAJOR < 5:
        return cv2.filter2D(img, -1, kernel, borderType=border)
    out = cv2.filter2D(img.astype(np.float32), -1, kernel, borderType=border)
    return np.clip(out, 0, 255).astype(np.uint8)


_OPENCV_MAJOR = int(cv2.__version__.split(".")[0])


@lru_cache(maxsize=1)
def normal_quantiles() -> F32:
    """The 65536 quantiles of N(0, 1) at (i + 0.5) / 65536: index them with uniform uint16s.

    Drawing 16-bit integers and looking their quantile up is about three times faster than
    NumPy's float32 ziggurat; the tails end at +-4.3 sigma (probability 1.5e-5 beyond), far
    below what a 0-255 image resolves.
    """
    from statistics import NormalDist

    inv = NormalDist().inv_cdf
    return np.array([inv((i + 0.5) / 65536.0) for i in range(65536)], dtype=np.float32)


def normal_noise(gen: np.random.Generator, shape: tuple[int, ...], scale: float) -> F32:
    """Gaussian noise with standard deviation ``scale`` (see :func:`normal_quantiles`)."""
    table = normal_quantiles() * np.float32(scale)
    out: F32 = table[gen.integers(0, 65536, size=shape, dtype=np.uint16)]
    return out


@lru_cache(maxsize=32)
def disk(radius: float, alias_blur: float) -> F32:
    """ImageNet-C's anti-aliased disk kernel for defocus blur."""
    coords = np.arange(-8, 8 + 1, dtype=np.float64) if radius <= 8 else np.arange(-radius, radius + 1)
    ksize = (3, 3) if radius <= 8 else (5, 5)
    x, y = np.meshgrid(coords, coords)
    aliased = np.array((x**2 + y**2) <= radius**2, dtype=np.float32)
    aliased = aliased / np.float32(aliased.sum())
    return np.asarray(cv2.GaussianBlur(aliased, ksize=ksize, sigmaX=alias_blur), dtype=np.float32)


def plasma_fractal(mapsize: int, wibbledecay: float, rng: np.random.Generator) -> F64:
    """Diamond-square height map in [0, 1] (ImageNet-C's fog), vectorised per level."""
    if mapsize & (mapsize - 1):
        raise ValueError("mapsize must be a power of two")
    maparray = np.zeros((mapsize, mapsize), dtype=np.float64)
    stepsize = mapsize
    wibble = 100.0

    def wibbledmean(array: F64) -> F64:
        return array / 4 + wibble * rng.uniform(-wibble, wibble, array.shape)

    while stepsize >= 2:
        half = stepsize // 2
        corners = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        square = corners + np.roll(corners, shift=-1, axis=0)
        square += np.roll(square, shift=-1, axis=1)
        maparray[half:mapsize:stepsize, half:mapsize:stepsize] = wibbledmean(square)
        drgrid = maparray[half:mapsize:stepsize, half:mapsize:stepsize]
        ulgrid = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        ltsum = drgrid + np.roll(drgrid, 1, axis=0) + ulgrid + np.roll(ulgrid, -1, axis=1)
        maparray[0:mapsize:stepsize, half:mapsize:stepsize] = wibbledmean(ltsum)
        ttsum = drgrid + np.roll(drgrid, 1, axis=1) + ulgrid + np.roll(ulgrid, -1, axis=0)
        maparray[half:mapsize:stepsize, 0:mapsize:stepsize] = wibbledmean(ttsum)
        stepsize //= 2
        wibble /= wibbledecay
    maparray -= maparray.min()
    peak = maparray.max()
    return maparray / peak if peak > 0 else maparray


def next_power_of_2(x: int) -> int:
    return 1 if x == 0 else 2 ** (x - 1).bit_length()


def clipped_zoom(img: Any, zoom: float) -> Any:
    """Zoom into the centre by ``zoom`` and keep the top-left ``H x W`` (ImageNet-C's clipped_zoom).

    The reference crops ``ceil(H / zoom)`` rows around the centre and upsamples them by ``zoom``
    with SciPy's linear ``zoom``. OpenCV's ``resize`` does the same upsampling (with pixel-centre
    rather than corner alignment: a sub-pixel offset) three times faster than a warp.
    """
    h, w = img.shape[:2]
    ch0 = math.ceil(h / zoom)
    ch1 = math.ceil(w / zoom)
    top0, top1 = (h - ch0) // 2, (w - ch1) // 2
    # The reference keeps the top-left h x w of the round(ch * zoom)-sized zoom: the same as
    # resizing the top-left h / zoom rows and w / zoom columns of the crop straight to h x w.
    rows, cols = min(ch0, h / zoom), min(ch1, w / zoom)
    crop = img[top0 : top0 + math.ceil(rows), top1 : top1 + math.ceil(cols)]
    return cv2.resize(crop, (w, h), interpolation=cv2.INTER_LINEAR)


@lru_cache(maxsize=256)
def motion_kernel(radius: int, sigma: float, angle: float) -> tuple[F32, tuple[int, int]]:
    """ImageNet-C's motion blur as one correlation kernel.

    The reference sums ``width = 2 * radius + 1`` copies of the image shifted along ``angle``
    (edges replicated) with one-sided Gaussian weights; a kernel with those weights at the same
    offsets, applied with replicated borders, gives the same sum in one ``filter2D`` call.
    Returns the kernel cropped to its support and its anchor.
    """
    width = 2 * radius + 1
    weights = np.exp(-(np.arange(width) ** 2) / (2 * sigma**2))
    weights /= weights.sum()
    rad = math.radians(angle)
    sin, cos = math.sin(rad) * width, math.cos(rad) * width
    hyp = math.hypot(sin, cos)
    offsets = [(-math.ceil(i * sin / hyp - 0.5), -math.ceil(i * cos / hyp - 0.5)) for i in range(width)]
    # blurred(y, x) = sum_i w_i * img(y - dy_i, x - dx_i): kernel taps at (-dy_i, -dx_i).
    taps = [(-dy, -dx) for dy, dx in offsets]
    ys = [t[0] for t in taps]
    xs = [t[1] for t in taps]
    y0, x0 = min(ys), min(xs)
    kernel = np.zeros((max(ys) - y0 + 1, max(xs) - x0 + 1), dtype=np.float32)
    for (ty, tx), wgt in zip(taps, weights, strict=True):
        kernel[ty - y0, tx - x0] += wgt
    return kernel, (-x0, -y0)


def motion_blur(img: Any, radius: int, sigma: float, angle: float) -> Any:
    """ImageNet-C's shift-and-add motion blur (edges replicated)."""
    kernel, anchor = motion_kernel(int(radius), float(sigma), round(float(angle), 6))
    return cv2.filter2D(img, -1, kernel, anchor=anchor, borderType=cv2.BORDER_REPLICATE)


def rgb_to_gray(img: Any) -> Any:
    return cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)


def resize(img: Any, width: int, height: int, interpolation: int = cv2.INTER_LINEAR) -> Any:
    return cv2.resize(img, (max(1, int(width)), max(1, int(height))), interpolation=interpolation)


INTERPOLATIONS: dict[str, int] = {
    "nearest": cv2.INTER_NEAREST,
    "nearest_exact": cv2.INTER_NEAREST_EXACT,
    "bilinear": cv2.INTER_LINEAR,
    "bicubic": cv2.INTER_CUBIC,
    "area": cv2.INTER_AREA,
    "lanczos": cv2.INTER_LANCZOS4,
}
