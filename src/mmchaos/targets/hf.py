"""``hf:<path-or-hub-id>``: any transformers contrastive image-text model (CLIP, SigLIP, ...).

Loads from a local directory or the local hub cache only (never downloads), from safetensors by
default, and never runs repository code unless the user passes ``--trust-remote-code``.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmchaos._lazy import require
from mmchaos.errors import TargetCallError, TargetLoadError
from mmchaos.targets.base import Capability, Fingerprint, FloatArray, ImageArray, Target, component_hashes
from mmchaos.targets.decode import check_image_array

__all__ = ["HFContrastiveTarget"]


def _versions(*packages: str) -> dict[str, str]:
    out = {}
    for name in packages:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def _local_dir(source: str) -> Path:
    """The directory holding the model files: the path itself, or its local hub-cache snapshot."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise TargetLoadError(f"hf target {source!r} is a file; give the model directory")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source, local_files_only=True))
    except Exception as exc:  # huggingface_hub raises several unrelated types here
        raise TargetLoadError(
            f"hf target {source!r} is neither a directory nor in the local hub cache "
            "(mmchaos never downloads; fetch it first or give a path)"
        ) from exc


class HFContrastiveTarget(Target):
    """A transformers model with ``get_image_features`` and ``get_text_features``."""

    capabilities = frozenset(
        {Capability.EMBED_IMAGE, Capability.EMBED_TEXT, Capability.TORCH_MODULE, Capability.PREPROCESS}
    )

    def __init__(
        self,
        source: str,
        *,
        uri: str | None = None,
        trust_remote_code: bool = False,
        use_safetensors: bool = True,
        device: str = "cpu",
    ) -> None:
        self.torch = require("torch")
        transformers = require("transformers")
        self.uri = uri or f"hf:{source}"
        self.path = _local_dir(source)
        self.device = device
        transformers.logging.disable_progress_bar()  # no tqdm bars inside mmchaos's own output
        try:
            self.model = transformers.AutoModel.from_pretrained(
                str(self.path),
                trust_remote_code=trust_remote_code,
                use_safetensors=use_safetensors,
                local_files_only=True,
            )
        except (OSError, ValueError, KeyError) as exc:
            hint = " (weights are loaded from safetensors by default)" if use_safetensors else ""
            raise TargetLoadError(f"cannot load a model from {self.path}: {exc}{hint}") from exc
        if not (hasattr(self.model, "get_image_features") and hasattr(self.model, "get_text_features")):
            raise TargetLoadError(
                f"{type(self.model).__name__} at {self.path} is not a contrastive image-text model "
                "(it has no get_image_features/get_text_features)"
            )
        self.model.eval().to(device)
        self.tokenizer = self._load(transformers.AutoTokenizer, "tokenizer", trust_remote_code)
        self.image_processor = self._load(transformers.AutoImageProcessor, "image processor", trust_remote_code)
        config = self.model.config
        text_cfg = getattr(config, "text_config", config)
        self.max_text_tokens = int(getattr(text_cfg, "max_position_embeddings", 0) or 0) or None
        # SigLIP was trained on texts padded to the full length; CLIP pools at end-of-text.
        self.text_padding: str | bool = "max_length" if "siglip" in config.model_type else True
        self._fingerprint: Fingerprint | None = None

    def _load(self, auto: Any, what: str, trust_remote_code: bool) -> Any:
        try:
            return auto.from_pretrained(str(self.path), trust_remote_code=trust_remote_code, local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:
            raise TargetLoadError(f"cannot load the {what} from {self.path}: {exc}") from exc

    @staticmethod
    def _features(out: Any) -> Any:
        # transformers < 5 returns a tensor; 5 returns an output whose pooler_output is projected.
        return out if hasattr(out, "detach") else out.pooler_output

    def _to_numpy(self, tensor: Any) -> FloatArray:
        return np.ascontiguousarray(tensor.detach().to("cpu", self.torch.float32).numpy())

    def preprocess_images(self, images: Sequence[ImageArray]) -> Any:
        batch = self.image_processor(
            images=[np.asarray(i) for i in images], return_tensors="pt", input_data_format="channels_last"
        )
        return batch["pixel_values"].to(self.device)

    def tokenize(self, texts: Sequence[str]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"padding": self.text_padding, "truncation": True, "return_tensors": "pt"}
        if self.max_text_tokens:
            kwargs["max_length"] = self.max_text_tokens
        enc = self.tokenizer(list(texts), **kwargs)
        return {k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}

    def embed_images(self, images: Sequence[ImageArray]) -> FloatArray:
        if not images:
            return np.zeros((0, 0), dtype=np.float32)
        for i, image in enumerate(images):
            # Typed refusal of anything but a sane (H, W, 3) uint8 picture, before any copy.
            check_image_array(image, i, max_pixels=self.max_image_pixels)
        pixels = self.preprocess_images(images)
        with self.torch.inference_mode():
            return self._to_numpy(self._features(self.model.get_image_features(pixel_values=pixels)))

    def embed_texts(self, texts: Sequence[str]) -> FloatArray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TargetCallError(f"text {i}: expected str, got {type(text).__name__}", code="bad_text_type")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:  # lone surrogates crash the Rust tokenizer
                raise TargetCallError(f"text {i} is not valid Unicode: {exc.reason}", code="bad_utf8") from exc
        enc = self.tokenize(texts)
        with self.torch.inference_mode():
            return self._to_numpy(self._features(self.model.get_text_features(**enc)))

    def torch_module(self) -> Any:
        return self.model

    def fingerprint(self) -> Fingerprint:
        if self._fingerprint is None:
            self._fingerprint = Fingerprint(
                **component_hashes(self.path),
                versions=_versions("torch", "transformers", "tokenizers", "safetensors", "numpy"),
            )
        return self._fingerprint
