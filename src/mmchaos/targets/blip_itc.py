"""BLIP's image-text retrieval checkpoint as a contrastive model: its ITC head.

``BlipForImageTextRetrieval`` has no ``get_image_features``/``get_text_features``, and
``AutoModel`` loads its checkpoint as ``BlipModel``, whose text tower and projections the checkpoint
does not hold (they would be initialised at random). Loaded as the class it was saved as, its
image-text contrastive head is exactly what its ``forward(use_itm_head=False)`` scores: the image
tower's first token through ``vision_proj`` against the text encoder's first token (no
cross-attention to the image) through ``text_proj``. The wrapper gives those two halves the names
the contrastive target calls; the weights are the checkpoint's own, untouched.
"""

from __future__ import annotations

from typing import Any

from mmchaos._lazy import require

__all__ = ["SAVED_AS", "blip_itc"]

SAVED_AS = "BlipForImageTextRetrieval"


def blip_itc(model: Any) -> Any:
    """``model`` (a ``BlipForImageTextRetrieval``) as a module with the ITC head's two halves."""
    torch = require("torch")

    class BlipITC(torch.nn.Module):  # type: ignore[misc, name-defined]
        """The ITC head of a BLIP retrieval model (``forward(use_itm_head=False)``'s features, unnormalised)."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.retrieval = inner
            self.config = inner.config

        def get_image_features(self, pixel_values: Any, **kwargs: Any) -> Any:
            embeds = self.retrieval.vision_model(pixel_values=pixel_values, **kwargs).last_hidden_state
            return self.retrieval.vision_proj(embeds[:, 0, :])

        def get_text_features(self, input_ids: Any, attention_mask: Any = None) -> Any:
            out = self.retrieval.text_encoder(input_ids=input_ids, attention_mask=attention_mask)
            return self.retrieval.text_proj(out.last_hidden_state[:, 0, :])

    return BlipITC(model)
