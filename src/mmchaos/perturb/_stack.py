"""Image kernels that work on a whole ``(N, H, W, 3)`` stack: the batched path of pointwise and noise kernels.

A :class:`StackKernel` defines its work once, on stacks; ``apply`` on one image is a stack of
one, so the batched and per-image paths give the same bytes by construction. Stacks are cut
into chunks of about :data:`CHUNK_VALUES` values (float32 temporaries stay in the L2 cache;
a 64-image stack of 224 x 224 images done in one pass was slower than the per-image loop) and
into groups of items whose parameters named in ``KEYS`` agree (one group for a batch sampled at
one severity).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mmchaos.perturb.base import ImageArray, ImagePerturbation, param_groups

CHUNK_VALUES = 1 << 18


def rows(stack: Any) -> Any:
    """An ``(N, H, W, C)`` stack as one ``(N * H, W, C)`` image, the layout OpenCV takes (a view)."""
    return stack.reshape(-1, *stack.shape[2:])


class StackKernel(ImagePerturbation):
    """An image perturbation whose kernel takes a stack of items that share the ``KEYS`` parameters."""

    stack_kernel = True
    KEYS: tuple[str, ...] = ()

    def kernel(self, images: ImageArray, params: Sequence[dict[str, Any]]) -> Any:
        """``(n, H, W, 3)`` uint8 in; the perturbed values, of any shape holding ``n * H * W * 3`` uint8."""
        raise NotImplementedError

    def apply(self, item: ImageArray, params: dict[str, Any]) -> ImageArray:
        out: ImageArray = self.apply_stack(item[None], [params])[0]
        return out

    def apply_batch(self, batch: Sequence[ImageArray], params: Sequence[dict[str, Any]]) -> list[ImageArray]:
        # Items of over half a chunk are a chunk each in apply_stack, which then only copies them
        # into a stack and out of its result: each runs alone instead (the same kernel calls, the
        # same bytes; a third of brightness' time at 224 x 224 was those two copies).
        if len(batch) > 1 and all(isinstance(item, np.ndarray) and 2 * item.size > CHUNK_VALUES for item in batch):
            return [self._apply_any_layout(item, p) for item, p in zip(batch, params, strict=True)]
        return super().apply_batch(batch, params)

    def apply_stack(self, stack: ImageArray, params: Sequence[dict[str, Any]]) -> ImageArray:
        per_item = max(1, int(np.prod(stack.shape[1:])))
        step = max(1, CHUNK_VALUES // per_item)
        if len(stack) <= step and len(param_groups(params, *self.KEYS)) == 1:
            only: ImageArray = np.asarray(self.kernel(stack, params), dtype=np.uint8).reshape(stack.shape)
            return only
        out = np.empty_like(stack)
        for start in range(0, len(stack), step):
            chunk = list(params[start : start + step])
            for idx, _ in param_groups(chunk, *self.KEYS):
                # The usual single group is a slice: a view of the stack, not a gathered copy.
                at: Any = slice(start, start + len(chunk)) if isinstance(idx, slice) else start + idx
                group = chunk if isinstance(idx, slice) else [chunk[int(i)] for i in idx]
                values = np.asarray(self.kernel(stack[at], group), dtype=np.uint8)
                out[at] = values.reshape(len(group), *stack.shape[1:])
        return out
