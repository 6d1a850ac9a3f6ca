"""Severity-graded, seeded, replayable perturbations of images, texts and multimodal samples.

``get(name)(batch, severity=3, rng=seed) -> (batch, applied)``; ``get(name).replay(batch,
applied)`` reproduces the output bit for bit. A batch is a list of items or, for image
perturbations, a stacked ``(N, H, W[, C])`` uint8 array, which comes back stacked.
:func:`select` resolves names and groups (as suite files give them). This package imports
neither torch nor transformers (the saliency and meaning-kept code import them lazily, inside
the calls that need them). Third-party
perturbations register through the ``mmchaos.perturbations`` entry-point group (value:
``"module:Class"``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mmchaos.errors import UnknownNameError
from mmchaos.perturb.base import (
    GROUPS,
    SEVERITIES,
    Applied,
    BindContext,
    ImagePerturbation,
    Modality,
    MultimodalPerturbation,
    MultimodalSample,
    Perturbation,
    TargetAwarePerturbation,
    TextPerturbation,
)
from mmchaos.registry import Registry, closest

__all__ = [
    "GROUPS",
    "REGISTRY",
    "SEVERITIES",
    "Applied",
    "BindContext",
    "ImagePerturbation",
    "Modality",
    "MultimodalPerturbation",
    "MultimodalSample",
    "Perturbation",
    "TargetAwarePerturbation",
    "TextPerturbation",
    "get",
    "groups",
    "names",
    "select",
]

REGISTRY: Registry[type[Perturbation[Any]]] = Registry("perturbation", "mmchaos.perturbations")

_BUILTIN = {
    # ImageNet-C (15 benchmark + 4 validation corruptions), reference tables
    "gaussian_noise": "noise:GaussianNoise",
    "shot_noise": "noise:ShotNoise",
    "impulse_noise": "noise:ImpulseNoise",
    "speckle_noise": "noise:SpeckleNoise",
    "defocus_blur": "blur:DefocusBlur",
    "glass_blur": "blur:GlassBlur",
    "motion_blur": "blur:MotionBlur",
    "zoom_blur": "blur:ZoomBlur",
    "gaussian_blur": "blur:GaussianBlur",
    "snow": "weather:Snow",
    "frost": "weather:Frost",
    "fog": "weather:Fog",
    "brightness": "weather:Brightness",
    "spatter": "weather:Spatter",
    "contrast": "digital:Contrast",
    "elastic_transform": "digital:ElasticTransform",
    "pixelate": "digital:Pixelate",
    "jpeg_compression": "digital:JpegCompression",
    "saturate": "digital:Saturate",
    # deployment reality
    "screenshot_moire": "deployment:ScreenshotMoire",
    "ocr_ghosting": "deployment:OCRGhosting",
    "low_light": "deployment:LowLight",
    "resolution_collapse": "deployment:ResolutionCollapse",
    "aspect_squash": "deployment:AspectSquash",
    "exif_rotation": "deployment:ExifRotation",
    "channel_swap": "deployment:ChannelSwap",
    "premultiplied_alpha": "deployment:PremultipliedAlpha",
    "block_occlusion": "deployment:BlockOcclusion",
    "superpixel_occlusion": "deployment:SuperpixelOcclusion",
    "saliency_occlusion": "saliency:SaliencyOcclusion",
    "typographic": "typographic:Typographic",
    # text, character level
    "keyboard_typo": "text:KeyboardTypo",
    "ocr_confusion": "text:OCRConfusion",
    "char_insert": "text:CharInsert",
    "char_replace": "text:CharReplace",
    "char_swap": "text:CharSwap",
    "char_delete": "text:CharDelete",
    "whitespace_insert": "text:WhitespaceInsert",
    "homoglyph": "text:Homoglyph",
    "zero_width": "text:ZeroWidth",
    "unicode_nfd": "text:UnicodeNFD",
    "unicode_compat": "text:UnicodeCompat",
    "case_change": "text:CaseChange",
    # text, word level
    "word_shuffle": "text:WordShuffle",
    "word_swap": "text:WordSwap",
    "word_insert": "text:WordInsert",
    "word_delete": "text:WordDelete",
    "synonym_replace": "text:SynonymReplace",
    "punctuation_insert": "text:PunctuationInsert",
    "code_switch": "text:CodeSwitch",
    "negation": "text:Negation",
    "attribute_swap": "text:AttributeSwap",
    "context_overflow": "text:ContextOverflow",
    # multimodal
    "missing_modality": "multimodal:MissingModality",
    "caption_mismatch": "multimodal:CaptionMismatch",
    "frame_offset": "multimodal:FrameOffset",
    "frame_drop": "multimodal:FrameDrop",
    "bbox_shift": "multimodal:BBoxShift",
}
for _name, _spec in _BUILTIN.items():
    REGISTRY.register(_name, f"mmchaos.perturb.{_spec}")


def get(name: str) -> Perturbation[Any]:
    """A new instance of the perturbation registered as ``name``."""
    return REGISTRY.get(name)()


def names(modality: Modality | str | None = None, group: str | None = None) -> list[str]:
    """Registered names, optionally only those of one modality and/or one group."""
    out = REGISTRY.names()
    if modality is not None:
        out = [n for n in out if REGISTRY.get(n).modality == Modality(modality)]
    if group is not None:
        out = [n for n in out if REGISTRY.get(n).group == group]
    return out


def groups() -> list[str]:
    """The built-in groups, then any group a plug-in introduced."""
    extra = sorted({REGISTRY.get(n).group for n in REGISTRY.names()} - set(GROUPS))
    return list(GROUPS) + extra


def select(
    names_: Iterable[str] | None = None, groups_: Iterable[str] | None = None, exclude: Iterable[str] = ()
) -> list[str]:
    """The perturbations named, plus every member of the groups named, minus ``exclude``.

    Order: catalog order (registration order of the built-ins, then plug-ins by name). With
    neither names nor groups, the whole catalog. Unknown names and groups raise
    :class:`~mmchaos.errors.UnknownNameError` naming the closest known ones.
    """
    everything = _catalog_order()
    chosen: set[str] = set()
    if names_ is None and groups_ is None:
        chosen = set(everything)
    for name in names_ or ():
        REGISTRY.get(name)  # raises with close matches
        chosen.add(name)
    known_groups = groups()
    for group in groups_ or ():
        if group not in known_groups:
            hint = closest(group, known_groups, n=2)
            raise UnknownNameError(f"unknown perturbation group {group!r}{hint} (known: {', '.join(known_groups)})")
        chosen.update(names(group=group))
    for name in exclude:
        REGISTRY.get(name)
        chosen.discard(name)
    return [n for n in everything if n in chosen]


def _catalog_order() -> list[str]:
    plugins = [n for n in REGISTRY.names() if n not in _BUILTIN]
    return list(_BUILTIN) + plugins
