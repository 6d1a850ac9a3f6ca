"""Fakes for the streaming sweep and executor tests: a target that kills its own process (a driver
dying mid-check, for real), and datasets that count the images alive at once."""

from __future__ import annotations

import os
import signal
import sys
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from mmchaos.data.base import Dataset, Sample
from mmchaos.targets.base import Target
from tests.fakes.broken_targets import ContractSafeTarget
from tests.fakes.targets import HashEmbedTarget


class DyingTarget(HashEmbedTarget):
    """The correct hash-embed target, except that the process it lives in is SIGKILLed at the
    ``MMCHAOS_TEST_DIE_AFTER``-th image call (unset: never): a driver killed mid-sweep."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        self.calls += 1
        after = os.environ.get("MMCHAOS_TEST_DIE_AFTER")
        if after is not None and self.calls >= int(after):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().embed_images(images)


def dying() -> Target:
    return DyingTarget()


@dataclass
class LiveImages:
    """How many decoded images are alive now, and the most there ever were."""

    now: int = 0
    peak: int = 0

    def born(self, image: np.ndarray) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)
        weakref.finalize(image, self._died)

    def _died(self) -> None:
        self.now -= 1


@dataclass
class CountingSample(Sample):
    """A sample that decodes a fresh image on every load and counts it while it lives."""

    live: LiveImages = field(default_factory=LiveImages)

    def load_image(self) -> np.ndarray:
        image = super().load_image().copy()
        self.live.born(image)
        return image


def counting(data: Dataset, live: LiveImages) -> Dataset:
    """``data`` with every sample counting its decoded images in ``live``."""
    samples = [
        CountingSample(s.id, s.image, s.image_path, s.caption, s.label, s.text, dict(s.meta), s.question, s.answer,
                       live=live)
        for s in data
    ]  # fmt: skip
    return Dataset(data.name, list(samples), list(data.classes), data.prompt_template, data.source)


def sorted_class_folder(root: Path, classes: dict[str, tuple[int, int, int]], per_class: int) -> Path:
    """``root/<class>/<nnn>.png``, each class a flat colour: a folder in the order users keep them."""
    for name, colour in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            img = np.zeros((16, 16, 3), np.uint8) + np.array(colour, np.uint8)
            img[i % 16, :, :] = 255 - img[i % 16, :, :]  # each file its own bytes
            Image.fromarray(img).save(root / name / f"{i:03d}.png")
    return root


class KillsTheDriverFromAWorker(ContractSafeTarget):
    """Correct, but with ``MMCHAOS_TEST_KILL_PARENT_AT=N`` set, its ``N``-th call in an isolated worker
    process (a ``python -c`` interpreter) SIGKILLs the worker's parent: the driver of a local run,
    killed mid-way through the cross-process batches of ``determinism`` (resume tests)."""

    uri = "py:tests.fakes.sweep:kills_the_driver_from_a_worker"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def _count(self) -> None:
        at = os.environ.get("MMCHAOS_TEST_KILL_PARENT_AT")
        if at is None or sys.argv[:1] != ["-c"]:
            return
        self.calls += 1
        if self.calls >= int(at):
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(5)

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        self._count()
        return super().embed_images(images)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        self._count()
        return super().embed_texts(texts)


def kills_the_driver_from_a_worker() -> Target:
    return KillsTheDriverFromAWorker()
