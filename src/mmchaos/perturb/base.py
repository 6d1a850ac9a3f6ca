"""What a perturbation is: a seeded parameter sampler plus a pure kernel.

``sample`` draws each item's parameters from a ``numpy.random.Generator``; ``apply`` is a pure
function of (item, parameters). Calling a perturbation returns the perturbed batch and a
:class:`Applied` record; ``replay(batch, record)`` gives the same bytes again. Randomness that is
too large to record (noise fields) is recorded as an integer seed that the kernel expands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from mmchaos.errors import ConfigError

__all__ = ["Applied", "ImagePerturbation", "Modality", "Perturbation", "TextPerturbation"]

ImageArray = npt.NDArray[np.uint8]
Item = TypeVar("Item")
SEVERITIES = (1, 2, 3, 4, 5)


class Modality(StrEnum):
    IMAGE = "image"
    TEXT = "text"
    MULTIMODAL = "multimodal"


@dataclass(frozen=True)
class Applied:
    """What one call did: enough to replay it bit for bit."""

    name: str
    severity: int
    items: tuple[dict[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "severity": self.severity, "items": [dict(i) for i in self.items]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Applied:
        return cls(data["name"], int(data["severity"]), tuple(dict(i) for i in data["items"]))


class Perturbation(Generic[Item]):
    """Base class; subclasses set the class attributes and implement ``sample`` and ``apply``."""

    name: ClassVar[str] = ""
    modality: ClassVar[Modality]
    group: ClassVar[str] = ""
    source: ClassVar[str] = "mmchaos"

    def sample(self, item: Item, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        """Draw the parameters for one item at ``severity`` (1-5)."""
        raise NotImplementedError

    def apply(self, item: Item, params: dict[str, Any]) -> Item:
        """Pure kernel: the same (item, params) always gives the same output."""
        raise NotImplementedError

    def __call__(
        self, batch: Sequence[Item], severity: int = 3, rng: np.random.Generator | int | None = None
    ) -> tuple[list[Item], Applied]:
        if severity not in SEVERITIES:
            raise ConfigError(f"severity must be one of 1-5, got {severity!r}", code="bad_severity")
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        params = [self.sample(item, severity, gen) for item in batch]
        return self.apply_batch(batch, params), Applied(self.name, severity, tuple(params))

    def apply_batch(self, batch: Sequence[Item], params: Sequence[dict[str, Any]]) -> list[Item]:
        return [self.apply(item, p) for item, p in zip(batch, params, strict=True)]

    def replay(self, batch: Sequence[Item], applied: Applied) -> list[Item]:
        if applied.name != self.name:
            raise ConfigError(f"record is for {applied.name!r}, not {self.name!r}")
        return self.apply_batch(batch, applied.items)

    @classmethod
    def summary(cls) -> str:
        doc = (cls.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""


class ImagePerturbation(Perturbation[ImageArray]):
    """Kernels see RGB ``(H, W, 3)`` uint8; grayscale and RGBA are adapted around them.

    Grayscale runs as three equal channels and comes back as the first one; RGBA keeps its alpha
    channel untouched (the corruptions model the camera and the codec, not transparency).
    """

    modality = Modality.IMAGE

    def apply_batch(self, batch: Sequence[ImageArray], params: Sequence[dict[str, Any]]) -> list[ImageArray]:
        return [self._apply_any_layout(item, p) for item, p in zip(batch, params, strict=True)]

    def _apply_any_layout(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        if item.dtype != np.uint8:
            raise ConfigError(f"{self.name}: images must be uint8, got {item.dtype}", code="bad_image_dtype")
        if item.ndim == 2:
            return self.apply(np.repeat(item[..., None], 3, axis=2), params)[..., 0].copy()
        if item.ndim == 3 and item.shape[2] == 1:
            return self.apply(np.repeat(item, 3, axis=2), params)[..., :1].copy()
        if item.ndim == 3 and item.shape[2] == 4:
            rgb = self.apply(np.ascontiguousarray(item[..., :3]), params)
            return np.concatenate([rgb, item[..., 3:]], axis=2)
        if item.ndim == 3 and item.shape[2] == 3:
            return self.apply(item, params)
        raise ConfigError(f"{self.name}: unsupported image shape {item.shape}", code="bad_image_shape")


class TextPerturbation(Perturbation[str]):
    modality = Modality.TEXT


def severity_value(table: Sequence[Any], severity: int) -> Any:
    return table[severity - 1]


def to_float(image: ImageArray) -> npt.NDArray[np.float32]:
    return image.astype(np.float32) / np.float32(255.0)


def to_uint8(image: npt.NDArray[np.floating[Any]]) -> ImageArray:
    """Scale [0, 1] floats back to uint8 the way ImageNet-C does (clip, then round)."""
    return np.clip(np.rint(image * 255.0), 0, 255).astype(np.uint8)


def draw_seed(rng: np.random.Generator) -> int:
    return int(rng.integers(0, 2**31 - 1))
