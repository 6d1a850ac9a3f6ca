"""What the attack work units share: the worker they run on, the plan naming the attacked samples,
same-shape batches, and images as JSON values (a unit result in the run store's journal)."""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from mmchaos.data.base import Dataset
from mmchaos.targets.base import Target

__all__ = ["ImageArray", "SampledPlan", "UnitWorker", "batches", "by_shape", "decode_image", "encode_image"]

ImageArray = npt.NDArray[np.uint8]
T = TypeVar("T")


class UnitWorker(Protocol):
    """What a unit runs against: a loaded target and dataset, and a memo of what units share.

    :class:`mmchaos.executors.Worker` is one; the attacks name only what they use, so they stay
    below the execution layer that runs them.
    """

    @property
    def target(self) -> Target: ...

    @property
    def dataset(self) -> Dataset: ...

    def memo(self, key: str, make: Callable[[], T]) -> T: ...


def by_shape(images: Sequence[ImageArray]) -> list[list[int]]:
    """Indices of same-shape images, in first-seen order (attacks batch one shape at a time)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, image in enumerate(images):
        groups.setdefault(tuple(np.asarray(image).shape), []).append(i)
    return list(groups.values())


def batches(groups: list[list[int]], size: int) -> list[list[int]]:
    """Same-shape groups cut into batches of at most ``size`` (the attack batches, in a fixed order)."""
    return [group[s : s + size] for group in groups for s in range(0, len(group), size)]


@dataclass(frozen=True)
class SampledPlan:
    """Base of the attack checks' unit plans (sent once per map): the run seed, the check, and the
    attacked samples as positions in the run's dataset, from which a worker rebuilds the set."""

    check_id: str
    seed: int
    indices: tuple[int, ...]

    @property
    def key(self) -> str:
        """Names what a worker memoises for this plan (the set, a text cache, the image path)."""
        words = f"{type(self).__name__}|{self.check_id}|{self.seed}|{self.indices}"
        return hashlib.sha256(words.encode()).hexdigest()[:16]

    def data(self, worker: UnitWorker) -> Dataset:
        """The attacked samples, selected once per worker."""
        return worker.memo(f"{self.key}/data", lambda: worker.dataset.select(self.indices))


def encode_image(image: ImageArray) -> dict[str, Any]:
    """A uint8 image as JSON values (a unit result in the run store), exact bytes."""
    a = np.ascontiguousarray(image, dtype=np.uint8)
    return {"shape": list(a.shape), "z": base64.b64encode(zlib.compress(a.tobytes(), 6)).decode("ascii")}


def decode_image(body: dict[str, Any]) -> ImageArray:
    raw = zlib.decompress(base64.b64decode(body["z"]))
    out: ImageArray = np.frombuffer(raw, dtype=np.uint8).reshape(tuple(body["shape"])).copy()
    return out
