"""Samples and datasets: an image, a caption, a class label and/or a transcription.

A sample loads its image lazily (user datasets hold paths, built-in ones hold arrays), so a
dataset of many thousands of files does not sit in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from mmchaos.data.images import ImageLoadError, load_image
from mmchaos.errors import DataError

if TYPE_CHECKING:
    from mmchaos.data.pdf import PdfPage

__all__ = ["Dataset", "LazyImages", "Sample", "load_image_file"]

ImageArray = npt.NDArray[np.uint8]


def load_image_file(path: Path) -> ImageArray:
    """Decode an image file to an RGB uint8 array, EXIF orientation applied (the shared loader)."""
    try:
        return load_image(path)
    except ImageLoadError as exc:
        if exc.code == "data_missing_file":
            raise DataError(exc.message, code="data_missing_file") from exc
        raise DataError(f"cannot read image {path}: {exc.message}", code="data_unreadable_image") from exc


@dataclass(slots=True)
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
    page: PdfPage | None = None
    """A page of a PDF, rendered when the image is loaded (documents: bytes, not pixels, in memory)."""

    @property
    def has_image(self) -> bool:
        return self.image is not None or self.image_path is not None or self.page is not None

    def load_image(self) -> ImageArray:
        if self.image is not None:
            return self.image
        if self.page is not None:
            return self.page.render()
        if self.image_path is None:
            raise DataError(f"sample {self.id} has no image", code="data_no_image")
        return load_image_file(self.image_path)


class LazyImages(Sequence[ImageArray]):
    """The images of some samples, decoded only when indexed: a slice holds just its own images,
    so a loop over batches keeps one batch in memory, not the whole set."""

    def __init__(self, samples: Sequence[Sample]) -> None:
        self._samples = samples

    def __len__(self) -> int:
        return len(self._samples)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [s.load_image() for s in self._samples[index]]
        return self._samples[index].load_image()


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
        return all(s.has_image for s in self.samples)

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

    def images(self) -> LazyImages:
        """The samples' images, decoded on access (see :class:`LazyImages`)."""
        return LazyImages(self.samples)

    def select(self, indices: Sequence[int]) -> Dataset:
        """The samples at ``indices``, in that order, as a dataset of the same kind (nothing is loaded)."""
        return Dataset(
            self.name, [self.samples[i] for i in indices], list(self.classes), self.prompt_template, self.source
        )

    def sample_indices(self, n: int | None, seed: int) -> list[int]:
        """A seeded sample of ``n`` positions, stratified by label, in dataset order (all when ``n`` covers it).

        Never "the first n": a folder sorted by class would give one class only. Each label gets
        its share of ``n`` (largest remainders first, ties by label), drawn without replacement;
        a set without labels is drawn uniformly.
        """
        size = len(self.samples)
        if n is None or n >= size:
            return list(range(size))
        rng = np.random.default_rng([seed, 0x5A3D])
        strata: dict[str, list[int]] = {}
        for i, s in enumerate(self.samples):
            strata.setdefault(s.label or "", []).append(i)
        keys = sorted(strata)
        exact = {k: n * len(strata[k]) / size for k in keys}
        quota = {k: int(exact[k]) for k in keys}
        spare = n - sum(quota.values())
        for k in sorted(keys, key=lambda k: (-(exact[k] - quota[k]), k))[:spare]:
            quota[k] += 1
        chosen: list[int] = []
        for k in keys:
            members = strata[k]
            picked = rng.choice(len(members), size=quota[k], replace=False)
            chosen += [members[int(j)] for j in picked]
        return sorted(chosen)

    def sample(self, n: int | None, seed: int) -> Dataset:
        """:meth:`sample_indices` as a dataset (the same object when every sample is kept)."""
        if n is None or n >= len(self.samples):
            return self
        return self.select(self.sample_indices(n, seed))

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
