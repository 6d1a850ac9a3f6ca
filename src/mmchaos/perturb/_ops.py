"""Shared image operations for the kernels: OpenCV equivalents of the reference helpers.

ImageNet-C's reference code (``imagecorruptions``) builds on scikit-image and SciPy filters; these
are the same operations through OpenCV, with the border modes and kernel radii chosen to match
(scikit-image ``gaussian``: ``mode='nearest'``, radius ``int(truncate * sigma + 0.5)``; SciPy
``zoom`` and ``map_coordinates``: corner-aligned linear interpolation, ``reflect`` = OpenCV's
``BORDER_REFLECT``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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


DFT_TAPS = 130
"""Kernels of this many taps or more are applied through :func:`dft_correlate_planes` (OpenCV's own
``filter2D`` switches to its DFT near there)."""


def filter2d(img: Any, kernel: Any, border: int = cv2.BORDER_REFLECT_101) -> Any:
    """``filter2D`` of a uint8 image, truncated to uint8 as the reference's ``np.uint8(...)`` does.

    Under :data:`DFT_TAPS` taps, OpenCV's direct filter2D on a float32 copy (1.3-2x faster than
    on uint8). From :data:`DFT_TAPS` taps through :func:`dft_correlate_planes`, the
    kernel's spectrum cached: on OpenCV 5.1 (benchmarks/perturb_speed.md) ``filter2D``'s own DFT
    path on float32 took 10.5 ms for the radius-6 disk at 512 x 384, the uint8 one 6.4 ms and this
    one 4.3 ms (at 224 x 224 1.2 ms against 1.5). The choice depends on the kernel only, so an
    image's output does not change with its size's path. ``truncate_u8`` then truncates in one pass.
    """
    if kernel.size >= DFT_TAPS:  # truncated plane by plane: OpenCV 5.1 merges float32 planes slowly
        return _merged([truncate_u8(plane) for plane in dft_correlate_planes(img, kernel, border)])
    return truncate_u8(cv2.filter2D(img.astype(np.float32), -1, kernel, borderType=border))


def dft_correlate(img: Any, kernel: Any, border: int = cv2.BORDER_REFLECT_101) -> F32:
    """``filter2D(img, -1, kernel)`` in float32 (a correlation, anchor at the kernel's centre)."""
    out: F32 = np.asarray(_merged(dft_correlate_planes(img, kernel, border)), dtype=np.float32)
    return out


def _merged(planes: Sequence[Any]) -> Any:
    """The planes of an image as one array (a single plane as it is: a grey image stays 2-D)."""
    return cv2.merge(planes) if len(planes) > 1 else planes[0]


def dft_correlate_planes(img: Any, kernel: Any, border: int = cv2.BORDER_REFLECT_101) -> list[F32]:
    """Each channel of ``filter2D(img, -1, kernel)`` in float32, through one DFT per channel of the
    border-padded image and the kernel's cached spectrum.

    The image is padded by ``border`` to an optimal DFT size at least a kernel's width larger, so
    the circular product wraps only into the padding, which is cut off again.
    """
    h, w = img.shape[:2]
    kh, kw = kernel.shape
    ry, rx = kh // 2, kw // 2
    rows, cols = cv2.getOptimalDFTSize(h + kh), cv2.getOptimalDFTSize(w + kw)
    padded = cv2.copyMakeBorder(img, ry, rows - h - ry, rx, cols - w - rx, border)
    spectrum = _kernel_spectrum(np.ascontiguousarray(kernel, dtype=np.float32).tobytes(), kh, kw, rows, cols)
    planes: list[F32] = []
    # Split as uint8, then each plane to float32: OpenCV 5.1 splits float32 channels 20-40x slower.
    for plane in cv2.split(padded):
        product = cv2.mulSpectrums(cv2.dft(plane.astype(np.float32)), spectrum, 0)
        inverse = cv2.dft(product, flags=cv2.DFT_INVERSE | cv2.DFT_SCALE | cv2.DFT_REAL_OUTPUT, nonzeroRows=h + ry)
        planes.append(np.asarray(inverse[ry : ry + h, rx : rx + w], dtype=np.float32))
    return planes


@lru_cache(maxsize=16)
def _kernel_spectrum(kernel: bytes, kh: int, kw: int, rows: int, cols: int) -> F32:
    """The DFT of the kernel flipped (a product of spectra convolves; filter2D correlates), placed
    with its centre at the origin of a ``rows x cols`` plane (a few hundred KB each)."""
    taps = np.frombuffer(kernel, dtype=np.float32).reshape(kh, kw)
    plane = np.zeros((rows, cols), np.float32)
    plane[:kh, :kw] = taps[::-1, ::-1]
    spectrum: F32 = np.asarray(cv2.dft(np.roll(plane, (-(kh // 2), -(kw // 2)), axis=(0, 1))), dtype=np.float32)
    spectrum.flags.writeable = False
    return spectrum


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


@lru_cache(maxsize=16)
def scaled_normal_quantiles(scale: float, offset: float = 0.0) -> F32:
    """``offset + scale * normal_quantiles()`` in float32, made once per (scale, offset)."""
    table = normal_quantiles() * np.float32(scale)
    if offset:
        table += np.float32(offset)
    table.flags.writeable = False
    return table


def uniform16(gen: np.random.Generator, shape: tuple[int, ...]) -> npt.NDArray[np.uint16]:
    """Uniform 16-bit integers: the draws :func:`normal_noise` and the noise kernels look up.

    The bytes of ``gen.integers(0, 65536, size=shape, dtype=np.uint16)`` (NumPy fills a full
    16-bit range from the 64-bit outputs, low half first: their little-endian 16-bit words), at a
    third of its cost: the raw outputs viewed as 16-bit words. ``gen`` is not for further use.
    """
    count = int(np.prod(shape))
    raw = gen.bit_generator.random_raw((count + 3) // 4)
    words: npt.NDArray[np.uint16] = raw.astype("<u8", copy=False).view("<u2")[:count]
    return words.reshape(shape)


def uniform16_words(shape: tuple[int, ...]) -> int:
    """How many 64-bit outputs :func:`uniform16` takes for a field of ``shape``."""
    return (int(np.prod(shape)) + 3) // 4


def uniform16_stack(
    seeds: Sequence[int], shape: tuple[int, ...], offsets: Sequence[int] | None = None
) -> npt.NDArray[np.uint16]:
    """One :func:`uniform16` field per item, stacked: item ``i`` is the field drawn from
    ``default_rng(seeds[i])`` after skipping ``offsets[i]`` 64-bit outputs (none by default).

    Items that continue one stream (the same seed, each offset the previous one plus a field's
    :func:`uniform16_words`) are drawn in one call: a batch sampled together shares one seed
    (see :class:`mmchaos.perturb.noise.NoiseKernel`), so its fields cost one generator and one
    draw instead of one each, and any item still replays alone from its (seed, offset).
    """
    n = len(seeds)
    skips = list(offsets) if offsets is not None else [0] * n
    count = int(np.prod(shape))
    words = uniform16_words(shape)
    out: npt.NDArray[np.uint16] | None = None
    start = 0
    while start < n:
        stop = start + 1
        while stop < n and seeds[stop] == seeds[start] and skips[stop] == skips[stop - 1] + words:
            stop += 1
        bitgen = np.random.PCG64(int(seeds[start]))  # default_rng(seed)'s generator
        if skips[start]:
            bitgen.advance(int(skips[start]))
        raw = bitgen.random_raw((stop - start) * words).astype("<u8", copy=False).view("<u2")
        block = raw.reshape(stop - start, words * 4)
        if start == 0 and stop == n and words * 4 == count:
            return block.reshape(n, *shape)  # one stream, no padding: the draw is the stack
        if out is None:
            out = np.empty((n, *shape), dtype=np.uint16)
        out[start:stop] = block[:, :count].reshape(stop - start, *shape)
        start = stop
    assert out is not None
    return out


POISSON_TABLE_MAX = 1024.0
POISSON_BITS = 12
"""Quantile resolution of the shot-noise table: 2**12 levels a pixel value (1 MiB a photon count).

The table is gathered from at random, so its size sets the kernel's speed: at 2**14 quantiles
(4 MiB, past the 512 KiB L2 cache of the benchmark machine) the gather alone took 1-2 ms for a
224 x 224 image, at 2**12 about 0.3 ms. The distribution keeps its mean within 0.03 levels and its
variance within about 1% of the exact Poisson's at every level of every table
(tests/unit/perturb/test_perturb_speed.py); only outcomes rarer than 1/8192 are folded into their neighbours.
"""


@lru_cache(maxsize=8)
def poisson_level_table(photons: float) -> U8:
    """``(256, 2**POISSON_BITS)`` output levels of ImageNet-C's shot noise, indexed ``[level, quantile]``.

    Entry ``[v, i]`` is ``trunc(clip(k * 255 / photons))`` for ``k`` the Poisson(``v * photons /
    255``) quantile at ``(i + 0.5) / 2**POISSON_BITS``: inverse-CDF sampling, looked up instead
    of drawn (NumPy's Poisson sampler took ten times longer than everything else in the
    kernel). Counts of ``photons`` or more all saturate at 255, so the table stops there. Level
    major: neighbouring pixels of a natural image share levels, so a gather stays in few rows.
    """
    n = 1 << POISSON_BITS
    top = math.ceil(photons)  # every count >= photons maps to 255
    k = np.arange(top + 1, dtype=np.float64)
    rates = np.arange(256, dtype=np.float64) * (photons / 255.0)
    log_fact = np.array([math.lgamma(i + 1.0) for i in range(top + 1)])
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = k[None, :] * np.log(rates)[:, None] - rates[:, None] - log_fact[None, :]
    logp[0, :] = -np.inf
    logp[0, 0] = 0.0  # rate 0: always zero photons
    cdf = np.cumsum(np.exp(logp), axis=1)[:, :top]  # P(count <= k), k < top
    # count(i) = #{k : cdf[k] < q_i}: the first quantile index past each cdf step, counted up.
    first = np.clip(np.floor(cdf * n - 0.5).astype(np.int64) + 1, 0, n)
    steps = np.zeros((256, n + 1), dtype=np.uint16)
    np.add.at(steps, (np.repeat(np.arange(256), top), first.ravel()), 1)
    counts = np.cumsum(steps[:, :n], axis=1, dtype=np.uint16)
    values = (np.arange(top + 1, dtype=np.float64) * (255.0 / photons)).astype(np.float32)
    np.clip(values, 0.0, 255.0, out=values)
    table: U8 = values.astype(np.uint8)[counts]
    table.flags.writeable = False
    return table


def poisson_levels(images: Any, fields: npt.NDArray[np.uint16], photons: float) -> U8:
    """Shot noise of uint8 ``images`` from uniform 16-bit ``fields`` of the same shape.

    Past :data:`POISSON_TABLE_MAX` photons (no table of ImageNet-C's goes there) the table would
    be large: the counts come from the normal approximation instead, through the same draws.
    """
    if photons > POISSON_TABLE_MAX:
        rates = np.arange(256, dtype=np.float64) * (photons / 255.0)
        z = np.take(normal_quantiles(), fields).astype(np.float64)
        lam = rates[images]
        counts = np.maximum(np.floor(lam + np.sqrt(lam) * z + 0.5), 0.0) * (255.0 / photons)
        approx: U8 = np.clip(counts, 0, 255).astype(np.float32).astype(np.uint8)
        return approx
    table = poisson_level_table(float(photons))
    index = np.asarray(images).astype(np.intp)
    index <<= POISSON_BITS
    index |= fields >> np.uint16(16 - POISSON_BITS)
    out: U8 = np.take(table.reshape(-1), index)
    return out


@lru_cache(maxsize=16)
def normal_level_offsets(scale: float) -> npt.NDArray[np.int16]:
    """``floor(scale * normal_quantiles())`` as int16: Gaussian noise in whole levels.

    For an integer level ``x`` and a noise value ``n``, ``trunc(clip(x + n, 0, 255))`` (the
    reference's ``np.uint8(clip(...))``) is ``clip(x + floor(n), 0, 255)``: the noise can be
    floored before it is added, and the addition done in integers with saturation.
    """
    table = np.floor(normal_quantiles().astype(np.float64) * float(scale))
    offsets = np.clip(table, -32768, 32767).astype(np.int16)
    offsets.flags.writeable = False
    return offsets


def normal_noise(gen: np.random.Generator, shape: tuple[int, ...], scale: float) -> F32:
    """Gaussian noise with standard deviation ``scale`` (see :func:`normal_quantiles`)."""
    out: F32 = np.take(scaled_normal_quantiles(float(scale)), uniform16(gen, shape))
    return out


@lru_cache(maxsize=32)
def disk(radius: float, alias_blur: float) -> F32:
    """ImageNet-C's anti-aliased disk kernel for defocus blur."""
    coords = np.arange(-8, 8 + 1, dtype=np.float64) if radius <= 8 else np.arange(-radius, radius + 1)
    ksize = (3, 3) if radius <= 8 else (5, 5)
    x, y = np.meshgrid(coords, coords)
    aliased = np.array((x**2 + y**2) <= radius**2, dtype=np.float32)
    aliased = aliased / np.float32(aliased.sum())
    kernel = np.asarray(cv2.GaussianBlur(aliased, ksize=ksize, sigmaX=alias_blur), dtype=np.float32)
    # Cropped to its non-zero support (symmetric, so the anchor stays the centre): the zero taps
    # add nothing, but a 17 x 17 box sent radius 3 through the DFT instead of the direct path.
    used = np.flatnonzero(kernel.any(axis=0))
    lo, hi = min(int(used[0]), len(kernel) - 1 - int(used[-1])), len(kernel) - 1
    hi -= lo
    cropped: F32 = np.ascontiguousarray(kernel[lo : hi + 1, lo : hi + 1])
    cropped.flags.writeable = False
    return cropped


def plasma_fractal(mapsize: int, wibbledecay: float, rng: np.random.Generator) -> F32:
    """Diamond-square height map in [0, 1] (ImageNet-C's fog), vectorised per level, float32.

    The reference's steps on a torus: each new point is the mean of its four neighbours plus a
    uniform draw in ``[-wibble, wibble)`` times ``wibble``, with ``wibble`` divided by
    ``wibbledecay`` each level. The draws are 16-bit uniforms (:func:`uniform16`, one call a
    level) and the map float32: a height map normalised to [0, 1] and added to an 8-bit image
    needs neither float64 nor 53-bit uniforms, and the map came four times faster.
    """
    if mapsize & (mapsize - 1):
        raise ValueError("mapsize must be a power of two")
    maparray = np.zeros((mapsize, mapsize), dtype=np.float32)
    stepsize = mapsize
    wibble = 100.0
    quarter = np.float32(0.25)
    while stepsize >= 2:
        half = stepsize // 2
        n = mapsize // stepsize
        # wibble * uniform(-wibble, wibble): 16-bit draws mapped to the centres of 65536 bins.
        noise = uniform16(rng, (3, n, n)).astype(np.float32)
        scale = wibble * wibble * 2.0 / 65536.0
        noise *= np.float32(scale)
        noise -= np.float32(wibble * wibble - scale / 2.0)
        ul = np.ascontiguousarray(maparray[0:mapsize:stepsize, 0:mapsize:stepsize])
        square = ul.copy()
        _add_rolled(square, ul, -1, 0)
        _add_rolled(square, square.copy(), -1, 1)
        square *= quarter
        square += noise[0]
        maparray[half:mapsize:stepsize, half:mapsize:stepsize] = square
        dr = square
        ltsum = dr + ul
        _add_rolled(ltsum, dr, 1, 0)
        _add_rolled(ltsum, ul, -1, 1)
        ltsum *= quarter
        ltsum += noise[1]
        maparray[0:mapsize:stepsize, half:mapsize:stepsize] = ltsum
        ttsum = dr + ul
        _add_rolled(ttsum, dr, 1, 1)
        _add_rolled(ttsum, ul, -1, 0)
        ttsum *= quarter
        ttsum += noise[2]
        maparray[half:mapsize:stepsize, 0:mapsize:stepsize] = ttsum
        stepsize //= 2
        wibble /= wibbledecay
    maparray -= maparray.min()
    peak = maparray.max()
    if peak > 0:
        maparray *= np.float32(1.0 / peak)
    return maparray


def _add_rolled(dst: F32, src: F32, shift: int, axis: int) -> None:
    """``dst += np.roll(src, shift, axis)`` for a shift of one, without the copy or roll's overhead."""
    if axis == 1:
        dst, src = dst.T, src.T
    if shift == -1:  # dst[i] += src[i + 1], wrapping
        dst[:-1] += src[1:]
        dst[-1] += src[0]
    else:  # dst[i] += src[i - 1], wrapping
        dst[1:] += src[:-1]
        dst[0] += src[-1]


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


def zoom_crop_shape(h: int, w: int, zoom: float) -> tuple[int, int]:
    """The rows and columns of an ``h x w`` field that :func:`clipped_zoom` reads at ``zoom``.

    A field of i.i.d. noise that is only zoomed needs drawing at this size alone: the rest of
    the reference's full-size draw is cropped away unseen.
    """
    rows, cols = min(math.ceil(h / zoom), h / zoom), min(math.ceil(w / zoom), w / zoom)
    return math.ceil(rows), math.ceil(cols)


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
    """ImageNet-C's shift-and-add motion blur (edges replicated): uint8 in, rounded uint8 out;
    float32 in, float32 out.

    The kernel has one tap per shifted copy (19-41 of them) in a bounding box of up to 41 x 41:
    ``filter2D`` convolves that box through the DFT, which took 2-6x longer than adding the
    shifted copies themselves, one ``scaleAdd`` of a view of the padded image per tap.
    """
    kernel, (ax, ay) = motion_kernel(int(radius), float(sigma), round(float(angle), 6))
    kh, kw = kernel.shape
    h, w = img.shape[:2]
    padded = cv2.copyMakeBorder(img, ay, kh - 1 - ay, ax, kw - 1 - ax, cv2.BORDER_REPLICATE)
    if padded.dtype != np.float32:
        padded = padded.astype(np.float32)
    acc: Any = None
    for y, x in zip(*np.nonzero(kernel), strict=True):
        view = padded[y : y + h, x : x + w]
        weight = float(kernel[y, x])
        if acc is None:
            acc = view * np.float32(weight)
        else:
            cv2.scaleAdd(view, weight, acc, dst=acc)
    if img.dtype == np.uint8:
        return cv2.convertScaleAbs(acc)  # rounds and saturates, as filter2D into uint8 did
    return acc


TRUNCATE_OFFSET = 0.5 - 2.0**-16


def truncate_u8(x: Any, alpha: float = 1.0) -> U8:
    """``uint8(clip(alpha * x, 0, 255))`` (truncating, as the reference's ``np.uint8``) in one pass,
    for ``alpha * x >= 0``.

    ``convertScaleAbs`` rounds; rounding ``v - (0.5 - 2**-16)`` truncates ``v``, except for a
    ``v`` within 2**-16 below an integer (one float32 step at 128-255: float noise, as the
    reference's own arithmetic has), where it rounds up. A clip, a multiply and a conversion in
    NumPy took five times longer.
    """
    out: U8 = np.asarray(cv2.convertScaleAbs(x, alpha=alpha, beta=-TRUNCATE_OFFSET), dtype=np.uint8)
    return out


def gray_to_rgb(x: Any) -> Any:
    """An ``(H, W)`` array as ``(H, W, 3)`` equal channels: NumPy broadcasting an ``(H, W, 1)`` array
    against ``(H, W, 3)`` runs an inner loop of three values and was three times slower."""
    return cv2.cvtColor(x, cv2.COLOR_GRAY2RGB)


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


def box_runs(n_in: int, n_out: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Pillow's ``BOX`` downscale from ``n_in`` to ``n_out`` pixels: output ``i`` is the plain mean
    of input pixels ``[lo[i], hi[i])``.

    Pillow samples its box filter at input pixel centres (``-0.5 < t <= 0.5``, with ``t`` the
    distance from the output's centre in output pixels), so each output averages a run of whole
    pixels, not the fractional footprint OpenCV's ``INTER_AREA`` weighs. Computed in Pillow's
    order of float operations: where a pixel centre falls exactly on a run's edge the runs may
    skip or share that pixel, as Pillow's do.
    """
    scale = n_in / n_out
    support = 0.5 * scale
    centre = (np.arange(n_out, dtype=np.float64) + 0.5) * scale
    first = np.maximum((centre - support + 0.5).astype(np.intp), 0)
    last = np.minimum((centre + support + 0.5).astype(np.intp), n_in)
    width = int((last - first).max())
    cand = first[:, None] + np.arange(width)[None, :]
    t = (cand - centre[:, None] + 0.5) * (1.0 / scale)
    inside = (t > -0.5) & (t <= 0.5) & (cand < last[:, None])
    lo = first + np.argmax(inside, axis=1)
    hi = first + width - np.argmax(inside[:, ::-1], axis=1)
    return lo.astype(np.intp), hi.astype(np.intp)


@lru_cache(maxsize=16)
def _box_plan(h: int, w: int, oh: int, ow: int) -> tuple[tuple[npt.NDArray[np.intp], ...], F32]:
    """Where :func:`box_downscale` reads the integral image, and each output's 1 / pixel count.

    When the runs tile the input (each starts where the previous one ends: every size the
    benchmarks use) neighbouring outputs share corners and one gather of ``(oh + 1) x (ow + 1)``
    corners serves all; otherwise four gathers, one a corner.
    """
    y0, y1 = box_runs(h, oh)
    x0, x1 = box_runs(w, ow)

    def flat(ys: npt.NDArray[np.intp], xs: npt.NDArray[np.intp]) -> npt.NDArray[np.intp]:
        index = ((ys[:, None] * (w + 1) + xs[None, :])[..., None] * 3 + np.arange(3)).astype(np.intp)
        index.flags.writeable = False
        return index

    tiled = bool(np.array_equal(y1[:-1], y0[1:]) and np.array_equal(x1[:-1], x0[1:]))
    if tiled:
        corners: tuple[npt.NDArray[np.intp], ...] = (flat(np.append(y0, y1[-1]), np.append(x0, x1[-1])),)
    else:
        corners = (flat(y1, x1), flat(y0, x1), flat(y1, x0), flat(y0, x0))
    inverse = 1.0 / ((y1 - y0)[:, None] * (x1 - x0)[None, :])
    inv: F32 = np.ascontiguousarray(np.repeat(inverse[..., None], 3, axis=2), dtype=np.float32)
    inv.flags.writeable = False
    return corners, inv


def box_downscale(img: Any, ow: int, oh: int) -> U8:
    """Pillow's ``resize((ow, oh), BOX)`` of an RGB uint8 image, within one level.

    Each output is the mean of a rectangle of whole pixels (:func:`box_runs`): four reads of the
    exact int32 integral image, one multiply, one rounding. Pillow rounds after each of its two
    passes, this once, so a third of the values differ from Pillow's by one level; OpenCV's
    ``INTER_AREA``, used before, weighs fractional footprints and differed by up to 56 levels
    (and took 1.6-3x longer at non-integer factors). At integer factors the runs are equal blocks
    and ``INTER_AREA``'s fast path computes the same means.
    """
    h, w = img.shape[:2]
    if h % oh == 0 and w % ow == 0:
        out: U8 = cv2.resize(img, (ow, oh), interpolation=cv2.INTER_AREA)
        return out
    corners, inv = _box_plan(h, w, oh, ow)
    integral = cv2.integral(img, sdepth=cv2.CV_32S).reshape(-1)
    if len(corners) == 1:
        grid = np.take(integral, corners[0])
        box = grid[1:, 1:] - grid[:-1, 1:]
        box -= grid[1:, :-1]
        box += grid[:-1, :-1]
    else:
        box = np.take(integral, corners[0]) - np.take(integral, corners[1])
        box -= np.take(integral, corners[2])
        box += np.take(integral, corners[3])
    means: U8 = np.asarray(cv2.convertScaleAbs(cv2.multiply(box, inv, dtype=cv2.CV_32F)), dtype=np.uint8)
    return means
