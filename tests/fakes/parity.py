"""Deployments with one real pipeline bug each, and their correct twins, for ``reference_parity``.

Each wraps a real model (a numpy stand-in for the fast tier, the built-in tiny models for the
integration tier) and changes only what a broken serving pipeline changes: the channel order it
feeds, the mean/std it normalises with, the EOS its generation config names.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmchaos.targets.base import Target
from mmchaos.targets.generation import GenerationParams, GenerationResult, Message
from mmchaos.targets.wrappers import DelegatingTarget
from tests.fakes.generative import WordsTarget
from tests.fakes.targets import ShapeColourTarget


class BGRFed(DelegatingTarget):
    """Broken: every image reaches the model in BGR order (an OpenCV decode fed as RGB)."""

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return self.inner.embed_images([np.ascontiguousarray(i[..., ::-1]) for i in images])  # type: ignore[no-any-return]

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[Any] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        return self.inner.generate(prompt, [np.ascontiguousarray(i[..., ::-1]) for i in images], params)  # type: ignore[no-any-return]


def shape_colour() -> Target:
    return ShapeColourTarget()


def shape_colour_bgr() -> Target:
    return BGRFed(ShapeColourTarget())


def words() -> Target:
    return WordsTarget()


def words_bgr() -> Target:
    return BGRFed(WordsTarget())


def tiny_clip_bgr() -> Target:
    """builtin:tiny-clip behind a pipeline that feeds it BGR."""
    from mmchaos.targets import load_target

    return BGRFed(load_target("builtin:tiny-clip"))


def renormalised_clip(dst: Path, mean: Sequence[float], std: Sequence[float]) -> Path:
    """A copy of builtin:tiny-clip whose preprocessor normalises with ``mean``/``std`` (weights unchanged)."""
    import json
    import shutil

    from mmchaos.targets.builtin import TINY_CLIP_DIR

    shutil.copytree(TINY_CLIP_DIR, dst, dirs_exist_ok=True)
    for name in ("preprocessor_config.json", "processor_config.json"):  # transformers reads either
        path = dst / name
        cfg = json.loads(path.read_text())
        (cfg.get("image_processor") or cfg).update(image_mean=list(mean), image_std=list(std))
        path.write_text(json.dumps(cfg))
    return dst


class BatchShiftedWords(WordsTarget):
    """Broken: alone it answers as the checkpoint does; inside a batch every answer but the longest
    prompt's is shifted by one word (what padding on the wrong side does to the shorter rows)."""

    def generate_batch(
        self, requests: Sequence[str | Sequence[Message]], params: GenerationParams | None = None
    ) -> list[GenerationResult]:
        import dataclasses

        answers = [self.generate(r, (), params) for r in requests]
        shifted = []
        for a in answers:
            c = a.completions[0]
            words = ["pad", *c.text.split()][: len(c.text.split())]
            ids = tuple(sum(map(ord, w)) for w in words)
            shifted.append(dataclasses.replace(a, completions=(dataclasses.replace(c, text=" ".join(words),
                                                                                   token_ids=ids),)))  # fmt: skip
        return shifted


def words_batch_shifted() -> Target:
    return BatchShiftedWords()
