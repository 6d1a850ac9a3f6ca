"""A dynamic-resolution fake VLM that batches for real: one visual token per 14x14 patch of each image.

Like the Qwen2-VL family, an image's token count follows its size and aspect ratio, so a batch of
mixed images has rows of different lengths that must be padded and masked. The answer is read
from the mean of the request's visual tokens (a pooled feature turned into a few tokens), so it
depends on every pixel. ``mask_padding=False`` is the broadcast bug: the pooled mean divides by the
batch's padded length instead of the row's own token count, which is invisible while every image
in the batch has the same size and wrong as soon as a larger image shares the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mmchaos.targets.base import Capability, Fingerprint, Target
from mmchaos.targets.generation import Completion, GenerationParams, GenerationResult, Message, as_messages

_PATCH = 14


def visual_tokens(image: np.ndarray) -> np.ndarray:
    """(patches, 3): the mean colour of each whole 14x14 patch, row-major (at least one patch)."""
    h, w = max(1, image.shape[0] // _PATCH), max(1, image.shape[1] // _PATCH)
    crop = np.asarray(image[: h * _PATCH, : w * _PATCH, :3], dtype=np.float64)
    if crop.shape[0] < _PATCH or crop.shape[1] < _PATCH:
        return crop.reshape(-1, 3).mean(axis=0, keepdims=True)
    return crop.reshape(h, _PATCH, w, _PATCH, 3).mean(axis=(1, 3)).reshape(-1, 3)


class PaddedBatchVLM(Target):
    """Correct: each row's pooled feature divides by its own visual-token count."""

    uri = "py:tests.fakes.batching_vlm:PaddedBatchVLM"
    capabilities = frozenset({Capability.GENERATE})
    mask_padding = True

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[np.ndarray] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        return self.generate_batch([as_messages(prompt, images)], params)[0]

    def generate_batch(
        self, requests: Sequence[str | Sequence[Message]], params: GenerationParams | None = None
    ) -> list[GenerationResult]:
        rows = []
        for request in requests:
            pictures = [img for m in as_messages(request) for img in m.images()]
            rows.append(np.concatenate([visual_tokens(p) for p in pictures]) if pictures else np.zeros((0, 3)))
        width = max(1, max(len(r) for r in rows))
        padded = np.zeros((len(rows), width, 3))
        mask = np.zeros((len(rows), width))
        for i, r in enumerate(rows):
            padded[i, : len(r)], mask[i, : len(r)] = r, 1.0
        counts = mask.sum(axis=1, keepdims=True) if self.mask_padding else np.full((len(rows), 1), float(width))
        pooled = padded.sum(axis=1) / np.maximum(counts, 1.0)
        n = (params or GenerationParams()).max_new_tokens
        return [self._answer(p, n) for p in pooled]

    @staticmethod
    def _answer(pooled: np.ndarray, n: int) -> GenerationResult:
        ids = tuple(int(v) // 8 for v in np.resize(pooled, n))  # a 32-level reading of the pooled colour
        return GenerationResult((Completion(" ".join(map(str, ids)), "length", ids, tuple(0.0 for _ in ids)),))

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(weights=f"padded-batch-{type(self).__name__}")


class UnmaskedPaddingVLM(PaddedBatchVLM):
    """Broken: pads every row to the batch's longest and pools over the padding too."""

    uri = "py:tests.fakes.batching_vlm:UnmaskedPaddingVLM"
    mask_padding = False
