"""How two targets' answers to the same inputs compare: the measures of deployment parity.

A deployment is judged against its reference (the checkpoint as transformers loads it) on the
same inputs: embedding cosine, greedy tokens (vLLM's ``check_logprobs_close`` judgement where
top-k logprobs exist), prompt token counts and how each answer ended. Where they part, the
candidate causes are tested by feeding the reference what a broken pipeline would feed its model:
channel-swapped images, or images re-normalised with another mean/std. A deployment that agrees
with the reference fed one of those, and not with the reference fed the originals, names its bug.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from mmchaos.targets.generation import Completion, GenerationResult

__all__ = [
    "NORMALISATIONS",
    "ImageVariant",
    "TokenComparison",
    "compare_tokens",
    "cosines",
    "image_variants",
    "logprob_deviations",
    "renormalised",
    "swapped_channels",
]

ImageArray = npt.NDArray[np.uint8]
Triple = tuple[float, float, float]

NORMALISATIONS: dict[str, tuple[Triple, Triple]] = {
    "ImageNet mean/std": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "CLIP mean/std": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
    "mean/std 0.5 (scaled to [-1, 1])": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "no normalisation (mean 0, std 1)": ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
}
"""The mean/std pairs pipelines commonly use, wrongly or not: the candidates a deployment is tested against."""


def cosines(a: npt.ArrayLike, b: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Row-wise cosine of two ``(N, D)`` arrays (NaN for a zero row; -1 for rows of different width)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape:
        return np.full(len(x), -1.0)
    denom = np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1)
    return np.where(denom > 0, (x * y).sum(axis=1) / np.where(denom > 0, denom, 1.0), np.nan)


def swapped_channels(images: Sequence[ImageArray]) -> list[ImageArray]:
    """RGB <-> BGR: what a model sees from a pipeline that feeds it OpenCV's channel order."""
    return [np.ascontiguousarray(i[..., ::-1]) for i in images]


def renormalised(
    images: Sequence[ImageArray], reference: tuple[Triple, Triple], used: tuple[Triple, Triple]
) -> list[ImageArray]:
    """The pixels that, normalised with the ``reference`` mean/std, give what ``used`` gives the originals.

    A deployment normalising ``x`` with ``(m', s')`` feeds its model ``(x/255 - m') / s'``; the
    reference (``(m, s)``) is fed that when given ``255 * (m + s * (x/255 - m') / s')``, clipped to
    the uint8 range (exact for the common pairs: the values stay inside it).
    """
    (m, s), (m2, s2) = (
        (np.asarray(v, dtype=np.float64) for v in reference),
        (np.asarray(v, dtype=np.float64) for v in used),
    )
    out = []
    for img in images:
        x = img.astype(np.float64) / 255.0
        y = 255.0 * (m + s * (x - m2) / s2)
        out.append(np.clip(np.rint(y), 0, 255).astype(np.uint8))
    return out


@dataclass(frozen=True)
class ImageVariant:
    """A candidate cause: its name, the fix to suggest, and what it makes of the clean images."""

    name: str
    fix: str
    transform: Callable[[Sequence[ImageArray]], list[ImageArray]]


def image_variants(reference_norm: tuple[Triple, Triple] | None) -> list[ImageVariant]:
    """The candidate image-pipeline bugs: channel order, and each other common normalisation
    (only with the reference's own mean/std known)."""
    variants = [
        ImageVariant(
            "channel order swapped (BGR fed as RGB)",
            "convert to RGB before preprocessing (cv2.cvtColor(img, cv2.COLOR_BGR2RGB), or PIL's .convert('RGB'))",
            swapped_channels,
        )
    ]
    if reference_norm is None:
        return variants
    for name, pair in NORMALISATIONS.items():
        if np.allclose(np.asarray(pair), np.asarray(reference_norm), atol=2e-3):
            continue  # the reference's own normalisation is not a candidate bug

        def renorm(images: Sequence[ImageArray], pair: tuple[Triple, Triple] = pair) -> list[ImageArray]:
            return renormalised(images, reference_norm, pair)

        ref = " / ".join(", ".join(f"{v:.3g}" for v in part) for part in reference_norm)
        variants.append(
            ImageVariant(f"wrong normalisation ({name})", f"normalise with the checkpoint's mean/std ({ref})", renorm)
        )
    return variants


@dataclass(frozen=True)
class TokenComparison:
    """Two greedy completions token by token, judged as vLLM's ``check_logprobs_close`` does.

    ``first_divergence`` is the index of the first token that differs (None: equal as far as the
    shorter goes). ``close`` is vLLM's verdict: equal tokens, or at the first divergence each
    side's token is inside the other's top-k logprobs (a near-tie, e.g. fp16 vs fp32); None where
    top-k logprobs are missing on either side (then only token equality is known).
    """

    equal: bool
    first_divergence: int | None
    agreement: float
    close: bool | None
    ended_alike: bool


def _top(c: Completion, i: int) -> Mapping[int, float] | None:
    top = c.top_logprobs
    return top[i] if top is not None and i < len(top) else None


def compare_tokens(a: Completion, b: Completion) -> TokenComparison:
    """Compare two greedy completions (by token ids where both give them, else by words)."""
    x: Sequence[object] = a.token_ids if a.token_ids is not None and b.token_ids is not None else a.text.split()
    y: Sequence[object] = b.token_ids if a.token_ids is not None and b.token_ids is not None else b.text.split()
    same = sum(1 for p, q in zip(x, y, strict=False) if p == q)
    agreement = same / max(len(x), len(y)) if (x or y) else 1.0
    first = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), None)
    if first is None and len(x) != len(y):
        first = min(len(x), len(y))
    equal = first is None
    close: bool | None = True if equal else None
    if not equal and first is not None and first < min(len(x), len(y)):
        top_a, top_b = _top(a, first), _top(b, first)
        if top_a is not None and top_b is not None:
            close = y[first] in top_a and x[first] in top_b
    elif not equal:
        close = False  # one side stopped where the other went on: no logprob makes that a near-tie
    return TokenComparison(equal, first, agreement, close, a.finish_reason == b.finish_reason)


def logprob_deviations(a: GenerationResult, b: GenerationResult) -> list[float]:
    """|chosen-token logprob difference| at each step where both chose the same token (compared by
    token ids where both give them, else by position up to the first divergence); [] without
    logprobs on both sides."""
    x, y = a.completions[0], b.completions[0]
    if x.logprobs is None or y.logprobs is None:
        return []
    n = min(len(x.logprobs), len(y.logprobs))
    if x.token_ids is not None and y.token_ids is not None:
        n = next((i for i, (p, q) in enumerate(zip(x.token_ids, y.token_ids, strict=False)) if p != q), n)
    elif x.text != y.text:
        return []  # without ids, equal texts are the only proof the tokens were the same
    return [abs(float(p) - float(q)) for p, q in zip(x.logprobs[:n], y.logprobs[:n], strict=True)]
