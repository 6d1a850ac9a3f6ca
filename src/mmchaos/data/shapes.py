"""The built-in ``shapes`` dataset: coloured shapes with varying size, position and background.

Deterministic by (seed, split, index): sample ``i`` is the same whatever ``n`` is, and the
``train`` and ``test`` splits never share a random stream. The tiny CLIP model that ships with
mmchaos was trained on the ``train`` split; evaluation uses ``test``.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from mmchaos.data.base import Dataset, Sample

__all__ = ["CLASSES", "COLOURS", "SHAPES", "make_shapes", "render_shape"]

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (40, 70, 230),
    "yellow": (240, 215, 20),
    "purple": (150, 50, 190),
    "orange": (250, 130, 20),
}
SHAPES = ("circle", "square", "triangle", "cross")
CLASSES = [f"{c} {s}" for c in COLOURS for s in SHAPES]
SIZES = {"small": 0.22, "medium": 0.34, "large": 0.48}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "black": (15, 15, 15),
    "white": (245, 245, 245),
    "gray": (128, 128, 128),
    "dark blue": (20, 25, 60),
    "beige": (225, 210, 180),
}
_ROWS = ("top", "middle", "bottom")
_COLS = ("left", "center", "right")
_SPLIT_CODE = {"train": 0, "test": 1, "val": 2}
_TEMPLATES = (
    "a {size} {colour} {shape} on a {bg} background",
    "a {colour} {shape} at the {pos}",
    "a photo of a {size} {colour} {shape} at the {pos} on {bg}",
    "{colour} {shape}, {size}, {pos}, {bg} background",
    "an image showing a {colour} {shape} in the {pos} over a {bg} background",
)
_SS = 4  # supersampling factor for anti-aliased edges


def _position_name(row: str, col: str) -> str:
    if row == "middle" and col == "center":
        return "center"
    if row == "middle":
        return f"middle {col}"
    return f"{row} {col}"


def render_shape(
    shape: str,
    colour: tuple[int, int, int],
    background: tuple[int, int, int],
    size_frac: float,
    center: tuple[float, float],
    image_size: int,
    texture: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Render one shape (anti-aliased by supersampling) onto a lightly textured background."""
    big = image_size * _SS
    img = Image.new("RGB", (big, big), background)
    draw = ImageDraw.Draw(img)
    cx, cy = center[0] * big, center[1] * big
    r = size_frac * big / 2
    if shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif shape == "square":
        s = r * 0.9
        draw.rectangle((cx - s, cy - s, cx + s, cy + s), fill=colour)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)], fill=colour)
    elif shape == "cross":
        w = r * 0.36
        draw.rectangle((cx - r, cy - w, cx + r, cy + w), fill=colour)
        draw.rectangle((cx - w, cy - r, cx + w, cy + r), fill=colour)
    else:  # pragma: no cover - guarded by SHAPES
        raise ValueError(shape)
    small = img.resize((image_size, image_size), Image.Resampling.BOX)
    arr = np.asarray(small, dtype=np.float32)
    if texture > 0:
        arr = arr + rng.normal(0.0, texture, size=arr.shape).astype(np.float32)
    return np.clip(np.rint(arr), 0, 255).astype(np.uint8)


def make_sample(seed: int, split: str, index: int, image_size: int = 64) -> Sample:
    rng = np.random.default_rng([seed, _SPLIT_CODE[split], index])
    colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
    shape = SHAPES[int(rng.integers(len(SHAPES)))]
    size = list(SIZES)[int(rng.integers(len(SIZES)))]
    bg = list(BACKGROUNDS)[int(rng.integers(len(BACKGROUNDS)))]
    row, col = _ROWS[int(rng.integers(3))], _COLS[int(rng.integers(3))]
    frac = SIZES[size] * float(rng.uniform(0.9, 1.1))
    margin = frac / 2 + 0.04
    anchors = {"top": margin, "left": margin, "middle": 0.5, "center": 0.5, "bottom": 1 - margin, "right": 1 - margin}
    jitter = 0.04
    cx = float(np.clip(anchors[col] + rng.uniform(-jitter, jitter), margin, 1 - margin))
    cy = float(np.clip(anchors[row] + rng.uniform(-jitter, jitter), margin, 1 - margin))
    rgb = tuple(int(np.clip(v + rng.integers(-18, 19), 0, 255)) for v in COLOURS[colour])
    texture = float(rng.uniform(0.0, 6.0))
    image = render_shape(shape, rgb, BACKGROUNDS[bg], frac, (cx, cy), image_size, texture, rng)  # type: ignore[arg-type]
    pos = _position_name(row, col)
    template = _TEMPLATES[int(rng.integers(len(_TEMPLATES)))]
    caption = template.format(size=size, colour=colour, shape=shape, bg=bg, pos=pos)
    return Sample(
        id=f"shapes-{split}-{index}",
        image=image,
        caption=caption,
        label=f"{colour} {shape}",
        meta={"colour": colour, "shape": shape, "size": size, "background": bg, "position": pos},
    )


def make_shapes(n: int = 512, seed: int = 0, split: str = "test", image_size: int = 64) -> Dataset:
    """Generate ``n`` samples of the ``shapes`` dataset for ``split`` (train/val/test)."""
    if split not in _SPLIT_CODE:
        raise ValueError(f"split must be one of {sorted(_SPLIT_CODE)}, got {split!r}")
    samples = [make_sample(seed, split, i, image_size) for i in range(n)]
    return Dataset(
        name="shapes",
        samples=samples,
        classes=list(CLASSES),
        prompt_template="a photo of a {}.",
        source=f"builtin:shapes?split={split}&seed={seed}&n={n}",
    )
