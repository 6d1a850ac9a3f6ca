"""One delegating wrapper for targets, and :func:`unwrap` to see through a stack of them.

The runner times model calls, the serving checks switch failures on and off, and foreign
duck-typed objects get the Target base's defaults; each is a :class:`DelegatingTarget` that
overrides :meth:`~DelegatingTarget.call` (model calls) or a single method, never the whole list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from mmchaos.targets.base import Fingerprint, FloatArray, ImageArray, Target
from mmchaos.targets.generation import GenerationParams, GenerationResult, Message

if TYPE_CHECKING:
    from mmchaos.targets.hf_steps import StepDecoder

__all__ = ["DelegatingTarget", "as_model_call", "unwrap"]

R = TypeVar("R")


class DelegatingTarget(Target):
    """Forwards every Target method to ``inner``; model calls pass through :meth:`call`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.uri = getattr(inner, "uri", "")
        self.capabilities = getattr(inner, "capabilities", frozenset())
        self.max_image_pixels = getattr(inner, "max_image_pixels", Target.max_image_pixels)
        self.load_options = getattr(inner, "load_options", Target.load_options)

    def call(self, fn: Callable[..., R], *args: Any) -> R:
        """Run one model call of the inner target; subclasses time, count or fail it here."""
        return fn(*args)

    def embed_images(self, images: Sequence[ImageArray]) -> FloatArray:
        return self.call(self.inner.embed_images, images)

    def embed_texts(self, texts: Sequence[str]) -> FloatArray:
        return self.call(self.inner.embed_texts, texts)

    def read_text(self, images: Sequence[ImageArray]) -> list[str]:
        return self.call(self.inner.read_text, images)

    def generate(
        self,
        prompt: str | Sequence[Message],
        images: Sequence[ImageArray] = (),
        params: GenerationParams | None = None,
    ) -> GenerationResult:
        result: GenerationResult = self.call(self.inner.generate, prompt, images, params)
        return result

    def generate_batch(
        self, requests: Sequence[str | Sequence[Message]], params: GenerationParams | None = None
    ) -> list[GenerationResult]:
        results: list[GenerationResult] = self.call(self.inner.generate_batch, requests, params)
        return results

    def generate_stream(
        self,
        prompt: str | Sequence[Message],
        images: Sequence[ImageArray] = (),
        params: GenerationParams | None = None,
    ) -> Iterator[str]:
        # A stream passes through as it is (timing it as one call would hide its first token).
        fn = getattr(self.inner, "generate_stream", None)
        if fn is None:
            return super().generate_stream(prompt, images, params)
        return iter(fn(prompt, images, params))

    def embed_encoded_images(self, blobs: Sequence[bytes]) -> FloatArray:
        fn = getattr(self.inner, "embed_encoded_images", None)
        return super().embed_encoded_images(blobs) if fn is None else self.call(fn, blobs)

    def read_encoded_images(self, blobs: Sequence[bytes]) -> list[str]:
        fn = getattr(self.inner, "read_encoded_images", None)
        return super().read_encoded_images(blobs) if fn is None else self.call(fn, blobs)

    def embed_encoded_texts(self, blobs: Sequence[bytes]) -> FloatArray:
        fn = getattr(self.inner, "embed_encoded_texts", None)
        return super().embed_encoded_texts(blobs) if fn is None else self.call(fn, blobs)

    def generate_encoded(
        self, prompt: str, blobs: Sequence[bytes], params: GenerationParams | None = None
    ) -> GenerationResult:
        fn = getattr(self.inner, "generate_encoded", None)
        if fn is None:
            return super().generate_encoded(prompt, blobs, params)
        result: GenerationResult = self.call(fn, prompt, blobs, params)
        return result

    def decode_image(self, blob: bytes) -> ImageArray:
        fn = getattr(self.inner, "decode_image", None)
        return super().decode_image(blob) if fn is None else fn(blob)

    def decode_text(self, blob: bytes) -> str:
        fn = getattr(self.inner, "decode_text", None)
        return super().decode_text(blob) if fn is None else fn(blob)

    def step_decoder(self) -> StepDecoder | None:
        # Each forward pass is a model call of this wrapper too (timed, counted, failed by it).
        fn = getattr(self.inner, "step_decoder", None)
        decoder = fn() if callable(fn) else None
        return None if decoder is None else decoder.routed(self.call)

    def torch_module(self) -> Any:
        return self.inner.torch_module()

    def fingerprint(self) -> Fingerprint:
        fp = self.inner.fingerprint()
        return fp if isinstance(fp, Fingerprint) else Fingerprint(**dict(fp))

    def untested_modalities(self) -> dict[str, str]:
        fn = getattr(self.inner, "untested_modalities", None)
        return {} if fn is None else dict(fn())

    def recorded_fingerprint(self) -> Fingerprint | None:
        fn = getattr(self.inner, "recorded_fingerprint", None)
        return None if fn is None else fn()

    def __getattr__(self, name: str) -> Any:
        # Everything else (tokenizer, preprocess_images, ...) passes through untouched.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def unwrap(target: Target) -> Target:
    """The innermost Target behind wrappers such as the runner's timing wrapper."""
    for _ in range(8):
        inner = getattr(target, "inner", None)
        if not isinstance(inner, Target):
            break
        target = inner
    return target


def as_model_call(target: Any, fn: Callable[..., R], *args: Any) -> R:
    """Run ``fn`` (torch work on the target's own module, e.g. a gradient) as one model call of
    ``target``: a wrapper's :meth:`~DelegatingTarget.call` times or counts it (the runner's model
    clock), a plain target just runs it. For code below the runner (perturbations) that must not
    import it."""
    if isinstance(target, DelegatingTarget):
        return target.call(fn, *args)
    return fn(*args)
