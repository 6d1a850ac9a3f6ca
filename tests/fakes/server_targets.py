"""Targets the reference-server tests drive: switchable failures, an OCR stand-in, a tokenizer, a slow one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from mmchaos.errors import TargetCallError
from mmchaos.targets.base import Capability, Fingerprint, Target
from mmchaos.targets.wrappers import DelegatingTarget
from tests.fakes.targets import HashEmbedTarget

R = TypeVar("R")


class ControlledTarget(HashEmbedTarget):
    """Correct embeddings, plus switches: fail, block until released, return NaN, refuse typed."""

    uri = "py:tests.fakes.server_targets:ControlledTarget"

    def __init__(self) -> None:
        super().__init__()
        self.fail = False
        self.nan = False
        self.refuse = False
        self.delay = 0.0
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Semaphore(0)
        self.calls = 0

    def _enter(self) -> None:
        self.calls += 1
        self.entered.release()
        if not self.gate.wait(20.0):
            raise RuntimeError("the test never released the gate")
        if self.delay:
            time.sleep(self.delay)
        if self.fail:
            raise RuntimeError("model exploded")
        if self.refuse:
            raise TargetCallError("this model refuses that", code="model_refused")

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        self._enter()
        out = super().embed_texts(texts)
        return out * np.nan if self.nan else out

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        self._enter()
        return super().embed_images(images)


class ReaderTarget(Target):
    """An OCR stand-in: 'reads' the size and brightness of each image."""

    uri = "py:tests.fakes.server_targets:ReaderTarget"
    capabilities = frozenset({Capability.READ_TEXT})

    def read_text(self, images: Sequence[np.ndarray]) -> list[str]:
        return [f"{i.shape[1]}x{i.shape[0]} {'light' if i.mean() > 127 else 'dark'}" for i in images]

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(weights="reader-v1")


class TokenizedTarget(HashEmbedTarget):
    uri = "py:tests.fakes.server_targets:TokenizedTarget"

    def __init__(self) -> None:
        super().__init__()
        self.tokenizer = WordTokenizer()


SERVICE_S = 0.1
"""What one call of :class:`SlowTarget` takes."""


class SlowTarget(HashEmbedTarget):
    """Correct embeddings that take :data:`SERVICE_S` per call."""

    uri = "py:tests.fakes.server_targets:SlowTarget"

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        time.sleep(SERVICE_S)
        return super().embed_texts(texts)


class WordTokenizer:
    """A tokenizer with transformers' decode signature: id i is word i of a fixed vocabulary."""

    vocab = ("<s>", "a", "red", "circle", "</s>")
    special = (0, 4)

    def __len__(self) -> int:
        return len(self.vocab)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return " ".join(self.vocab[i] for i in ids if not (skip_special_tokens and i in self.special))


class GatedTarget(DelegatingTarget):
    """A real target behind a gate: each model call (alone or batched) is counted with its batch
    size (a continuous-batching prefill: its joiners; a step: its rows); while ``blocked``, a
    call waits for a pass (:meth:`let_through`). Tests hold a call in the model to line up the
    requests that must batch behind it, deterministically, whatever the machine's speed.
    ``delay`` seconds are slept in every call."""

    def __init__(self, inner: Target) -> None:
        super().__init__(inner)
        self.blocked = False
        self.passes = threading.Semaphore(0)
        self.entered = threading.Semaphore(0)
        self.delay = 0.0
        self.batch_sizes: list[int] = []

    def hold(self) -> None:
        """From now on every call waits for a pass (the count of entered calls starts again)."""
        self.passes = threading.Semaphore(0)
        self.entered = threading.Semaphore(0)
        self.blocked = True

    def let_through(self, n: int = 1) -> None:
        self.passes.release(n)

    def open(self) -> None:
        self.blocked = False
        self.passes.release(1000)

    def call(self, fn: Callable[..., R], *args: Any) -> R:
        name = fn.__name__
        if name == "_join":  # a continuous-batching prefill: (batch, the joiners' inputs)
            size = int(args[1]["input_ids"].shape[0])
        elif name == "_step":  # a decoding step: (batch, one token per row)
            size = len(args[1])
        else:
            size = len(args[0]) if name in ("generate_batch", "embed_texts", "embed_images") else 1
        self.batch_sizes.append(size)
        self.entered.release()
        if self.blocked and not self.passes.acquire(timeout=30.0):
            raise RuntimeError("the test never let the call through")
        if self.delay:
            time.sleep(self.delay)
        return fn(*args)
