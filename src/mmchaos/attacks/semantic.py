"""Minimal-norm moves of an image embedding across a zero-shot class boundary (DeepFool, then bisection).

The seeds' "semantic perturbation in CLIP space": how far, in pixels, is each image from the
nearest other class? DeepFool (Moosavi-Dezfooli et al. 2016) linearises the zero-shot logits
(cosine of the image embedding to each class prompt's embedding) around the current point and
steps to the nearest linearised boundary among the ``candidates`` closest classes, until the
decision changes; a bisection on the step's length then finds the smallest multiple of that
perturbation that still flips it. The norm found is an upper bound on the true minimal distance
(any attack's is): small values prove fragility, large ones are evidence, not proof, of margin.

Images are attacked in the model's input space before normalisation: pixel values in [0, 1] at
the resolution the target's processor produces (after its resize and crop), so norms are in
those units. A processor that is not differentiable (resize in PIL) is run once on the clean
image; what is attacked is the resized picture, which is what the tower sees.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from mmchaos._lazy import require
from mmchaos.attacks.preprocess import not_pixel_grid

__all__ = ["MarginResult", "Norm", "PixelForward", "deepfool_margins", "pixel_forward"]

Norm = Literal["l2", "linf"]
FloatArray = npt.NDArray[np.float64]


@dataclass
class MarginResult:
    """Per sample: the smallest flipping perturbation found (``inf`` where none was found)."""

    l2: FloatArray
    linf: FloatArray
    flipped_to: npt.NDArray[np.int64]
    """The class each sample was moved to (-1 where it was not flipped)."""
    iterations: npt.NDArray[np.int64]
    deltas: Any
    """The perturbations themselves, ``(N, C, H, W)`` torch tensors in [0, 1] pixel units."""


def _logits(forward: Callable[[Any], Any], x: Any, class_emb: Any) -> Any:
    torch = require("torch")
    feats = torch.nn.functional.normalize(forward(x), dim=-1)
    return feats @ class_emb.T


def deepfool_margins(
    forward: Callable[[Any], Any],
    x0: Any,
    labels: Any,
    class_emb: Any,
    *,
    norm: Norm = "l2",
    max_iter: int = 20,
    overshoot: float = 0.02,
    candidates: int = 5,
    bisection_steps: int = 10,
) -> MarginResult:
    """DeepFool on the zero-shot logits of a batch, refined by bisection on the step length.

    ``forward`` maps pixels in [0, 1] ``(N, C, H, W)`` to image embeddings; ``class_emb`` holds
    the unit class-prompt embeddings ``(K, D)``; ``labels`` the class each image should get.
    Deterministic: no randomness is involved.
    """
    torch = require("torch")
    n = int(x0.shape[0])
    device = x0.device
    labels = labels.to(device=device, dtype=torch.long)
    class_emb = class_emb.to(device)
    rows = torch.arange(n, device=device)
    r_tot = torch.zeros_like(x0)
    active = torch.ones(n, dtype=torch.bool, device=device)
    iterations = torch.zeros(n, dtype=torch.long, device=device)
    k_cand = max(1, min(candidates, int(class_emb.shape[0]) - 1))
    for _ in range(max_iter):
        x = (x0 + (1 + overshoot) * r_tot).clamp(0, 1).detach().requires_grad_(True)
        logits = _logits(forward, x, class_emb)
        active &= logits.argmax(dim=1) == labels
        if not bool(active.any()):
            break
        iterations += active.long()
        others = logits.detach().clone()
        others[rows, labels] = -float("inf")
        cand = others.topk(k_cand, dim=1).indices  # (N, k): the closest other classes
        true_logit = logits[rows, labels]
        best_dist = torch.full((n,), float("inf"), device=device)
        best_step = torch.zeros_like(x0)
        for j in range(k_cand):
            gap = logits[rows, cand[:, j]] - true_logit  # < 0 while the decision holds
            (grad,) = torch.autograd.grad(gap.sum(), x, retain_graph=j < k_cand - 1)
            flat = grad.reshape(n, -1)
            f = gap.detach().abs() + 1e-6
            if norm == "l2":
                size = flat.norm(dim=1).clamp_min(1e-12)
                dist = f / size
                step = (dist / size)[:, None] * flat
            else:
                size = flat.abs().sum(dim=1).clamp_min(1e-12)
                dist = f / size
                step = dist[:, None] * flat.sign()
            better = dist < best_dist
            best_dist = torch.where(better, dist, best_dist)
            best_step[better] = step[better].reshape(best_step[better].shape)
        r_tot = r_tot + best_step * active[:, None, None, None].to(best_step.dtype)
    delta = ((x0 + (1 + overshoot) * r_tot).clamp(0, 1) - x0).detach()
    with torch.no_grad():
        flipped = _logits(forward, x0 + delta, class_emb).argmax(dim=1) != labels
        lo = torch.zeros(n, device=device)
        hi = torch.ones(n, device=device)
        for _ in range(bisection_steps):  # smallest scale of delta that still flips
            mid = (lo + hi) / 2
            pred = _logits(forward, x0 + mid[:, None, None, None] * delta, class_emb).argmax(dim=1)
            moved = pred != labels
            hi = torch.where(moved, mid, hi)
            lo = torch.where(moved, lo, mid)
        final = hi[:, None, None, None] * delta
        to = _logits(forward, x0 + final, class_emb).argmax(dim=1)
    flat = final.reshape(n, -1).double().cpu()
    moved = flipped.cpu().numpy()
    l2 = np.where(moved, flat.norm(dim=1).numpy(), np.inf)
    linf = np.where(moved, flat.abs().amax(dim=1).numpy(), np.inf)
    flipped_to = np.where(moved, to.cpu().numpy(), -1).astype(np.int64)
    return MarginResult(l2.astype(np.float64), linf.astype(np.float64), flipped_to, iterations.cpu().numpy(), final)


@dataclass
class PixelForward:
    """A target's image tower as a function of [0, 1] pixels at its input resolution."""

    forward: Callable[[Any], Any]
    pixels: Callable[[Any], Any]
    """Images (uint8 ``(H, W, 3)`` list) -> ``(N, C, H, W)`` float [0, 1] at the tower's resolution."""
    space: str
    """How the attacked pixels relate to the target's input (for the finding)."""


def pixel_forward(target: Any) -> PixelForward | str:
    """The differentiable path pixels -> image embedding of a white-box target, or why there is none.

    Needs ``torch_module()`` with ``get_image_features`` and a ``preprocess_images`` whose output
    is the tower's ``pixel_values``; the processor's mean/std normalisation is redone in torch, so
    gradients reach the [0, 1] pixels after the processor's (non-differentiable) resize and crop.
    """
    torch = require("torch")
    model = target.torch_module()
    preprocess = getattr(target, "preprocess_images", None)
    if not hasattr(model, "get_image_features") or preprocess is None:
        return "the target's torch module has no get_image_features, or the target no preprocess_images"
    patches = not_pixel_grid(target)
    if patches:
        return patches
    proc = getattr(target, "image_processor", None)
    normalise = bool(getattr(proc, "do_normalize", False))
    mean = torch.tensor(list(getattr(proc, "image_mean", None) or [0.0, 0.0, 0.0]), dtype=torch.float32)
    std = torch.tensor(list(getattr(proc, "image_std", None) or [1.0, 1.0, 1.0]), dtype=torch.float32)
    if not normalise:
        mean, std = torch.zeros_like(mean), torch.ones_like(std)
    rescales = bool(getattr(proc, "do_rescale", True))
    scale = float(getattr(proc, "rescale_factor", 1 / 255)) * 255 if rescales else 255.0
    param = next(iter(model.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    mean, std = mean.view(1, -1, 1, 1).to(device), std.view(1, -1, 1, 1).to(device)

    def forward(x: Any) -> Any:
        out = model.get_image_features(pixel_values=((x * scale - mean) / std).to(device))
        feats = out if hasattr(out, "detach") else getattr(out, "pooler_output", None)
        if feats is None:
            feats = out.image_embeds
        return feats.float()

    def pixels(images: Any) -> Any:
        pv = preprocess(images).detach().to(device).float()
        return ((pv * std + mean) / scale).clamp(0, 1)

    return PixelForward(
        forward,
        pixels,
        "pixels in [0, 1] after the target's own resize and crop (not differentiable, run once), before its "
        "mean/std normalisation (redone in torch)",
    )
