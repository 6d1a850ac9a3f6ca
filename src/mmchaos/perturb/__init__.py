"""Severity-graded, seeded, replayable perturbations of images and texts.

``get(name)(batch, severity=3, rng=seed) -> (batch, applied)``; ``get(name).replay(batch,
applied)`` reproduces the output bit for bit. This package imports neither torch nor
transformers. Third-party perturbations register through the ``mmchaos.perturbations``
entry-point group (value: ``"module:Class"``).
"""

from __future__ import annotations

from typing import Any

from mmchaos.perturb.base import Applied, ImagePerturbation, Modality, Perturbation, TextPerturbation
from mmchaos.registry import Registry

__all__ = [
    "REGISTRY",
    "Applied",
    "ImagePerturbation",
    "Modality",
    "Perturbation",
    "TextPerturbation",
    "get",
    "names",
]

REGISTRY: Registry[type[Perturbation[Any]]] = Registry("perturbation", "mmchaos.perturbations")
for _name, _spec in {
    "gaussian_noise": "mmchaos.perturb.noise:GaussianNoise",
    "shot_noise": "mmchaos.perturb.noise:ShotNoise",
    "gaussian_blur": "mmchaos.perturb.blur:GaussianBlur",
    "jpeg_compression": "mmchaos.perturb.digital:JpegCompression",
    "low_light": "mmchaos.perturb.deployment:LowLight",
    "block_occlusion": "mmchaos.perturb.deployment:BlockOcclusion",
    "keyboard_typo": "mmchaos.perturb.text:KeyboardTypo",
    "whitespace_insert": "mmchaos.perturb.text:WhitespaceInsert",
    "homoglyph": "mmchaos.perturb.text:Homoglyph",
    "word_shuffle": "mmchaos.perturb.text:WordShuffle",
}.items():
    REGISTRY.register(_name, _spec)


def get(name: str) -> Perturbation[Any]:
    """An instance of the perturbation registered as ``name``."""
    return REGISTRY.get(name)()


def names(modality: Modality | None = None) -> list[str]:
    all_names = REGISTRY.names()
    if modality is None:
        return all_names
    return [n for n in all_names if REGISTRY.get(n).modality == modality]
