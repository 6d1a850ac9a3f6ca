"""What a perturbation is: a seeded parameter sampler plus a pure kernel.

``sample`` draws each item's parameters from a ``numpy.random.Generator``; ``apply`` is a pure
function of (item, parameters). Calling a perturbation returns the perturbed batch and a
:class:`Applied` record; ``replay(batch, record)`` gives the same bytes again. Randomness that is
too large to record (noise fields) is recorded as an integer seed that the kernel expands.

Severity 0 is the clean input: every perturbation returns the batch unchanged (copies) with an
empty record, so a sweep can treat "clean" as one more severity. Severities 1-5 follow the
perturbation's table.

Perturbations that need context (the target under test, the class names) receive it through
:meth:`Perturbation.bind`; every other perturbation ignores it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, Self, TypeVar, overload

import numpy as np
import numpy.typing as npt

from mmchaos.errors import ConfigError

if TYPE_CHECKING:
    from mmchaos.targets.base import Target

__all__ = [
    "GROUPS",
    "SEVERITIES",
    "Applied",
    "BindContext",
    "ImagePerturbation",
    "Modality",
    "MultimodalPerturbation",
    "MultimodalSample",
    "Perturbation",
    "TargetAwarePerturbation",
    "TextConstraint",
    "TextPerturbation",
]

ImageArray = npt.NDArray[np.uint8]
Item = TypeVar("Item")
SEVERITIES = (1, 2, 3, 4, 5)
GROUPS = (
    "noise",
    "blur",
    "weather",
    "digital",
    "deployment",
    "typographic",
    "text-char",
    "text-word",
    "multimodal",
)


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


@dataclass(frozen=True)
class BindContext:
    """What a context-aware perturbation may use: the target under test and the dataset's classes."""

    target: Target | None = None
    labels: tuple[str, ...] = ()
    prompt_template: str = "{}"


@dataclass(frozen=True, eq=False)
class MultimodalSample:
    """One multimodal input; a perturbation touches the fields it knows and keeps the others.

    ``boxes`` are ``(x0, y0, x1, y1)`` pixel coordinates; ``frames`` a sequence of images in time
    order.
    """

    image: ImageArray | None = None
    text: str | None = None
    frames: tuple[ImageArray, ...] | None = None
    boxes: tuple[tuple[float, float, float, float], ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def same_as(self, other: MultimodalSample) -> bool:
        """Bytewise equality (dataclass ``==`` cannot compare arrays)."""
        return (
            _same_array(self.image, other.image)
            and self.text == other.text
            and self.boxes == other.boxes
            and (self.frames is None) == (other.frames is None)
            and all(_same_array(a, b) for a, b in zip(self.frames or (), other.frames or (), strict=True))
        )


def _same_array(a: ImageArray | None, b: ImageArray | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def check_severity(severity: object) -> int:
    if isinstance(severity, bool) or not isinstance(severity, int | np.integer) or not 0 <= int(severity) <= 5:
        raise ConfigError(f"severity must be one of 0-5 (0 = clean), got {severity!r}", code="bad_severity")
    return int(severity)


class Perturbation(Generic[Item]):
    """Base class; subclasses set the class attributes and implement ``sample`` and ``apply``."""

    name: ClassVar[str] = ""
    modality: ClassVar[Modality]
    group: ClassVar[str] = ""
    source: ClassVar[str] = "mmchaos"
    expects_change: ClassVar[bool] = False
    """A sensitivity probe: the meaning changes, so a good model's answer *should* change."""
    removes_content: ClassVar[bool] = False
    """Destroys what it hits (a missing modality): judge the items it left intact, not the hit ones."""
    preserves_shape: ClassVar[bool] = True
    item_type: ClassVar[type | tuple[type, ...]] = object

    def sample(self, item: Item, severity: int, rng: np.random.Generator) -> dict[str, Any]:
        """Draw the parameters for one item at ``severity`` (1-5)."""
        raise NotImplementedError

    def sample_batch(self, batch: Sequence[Item], severity: int, rng: np.random.Generator) -> list[dict[str, Any]]:
        """Parameters for every item; override when items depend on each other (mismatch, ghosting)."""
        return [self.sample(item, severity, rng) for item in batch]

    def apply(self, item: Item, params: dict[str, Any]) -> Item:
        """Pure kernel: the same (item, params) always gives the same output."""
        raise NotImplementedError

    def apply_batch(self, batch: Sequence[Item], params: Sequence[dict[str, Any]]) -> list[Item]:
        return [self.apply(item, p) for item, p in zip(batch, params, strict=True)]

    def bind(self, context: BindContext) -> Self:
        """Give the perturbation the target and class names; most perturbations need neither."""
        return self

    def hit(self, params: dict[str, Any]) -> bool:
        """Whether the item with these parameters was changed at all (see ``removes_content``)."""
        return True

    @overload
    def __call__(
        self, batch: npt.NDArray[Any], severity: int = 3, rng: np.random.Generator | int | None = None
    ) -> tuple[npt.NDArray[Any], Applied]: ...

    @overload
    def __call__(
        self, batch: Sequence[Item], severity: int = 3, rng: np.random.Generator | int | None = None
    ) -> tuple[list[Item], Applied]: ...

    def __call__(
        self, batch: Sequence[Item] | npt.NDArray[Any], severity: int = 3, rng: np.random.Generator | int | None = None
    ) -> tuple[list[Item] | npt.NDArray[Any], Applied]:
        """Perturb a batch: a list of items, or (images) a stacked ``(N, H, W[, C])`` array.

        A stacked array comes back stacked; a list comes back a list.
        """
        severity = check_severity(severity)
        items = self._items(batch)
        if severity == 0:
            clean = [copy.copy(item) for item in items]
            return self._same_kind(batch, clean), Applied(self.name, 0, tuple({} for _ in items))
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        params = self.sample_batch(items, severity, gen)
        return self._same_kind(batch, self.apply_batch(items, params)), Applied(self.name, severity, tuple(params))

    @overload
    def replay(self, batch: npt.NDArray[Any], applied: Applied) -> npt.NDArray[Any]: ...

    @overload
    def replay(self, batch: Sequence[Item], applied: Applied) -> list[Item]: ...

    def replay(self, batch: Sequence[Item] | npt.NDArray[Any], applied: Applied) -> list[Item] | npt.NDArray[Any]:
        if applied.name != self.name:
            raise ConfigError(f"record is for {applied.name!r}, not {self.name!r}", code="replay_mismatch")
        if len(applied.items) != len(batch):
            raise ConfigError(
                f"record holds {len(applied.items)} items, the batch {len(batch)}", code="replay_mismatch"
            )
        items = self._items(batch)
        if check_severity(applied.severity) == 0:
            return self._same_kind(batch, [copy.copy(item) for item in items])
        return self._same_kind(batch, self.apply_batch(items, applied.items))

    def _items(self, batch: Sequence[Item] | npt.NDArray[Any]) -> list[Item]:
        """The batch as a list of items; a stacked array is accepted where :meth:`_stackable` says."""
        if isinstance(batch, np.ndarray) and self._stackable(batch):
            items: list[Item] = list(batch)
        elif isinstance(batch, str | bytes | np.ndarray):
            raise ConfigError(f"{self.name}: give a batch (a list of items), not one item", code="bad_batch")
        else:
            items = list(batch)
        for item in items:
            if not isinstance(item, self.item_type):
                raise ConfigError(
                    f"{self.name} perturbs {self.modality} items, got {type(item).__name__}", code="bad_item_type"
                )
        return items

    def _stackable(self, batch: npt.NDArray[Any]) -> bool:
        """Whether ``batch`` is a stack of items (only image perturbations take one)."""
        return False

    def _same_kind(self, batch: object, out: list[Item]) -> list[Item] | npt.NDArray[Any]:
        """``out`` as the caller gave the batch: stacked again for a stacked array."""
        if not isinstance(batch, np.ndarray):
            return out
        arrays = [np.asarray(o) for o in out]
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise ConfigError(
                f"{self.name} gave items of different shapes {sorted(shapes)}, which do not stack; "
                "give the batch as a list to get a list back",
                code="unstackable_output",
            )
        if not arrays:
            return batch.copy()
        whole: npt.NDArray[Any] | None = _whole_stack(arrays)
        if whole is None or np.may_share_memory(whole, batch):  # never hand the caller's input back
            return np.stack(arrays)
        return whole

    @classmethod
    def summary(cls) -> str:
        doc = (cls.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""


class ImagePerturbation(Perturbation[ImageArray]):
    """Kernels see RGB ``(H, W, 3)`` uint8; grayscale and RGBA are adapted around them.

    Grayscale runs as three equal channels and comes back as the first one. RGBA keeps its alpha
    channel (the corruptions model the camera and the codec, not transparency), except that a
    perturbation that moves pixels moves the alpha with them (:meth:`transform_alpha`).
    """

    modality = Modality.IMAGE
    item_type = np.ndarray

    def _stackable(self, batch: npt.NDArray[Any]) -> bool:
        # (N, H, W, C): a stack of pictures; (H, W, C) and (H, W) stay "one item" (ambiguous).
        return batch.ndim == 4

    stack_kernel: ClassVar[bool] = False
    """Whether :meth:`apply_stack` does a whole batch in one vectorised pass (pointwise and noise kernels)."""

    def apply_batch(self, batch: Sequence[ImageArray], params: Sequence[dict[str, Any]]) -> list[ImageArray]:
        if self.stack_kernel and len(batch) > 1:
            stack = rgb_stack(batch)
            if stack is not None:
                return list(self.apply_stack(stack, params))
        return [self._apply_any_layout(item, p) for item, p in zip(batch, params, strict=True)]

    def apply_stack(self, stack: ImageArray, params: Sequence[dict[str, Any]]) -> ImageArray:
        """``(N, H, W, 3)`` uint8 in and out, each item exactly as :meth:`apply` makes it.

        Kernels that set ``stack_kernel`` override this and define ``apply`` as a stack of one,
        so the batched and the per-image paths cannot drift apart.
        """
        return np.stack([self.apply(item, p) for item, p in zip(stack, params, strict=True)])

    def transform_alpha(self, alpha: ImageArray, params: dict[str, Any]) -> ImageArray:
        """The alpha channel ``(H, W)`` after the perturbation; unchanged unless pixels move."""
        return alpha

    def _apply_any_layout(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        if not isinstance(item, np.ndarray) or item.dtype != np.uint8:
            got = item.dtype if isinstance(item, np.ndarray) else type(item).__name__
            raise ConfigError(f"{self.name}: images must be uint8 arrays, got {got}", code="image_bad_dtype")
        if item.ndim == 2:
            return self._gray(item, params)
        if item.ndim == 3 and item.shape[2] == 1:
            return self._gray(item[..., 0], params)[..., None]
        if item.ndim == 3 and item.shape[2] == 4:
            rgb = self.apply(np.ascontiguousarray(item[..., :3]), params)
            alpha = self.transform_alpha(np.ascontiguousarray(item[..., 3]), params)
            return np.ascontiguousarray(np.concatenate([rgb, alpha[..., None]], axis=2))
        if item.ndim == 3 and item.shape[2] == 3:
            return self.apply(np.ascontiguousarray(item), params)
        raise ConfigError(f"{self.name}: unsupported image shape {item.shape}", code="image_bad_shape")

    def _gray(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        out = self.apply(np.ascontiguousarray(np.repeat(item[..., None], 3, axis=2)), params)
        return np.ascontiguousarray(out[..., 0])


class GeometricMixin:
    """For perturbations that move pixels: the alpha channel goes through the same kernel."""

    def transform_alpha(self, alpha: ImageArray, params: dict[str, Any]) -> ImageArray:
        rgb = np.ascontiguousarray(np.repeat(alpha[..., None], 3, axis=2))
        out: ImageArray = self.apply(rgb, params)  # type: ignore[attr-defined]
        return np.ascontiguousarray(out[..., 0])


class TargetAwarePerturbation(ImagePerturbation):
    """An image perturbation that asks the target under test where to strike.

    The robustness check calls :meth:`bind` before sweeping; unbound, the perturbation must
    still work (from the CLI, say), using a target-free fallback it documents. What the target
    said is recorded in the parameters, so replay never needs the target.
    """

    def __init__(self) -> None:
        self.context = BindContext()

    def bind(self, context: BindContext) -> Self:
        self.context = context
        return self

    @property
    def target(self) -> Target | None:
        return self.context.target


class TextConstraint(Protocol):
    """Decides which draws of a text perturbation are acceptable (e.g. :class:`.meaning.MeaningKept`)."""

    def sample(
        self, perturbation: TextPerturbation, batch: Sequence[str], severity: int, rng: np.random.Generator
    ) -> list[dict[str, Any]]: ...


class TextPerturbation(Perturbation[str]):
    """Texts in, texts out, optionally under a constraint (see :meth:`constrained`)."""

    modality = Modality.TEXT
    item_type = str
    constraint: TextConstraint | None = None

    def constrained(self, constraint: TextConstraint | None) -> Self:
        """A copy whose draws must satisfy ``constraint``; sensitivity probes ignore it."""
        clone = copy.copy(self)
        clone.constraint = constraint
        return clone

    def sample_batch(self, batch: Sequence[str], severity: int, rng: np.random.Generator) -> list[dict[str, Any]]:
        if self.constraint is not None and not self.expects_change:
            return self.constraint.sample(self, batch, severity, rng)
        return self.draw_batch(batch, severity, rng)

    def draw_batch(self, batch: Sequence[str], severity: int, rng: np.random.Generator) -> list[dict[str, Any]]:
        """Unconstrained parameters for every item."""
        return super().sample_batch(batch, severity, rng)


class MultimodalPerturbation(Perturbation[MultimodalSample]):
    """Works on :class:`MultimodalSample` items; ``needs`` names the fields it requires."""

    modality = Modality.MULTIMODAL
    item_type = MultimodalSample
    group = "multimodal"
    needs: ClassVar[frozenset[str]] = frozenset()

    def usable(self, sample: MultimodalSample) -> bool:
        return all(getattr(sample, f) is not None for f in self.needs)


def rgb_stack(items: Sequence[Any]) -> ImageArray | None:
    """The items as one ``(N, H, W, 3)`` uint8 array, or None when they are not all such images.

    Items that are consecutive rows of one contiguous stack (a stacked batch split by
    ``list()``) give that stack back without a copy.
    """
    first = items[0]
    if not isinstance(first, np.ndarray) or first.dtype != np.uint8 or first.ndim != 3 or first.shape[2] != 3:
        return None
    for item in items:
        if not isinstance(item, np.ndarray) or item.dtype != np.uint8 or item.shape != first.shape:
            return None
    whole = _whole_stack(items)
    return whole if whole is not None else np.stack(items)


def _whole_stack(items: Sequence[Any]) -> npt.NDArray[Any] | None:
    """``items`` as one ``(N, *shape)`` array without a copy when they are consecutive blocks of one
    contiguous buffer (the rows of a stack, even one a kernel made as ``(N * H, W, C)``), else None."""
    first = items[0]
    base = first.base
    if not isinstance(base, np.ndarray) or not base.flags.c_contiguous or not first.flags.c_contiguous:
        return None
    if base.size != len(items) * first.size or base.dtype != first.dtype or base.ctypes.data != first.ctypes.data:
        return None
    step = first.nbytes
    for k, item in enumerate(items):
        if item.base is not base or item.shape != first.shape or item.ctypes.data != base.ctypes.data + k * step:
            return None
        if not item.flags.c_contiguous:
            return None
    whole: npt.NDArray[Any] = base.reshape(len(items), *first.shape)
    return whole


def param_groups(params: Sequence[dict[str, Any]], *keys: str) -> list[tuple[Any, dict[str, Any]]]:
    """Items that share the values of ``keys``: ``(index, params of the first)`` pairs.

    The index is ``slice(None)`` when the whole batch agrees (the usual case: one severity), so
    a stack kernel works on the stack itself instead of a gathered copy.
    """
    first = params[0]
    if all(all(p[k] == first[k] for k in keys) for p in params):
        return [(slice(None), first)]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault(tuple(repr(p[k]) for k in keys), []).append(i)
    return [(np.asarray(idx), params[idx[0]]) for idx in groups.values()]


def severity_value(table: Sequence[Any], severity: int) -> Any:
    return table[severity - 1]


def as_u8(image: Any) -> ImageArray:
    """An OpenCV result (already uint8) typed as an image array; no copy."""
    return np.asarray(image, dtype=np.uint8)


def draw_seed(rng: np.random.Generator) -> int:
    return int(rng.integers(0, 2**31 - 1))
