"""The task losses white-box attacks maximise, each built on a target's differentiable path.

- zero-shot classification: cross-entropy of the true class over the class-prompt embeddings;
- image-text retrieval: the image embedding pushed away from its caption (untargeted) or towards
  a wrong caption (targeted);
- OCR: CTC loss of the true transcription, for recognisers that give per-frame log-probabilities
  in torch (PP-OCR here runs on ONNX Runtime, so it is attacked black-box);
- generative VLMs: negative log-likelihood of the correct answer's tokens through the model's own
  forward (teacher forcing), with the pixels replaced by the differentiable ones.

Every loss maps images ``(B, 3, H, W)`` in [0, 1] to a per-sample loss ``(B,)`` (higher = the
attack is winning), the :data:`~mmchaos.attacks.gradient.LossFn` shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from mmchaos._lazy import require
from mmchaos.attacks.gradient import LossFn
from mmchaos.attacks.preprocess import ImagePath

__all__ = [
    "answer_nll_loss",
    "ctc_loss",
    "embedding_shift_loss",
    "retrieval_loss",
    "unit_tensor",
    "zero_shot_logits",
    "zero_shot_loss",
]

Tensor = Any


def unit_tensor(embeddings: npt.NDArray[np.float32] | Tensor, device: str = "cpu") -> Tensor:
    """Row-normalised float32 tensor of embeddings (from the target's public API or a tensor)."""
    torch = require("torch")
    t: Any = embeddings if hasattr(embeddings, "detach") else torch.from_numpy(np.asarray(embeddings, np.float32))
    t = t.to(device).float()
    return t / t.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def zero_shot_logits(path: ImagePath, x: Tensor, class_emb: Tensor) -> Tensor:
    feats = path.features(x)
    feats = feats / feats.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return path.logit_scale * feats @ class_emb.T


def zero_shot_loss(path: ImagePath, class_emb: Tensor, labels: Sequence[int], kind: str = "margin") -> LossFn:
    """Untargeted zero-shot loss: ``ce`` (cross-entropy of the true class) or ``margin`` (best
    wrong logit minus the true one, Carlini-Wagner).

    Cross-entropy saturates on a confident model (softmax of the wrong classes underflows, the
    gradient vanishes: gradient masking by the loss itself); the margin never does, so it is the
    default.
    """
    torch = require("torch")
    functional = require("torch.nn.functional")
    truth = torch.tensor(list(labels), dtype=torch.int64, device=class_emb.device)

    def ce(x: Tensor) -> Tensor:
        return functional.cross_entropy(zero_shot_logits(path, x, class_emb), truth, reduction="none")

    def margin(x: Tensor) -> Tensor:
        logits = zero_shot_logits(path, x, class_emb)
        true = logits.gather(1, truth[:, None])[:, 0]
        wrong = logits.scatter(1, truth[:, None], float("-inf")).amax(dim=1)
        return wrong - true

    if kind not in ("ce", "margin"):
        raise ValueError(f"zero-shot loss is 'ce' or 'margin', not {kind!r}")
    return ce if kind == "ce" else margin


def retrieval_loss(path: ImagePath, caption_emb: Tensor, wrong_emb: Tensor | None = None) -> LossFn:
    """Cosine to the own caption, negated; plus cosine to a wrong caption when one is given."""

    def loss(x: Tensor) -> Tensor:
        feats = path.features(x)
        feats = feats / feats.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        out = -(feats * caption_emb).sum(dim=-1)
        if wrong_emb is not None:
            out = out + (feats * wrong_emb).sum(dim=-1)
        return out

    return loss


def embedding_shift_loss(path: ImagePath, clean_emb: Tensor) -> LossFn:
    """Task-free: push the image embedding away from its clean one (transfer attacks use it on a
    surrogate when the target's task has no labels the surrogate knows)."""

    def loss(x: Tensor) -> Tensor:
        feats = path.features(x)
        feats = feats / feats.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        return -(feats * clean_emb).sum(dim=-1)

    return loss


def ctc_loss(log_probs_fn: Callable[[Tensor], Tensor], targets: Sequence[Sequence[int]], blank: int = 0) -> LossFn:
    """CTC loss of the true label sequences under a recogniser's per-frame log-probabilities.

    ``log_probs_fn`` maps images to ``(B, T, C)`` log-softmax outputs (the torch recogniser's head).
    """
    torch = require("torch")
    functional = require("torch.nn.functional")
    flat = torch.tensor([t for seq in targets for t in seq], dtype=torch.int64)
    target_lengths = torch.tensor([len(seq) for seq in targets], dtype=torch.int64)

    def loss(x: Tensor) -> Tensor:
        lp = log_probs_fn(x)
        lengths = torch.full((lp.shape[0],), lp.shape[1], dtype=torch.int64)
        return functional.ctc_loss(
            lp.permute(1, 0, 2), flat, lengths, target_lengths, blank=blank, reduction="none", zero_infinity=True
        )

    return loss


def answer_nll_loss(model: Any, inputs: dict[str, Any], answer_ids: Sequence[int], pixels_fn: LossFn) -> LossFn:
    """Negative log-likelihood of ``answer_ids`` after the prompt ``inputs`` (one request, batch 1).

    ``inputs`` are the processor's model inputs for the prompt and image; ``pixels_fn`` maps the
    attacked image ``(1, 3, H, W)`` in [0, 1] to the model's ``pixel_values`` (the differentiable
    image preprocessing). The answer is appended to the prompt and scored by teacher forcing.
    """
    torch = require("torch")
    functional = require("torch.nn.functional")
    ids = inputs["input_ids"]
    answer = torch.tensor([list(answer_ids)], dtype=ids.dtype, device=ids.device)
    full = torch.cat([ids, answer], dim=1)
    mask = torch.ones_like(full)
    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask", "pixel_values")}
    start = int(ids.shape[1])

    def loss(x: Tensor) -> Tensor:
        out = model(input_ids=full, attention_mask=mask, pixel_values=pixels_fn(x), **extra)
        logits = out.logits[:, start - 1 : -1, :].float()
        nll = functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), answer.reshape(-1), reduction="none")
        return nll.view(answer.shape).mean(dim=1).expand(x.shape[0])

    return loss
