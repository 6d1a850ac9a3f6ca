"""Samples and datasets: an image, a caption, a class label and/or a transcription.

A sample loads its image lazily (user datasets hold paths, built-in ones hold arrays), so a
dataset of many thousands of files does not sit in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from mmchaos.data.images import ImageLoadError, load_image
from mmchaos.errors import DataError

__all__ = ["Dataset", "Sample", "load_image_file"]

ImageArray = npt.NDArray[np.uint8]


def load_image_file(path: Path) -> ImageArray:
    """Decode an image file to an RGB uint8 array, EXIF orientation applied (the shared loader)."""
    try:
        return load_image(path)
    except ImageLoadError as exc:
        if exc.code == "data_missing_file":
            raise DataError(exc.message, code="data_missing_file") from exc
        raise DataError(f"cannot read image {path}: {exc.message}", code="data_unreadable_image") from exc


@dataclass
class Sample:
    """One item of a dataset; ``text`` is an OCR transcription, ``caption`` a description,
    ``question``/``answer`` a visual question about the image and its short reference answer."""

    id: str
    image: ImageArray | None = None
    image_path: Path | None = None
    caption: str | None = None
    label: str | None = None
    text: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    question: str | None = None
    answer: str | None = None

    def load_image(self) -> ImageArray:
        if self.image is not None:
            return self.image
        if self.image_path is None:
            raise DataError(f"sample {self.id} has no image", code="data_no_image")
        return load_image_file(self.image_path)


@dataclass
class Dataset(Sequence[Sample]):
    """An ordered, indexable set of samples plus the class names a zero-shot task needs."""

    name: str
    samples: list[Sample]
    classes: list[str] = field(default_factory=list)
    prompt_template: str = "a photo of a {}."
    source: str = ""

    def __post_init__(self) -> None:
        if not self.classes:
            labels = {s.label for s in self.samples if s.label is not None}
            self.classes = sorted(labels)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Sample:  # type: ignore[override]
        return self.samples[index]

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples)

    @property
    def has_images(self) -> bool:
        return all(s.image is not None or s.image_path is not None for s in self.samples)

    @property
    def has_labels(self) -> bool:
        return bool(self.samples) and all(s.label is not None for s in self.samples)

    @property
    def has_captions(self) -> bool:
        return bool(self.samples) and all(s.caption is not None for s in self.samples)

    @property
    def has_transcriptions(self) -> bool:
        return bool(self.samples) and all(s.text is not None for s in self.samples)

    @property
    def has_questions(self) -> bool:
        """Every sample asks a question about its image and carries the reference answer."""
        return bool(self.samples) and all(s.question is not None and s.answer is not None for s in self.samples)

    def head(self, n: int | None) -> Dataset:
        """The first ``n`` samples (all when ``n`` is None), as a dataset of the same kind."""
        if n is None or n >= len(self.samples):
            return self
        return Dataset(self.name, self.samples[:n], list(self.classes), self.prompt_template, self.source)

    def subset(self, keep: Callable[[Sample], bool]) -> Dataset:
        return Dataset(
            self.name, [s for s in self.samples if keep(s)], list(self.classes), self.prompt_template, self.source
        )

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "size": len(self.samples),
            "classes": len(self.classes),
            "fields": [
                f
                for f, ok in (
                    ("image", self.has_images),
                    ("label", self.has_labels),
                    ("caption", self.has_captions),
                    ("text", self.has_transcriptions),
                    ("question", self.has_questions),
                )
                if ok
            ],
        }
