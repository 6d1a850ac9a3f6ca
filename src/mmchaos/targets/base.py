"""What a target (the system under test) must provide; checks speak only to this interface.

Images cross this boundary as ``uint8`` arrays of shape ``(H, W, 3)`` in RGB order, texts as
``str``. A target implements the methods its capabilities promise and nothing else; the base
class raises :class:`~mmchaos.errors.CapabilityError` for the rest.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping, Sequence
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from mmchaos.errors import CapabilityError, TargetCallError
from mmchaos.guard.artefacts import (
    CONFIG_FILES,
    PROCESSOR_FILES,
    TOKENIZER_FILES,
    WEIGHT_GLOBS,
    Fingerprint,
    component_hashes,
    hash_file,
    hash_files,
)
from mmchaos.targets.generation import Completion, GenerationParams, GenerationResult, Message, StreamUsage

if TYPE_CHECKING:
    from mmchaos.targets.hf_steps import StepDecoder

__all__ = [
    "CONFIG_FILES",
    "PROCESSOR_FILES",
    "TOKENIZER_FILES",
    "WEIGHT_GLOBS",
    "Capability",
    "Completion",
    "Fingerprint",
    "GenerationParams",
    "GenerationResult",
    "Message",
    "Target",
    "component_hashes",
    "hash_file",
    "hash_files",
]

ImageArray = npt.NDArray[np.uint8]
FloatArray = npt.NDArray[np.float32]


class Capability(StrEnum):
    EMBED_IMAGE = "embed_image"
    EMBED_TEXT = "embed_text"
    READ_TEXT = "read_text"
    TORCH_MODULE = "torch_module"
    PREPROCESS = "preprocess"
    GENERATE = "generate"


class Target:
    """Base class of targets; subclasses set ``capabilities`` and implement what they promise."""

    uri: str = ""
    capabilities: frozenset[Capability] = frozenset()
    max_image_pixels: int | None = 89_478_485
    """Declared pixel count above which :meth:`decode_image` refuses an image (Pillow's default)."""
    load_options: Mapping[str, Any] = MappingProxyType({})
    """Options that reload this target with ``load_target(uri, TargetOptions(**load_options))``
    in another process (the contract and determinism checks run targets in worker processes): a
    plain JSON dict that its scheme's options model reads back (set by :func:`~mmchaos.targets.load_target`)."""

    def has(self, *caps: Capability) -> bool:
        return all(c in self.capabilities for c in caps)

    def fingerprint(self) -> Fingerprint:
        return Fingerprint()

    def embed_images(self, images: Sequence[ImageArray]) -> FloatArray:
        """Embed a batch of RGB uint8 images; returns ``(N, D)`` float32, not normalised."""
        raise CapabilityError(f"{self.uri} cannot embed images", code="capability_missing")

    def embed_texts(self, texts: Sequence[str]) -> FloatArray:
        """Embed a batch of texts; returns ``(N, D)`` float32, not normalised."""
        raise CapabilityError(f"{self.uri} cannot embed texts", code="capability_missing")

    def read_text(self, images: Sequence[ImageArray]) -> list[str]:
        """Recognise the text in each image (OCR)."""
        raise CapabilityError(f"{self.uri} cannot read text", code="capability_missing")

    def generate(
        self,
        prompt: str | Sequence[Message],
        images: Sequence[ImageArray] = (),
        params: GenerationParams | None = None,
    ) -> GenerationResult:
        """Answer a prompt (with ``images``) or a chat (images inside the messages) with text.

        Greedy when ``params.temperature == 0``; seeded sampling otherwise. Normalise the inputs
        with :func:`mmchaos.targets.generation.as_messages`.
        """
        raise CapabilityError(f"{self.uri} cannot generate text", code="capability_missing")

    def generate_batch(
        self, requests: Sequence[str | Sequence[Message]], params: GenerationParams | None = None
    ) -> list[GenerationResult]:
        """Answer several requests (prompts or chats, images inside the messages) as one batch.

        This default answers them one at a time; a backend that batches (padding, one forward
        pass per step) overrides it, which is what batch-invariance checks compare with
        :meth:`generate`.
        """
        return [self.generate(r, (), params) for r in requests]

    def generate_stream(
        self,
        prompt: str | Sequence[Message],
        images: Sequence[ImageArray] = (),
        params: GenerationParams | None = None,
    ) -> Iterator[str]:
        """The text of one completion as it is produced (deltas whose concatenation is the text).

        This default yields the whole text of :meth:`generate` at once; targets whose backend
        streams (an SSE endpoint) override it. A stream may end by returning a
        :class:`~mmchaos.targets.generation.StreamUsage` (this one does: ``generate``'s counts).
        """
        return _whole_text(self, prompt, images, params)

    def step_decoder(self) -> StepDecoder | None:
        """Step-by-step decoding with rows joining and leaving (continuous batching in
        ``mmchaos serve``), for a model checked to decode so as its ``generate`` does; None: it
        does not (the server batches whole ``generate_batch`` calls, or none)."""
        return None

    def torch_module(self) -> Any:
        """The underlying ``torch.nn.Module``, for white-box checks."""
        raise CapabilityError(f"{self.uri} gives no white-box access", code="capability_missing")

    # -- the decoding path of encoded inputs ---------------------------------------------------
    # Servers receive bytes, not arrays. These defaults decode in-process and call the array
    # methods; an HTTP target overrides the ``*_encoded_*`` methods to send the bytes as they are.

    def decode_image(self, blob: bytes) -> ImageArray:
        """Encoded image bytes -> RGB uint8 ``(H, W, 3)``: EXIF orientation applied, declared
        size checked before decoding, every refusal a TargetCallError with a stable code."""
        from mmchaos.targets.decode import decode_image_bytes

        return decode_image_bytes(blob, max_pixels=self.max_image_pixels)

    def decode_text(self, blob: bytes) -> str:
        """Encoded text bytes -> str (strict UTF-8; invalid bytes are a typed refusal)."""
        from mmchaos.targets.decode import decode_text_bytes

        return decode_text_bytes(blob)

    def embed_encoded_images(self, blobs: Sequence[bytes]) -> FloatArray:
        """Embed encoded images (file bytes); returns ``(N, D)`` float32."""
        return self.embed_images([self.decode_image(b) for b in blobs])

    def read_encoded_images(self, blobs: Sequence[bytes]) -> list[str]:
        """Recognise the text in encoded images (file bytes)."""
        return self.read_text([self.decode_image(b) for b in blobs])

    def embed_encoded_texts(self, blobs: Sequence[bytes]) -> FloatArray:
        """Embed texts given as encoded bytes (what a server receives)."""
        return self.embed_texts([self.decode_text(b) for b in blobs])

    def generate_encoded(
        self, prompt: str, blobs: Sequence[bytes], params: GenerationParams | None = None
    ) -> GenerationResult:
        """Answer ``prompt`` about encoded images (file bytes, decoded as this target decodes them)."""
        return self.generate(prompt, [self.decode_image(b) for b in blobs], params)

    def untested_modalities(self) -> dict[str, str]:
        """Modalities this target handles in part but that could not be tested, with the reason
        (e.g. an endpoint that embeds texts but accepted no form of image). Empty: nothing hidden."""
        return {}

    def recorded_fingerprint(self) -> Fingerprint | None:
        """The fingerprint recorded when this artefact was made (an export manifest), if any."""
        return None

    def close(self) -> None:
        """Release resources; called once when a run ends."""

    def describe(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "capabilities": sorted(c.value for c in self.capabilities),
            "fingerprint": self.fingerprint().to_dict(),
        }


def _whole_text(
    target: Target, prompt: str | Sequence[Message], images: Sequence[ImageArray], params: GenerationParams | None
) -> Generator[str, None, StreamUsage]:
    """:meth:`Target.generate_stream`'s default: ``generate``'s text as one delta, then its usage."""
    if params is not None and params.n != 1:
        raise TargetCallError("streaming gives one completion; use n=1", code="bad_generation_params")
    result = target.generate(prompt, images, params)
    yield result.text
    ids = result.token_ids
    return StreamUsage(result.prompt_tokens, None if ids is None else len(ids))
