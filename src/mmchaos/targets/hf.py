"""``hf:<path-or-hub-id>``: any transformers contrastive image-text model (CLIP, SigLIP, ...).

Loads from a local directory or the local hub cache only (never downloads), from safetensors by
default, and never runs repository code unless the user passes ``--trust-remote-code``.

The pipeline is tested as shipped: the tokenizer's own limit and truncation side, the call
settings the model's processor class applies (SigLIP 2's ``max_length`` and patch budget), the
image processor's own sizes, and every tensor the processor returns goes to the model. Nothing
is repaired: a checkpoint that leaves weights newly initialised is refused, and a processor whose
output the model cannot take is named on every image call. The only settings mmchaos adds are
those a batch needs (``padding``, and ``truncation=True`` where the processor says nothing);
:attr:`HFContrastiveTarget.call_settings` records them.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from mmchaos._lazy import require
from mmchaos.errors import TargetCallError, TargetLoadError
from mmchaos.targets.base import Capability, Fingerprint, FloatArray, ImageArray, Target
from mmchaos.targets.blip_itc import SAVED_AS as BLIP_RETRIEVAL
from mmchaos.targets.blip_itc import blip_itc
from mmchaos.targets.decode import check_image_array
from mmchaos.targets.hub import directory_fingerprint, local_dir, quiet_transformers

__all__ = ["HFContrastiveTarget", "usable_positions"]

log = logging.getLogger(__name__)

_NO_LIMIT = 1_000_000
"""A tokenizer ``model_max_length`` at or above this means "no limit" (transformers uses 1e30)."""


def usable_positions(model: Any) -> int | None:
    """How many tokens the text tower can take.

    ``max_position_embeddings`` for CLIP, SigLIP and BERT-style towers; RoBERTa-style towers
    (XLM-R in AltCLIP) number positions from ``pad_token_id + 1``, so ``pad_token_id + 1`` of
    their position embeddings can never be used by a real token.
    """
    config = getattr(model, "config", None)
    text_cfg = getattr(config, "text_config", None) or config
    positions = int(getattr(text_cfg, "max_position_embeddings", 0) or 0)
    if positions <= 0:
        return None
    text_tower = getattr(model, "text_model", None) or model
    for name, module in text_tower.named_modules():
        if name.endswith("position_embeddings") and getattr(module, "num_embeddings", None) == positions:
            pad = getattr(module, "padding_idx", None)
            if isinstance(pad, int) and pad >= 0:
                return positions - pad - 1
    return positions


def _saved_architectures(path: Any) -> list[str]:
    """The ``architectures`` a checkpoint's ``config.json`` says it was saved as (empty if unreadable)."""
    try:
        archs = json.loads((path / "config.json").read_text(encoding="utf-8")).get("architectures")
    except (OSError, ValueError, AttributeError):
        return []
    return [str(a) for a in archs] if isinstance(archs, list) else []


def _accepted(fn: Any) -> set[str]:
    """The keyword names ``fn`` takes explicitly (not through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _plain(value: Any) -> Any:
    """A JSON-friendly copy of a call setting (for evidence)."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


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
        allow_missing_weights: bool = False,
    ) -> None:
        self.torch = require("torch")
        transformers = require("transformers")
        self.uri = uri or f"hf:{source}"
        self.path = local_dir(source)
        self.device = device
        transformers.logging.disable_progress_bar()  # no tqdm bars inside mmchaos's own output
        self.model = self._load_model(transformers, trust_remote_code, use_safetensors, allow_missing_weights)
        if not (hasattr(self.model, "get_image_features") and hasattr(self.model, "get_text_features")):
            raise TargetLoadError(
                f"{type(self.model).__name__} at {self.path} is not a contrastive image-text model "
                "(it has no get_image_features/get_text_features)"
            )
        self.model.eval().to(device)
        self.tokenizer = self._load(transformers.AutoTokenizer, "tokenizer", trust_remote_code)
        self.image_processor = self._load(transformers.AutoImageProcessor, "image processor", trust_remote_code)
        self.processor = self._load_processor(transformers, trust_remote_code)
        text_kwargs, image_kwargs = self._processor_settings()
        config = self.model.config
        # Only what batching needs is added, and only where the processor says nothing: SigLIP was
        # trained on texts padded to the full length, CLIP pools at end-of-text (padding is neutral).
        self.text_kwargs: dict[str, Any] = {
            "padding": "max_length" if config.model_type == "siglip" else True,
            "truncation": True,
            **text_kwargs,
        }
        self.image_kwargs: dict[str, Any] = image_kwargs
        self.text_padding: str | bool = self.text_kwargs["padding"]
        """The padding texts get (what an ONNX export records for its own tokenizer calls)."""
        self.call_settings: dict[str, Any] = {
            "text": _plain(self.text_kwargs),
            "images": _plain(self.image_kwargs),
            "from_processor": {
                "text": sorted(k for k, src in self._text_sources.items() if src == "processor"),
                "images": sorted(image_kwargs),
            },
            "from_tokenizer": sorted(k for k, src in self._text_sources.items() if src == "tokenizer"),
            "added_by_mmchaos": sorted({"padding", "truncation"} - set(text_kwargs)),
        }
        self.max_text_tokens = usable_positions(self.model)
        """The tokens the model's text tower can take (its usable positions)."""
        self._text_inputs = _accepted(self.model.get_text_features)
        self.processor_unfit = self._processor_fit()
        """Why the processor's output cannot go into the model as shipped, or None."""
        self._fingerprint: Fingerprint | None = None

    # -- loading ----------------------------------------------------------------------------------

    def _load_model(
        self, transformers: Any, trust_remote_code: bool, use_safetensors: bool, allow_missing: bool
    ) -> Any:
        saved = _saved_architectures(self.path)
        # A checkpoint saved as BLIP retrieval is loaded as that class (AutoModel would make it a
        # BlipModel, whose text tower and projections the checkpoint does not hold).
        loader = transformers.BlipForImageTextRetrieval if BLIP_RETRIEVAL in saved else transformers.AutoModel
        try:
            with quiet_transformers():  # its multi-line missing-weights table is ours to tell, in one line
                model, info = loader.from_pretrained(
                    str(self.path),
                    trust_remote_code=trust_remote_code,
                    use_safetensors=use_safetensors,
                    local_files_only=True,
                    output_loading_info=True,
                )
        except (OSError, ValueError, KeyError) as exc:
            hint = " (weights are loaded from safetensors by default)" if use_safetensors else ""
            raise TargetLoadError(f"cannot load a model from {self.path}: {exc}{hint}") from exc
        missing = sorted(str(k) for k in info.get("missing_keys") or ())
        mismatched = [str(k[0] if isinstance(k, tuple | list) else k) for k in info.get("mismatched_keys") or ()]
        unexpected = sorted(str(k) for k in info.get("unexpected_keys") or ())
        saved_as = list(getattr(model.config, "architectures", None) or [])
        self.load_report: dict[str, Any] = {
            "loaded_as": type(model).__name__,
            "saved_as": saved_as,
            "missing_keys": len(missing),
            "mismatched_keys": len(mismatched),
            "unexpected_keys": len(unexpected),
            "missing_examples": missing[:5],
            "allowed_missing": allow_missing,
        }
        fresh = len(missing) + len(mismatched)
        if fresh and not allow_missing:
            arch = f" (the checkpoint was saved as {', '.join(saved_as)})" if saved_as else ""
            raise TargetLoadError(
                f"{fresh} weights of {type(model).__name__} are not in the checkpoint at {self.path}{arch} and would "
                f"be initialised at random, e.g. {', '.join((missing + mismatched)[:3])}: every load would validate "
                "a different model. Load a directory saved for this architecture, or pass allow_missing_weights "
                "to validate it anyway",
                code="weights_missing",
            )
        if fresh:
            log.warning("%s: %d weights newly initialised at load (allowed by the caller)", self.path, fresh)
        return blip_itc(model) if type(model).__name__ == BLIP_RETRIEVAL else model

    def _load(self, auto: Any, what: str, trust_remote_code: bool) -> Any:
        try:
            return auto.from_pretrained(str(self.path), trust_remote_code=trust_remote_code, local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:
            raise TargetLoadError(f"cannot load the {what} from {self.path}: {exc}") from exc

    def _load_processor(self, transformers: Any, trust_remote_code: bool) -> Any:
        """The model's processor (its class carries call defaults), or None when there is none."""
        try:
            processor = transformers.AutoProcessor.from_pretrained(
                str(self.path), trust_remote_code=trust_remote_code, local_files_only=True
            )
        except Exception:  # many directories have no processor; the parts alone are the pipeline
            log.debug("no processor at %s", self.path, exc_info=True)
            return None
        return processor if hasattr(processor, "_merge_kwargs") else None

    def _merged(self, tokenizer_init: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
        """The per-modality call settings the processor would pass (transformers' own merge)."""
        drop = {"return_tensors"}
        try:
            merged = self.processor._merge_kwargs(
                self.processor.valid_processor_kwargs, tokenizer_init_kwargs=tokenizer_init
            )
        except Exception:  # an older or custom processor: its declared defaults, if any
            log.debug("cannot merge the processor's kwargs", exc_info=True)
            merged = {
                "text_kwargs": dict(getattr(self.processor, "text_kwargs", {}) or {}),
                "images_kwargs": dict(getattr(self.processor, "images_kwargs", {}) or {}),
            }
        return {
            modality: {k: v for k, v in dict(merged.get(modality, {})).items() if v is not None and k not in drop}
            for modality in ("text_kwargs", "images_kwargs")
        }

    def _processor_settings(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The text and image call settings the processor would apply; records which text settings
        are the processor class's own and which the saved tokenizer's (``tokenizer.json``)."""
        self._text_sources: dict[str, str] = {}
        if self.processor is None:
            return {}, {}
        merged = self._merged(getattr(self.tokenizer, "init_kwargs", None) or {})
        own = self._merged(None)["text_kwargs"]
        for k, v in merged["text_kwargs"].items():
            self._text_sources[k] = "processor" if k in own and own[k] == v else "tokenizer"
        return merged["text_kwargs"], merged["images_kwargs"]

    def _processor_fit(self) -> str | None:
        config = self.model.config
        vision = getattr(config, "vision_config", None) or config
        size = getattr(vision, "image_size", None)
        if not isinstance(size, int) or size <= 0:
            return None  # variable-resolution towers (SigLIP 2) take what their processor gives
        try:
            pixels = self.preprocess_images([np.full((97, 131, 3), 127, np.uint8)])
        except Exception as exc:
            return f"the image processor fails on a plain picture: {type(exc).__name__}: {exc}"[:300]
        shape = tuple(int(d) for d in pixels.shape)
        if len(shape) == 4 and shape[2:] != (size, size):
            return f"the processor outputs {shape[2]}x{shape[3]} pixels, the vision tower takes {size}x{size}"
        channels = getattr(vision, "num_channels", None)
        if len(shape) == 4 and isinstance(channels, int) and shape[1] != channels:
            return f"the processor outputs {shape[1]} channels, the vision tower takes {channels}"
        return None

    # -- the stages' limits -------------------------------------------------------------------------

    def text_limits(self) -> dict[str, int | None]:
        """The text length limit of each stage as shipped (None: the stage sets no limit).

        ``tokenizer``: the ``max_length`` its saved truncation settings give, else its
        ``model_max_length``, when it truncates; ``processor``: the ``max_length`` the processor
        class passes (it overrides the tokenizer's); ``model``: the text tower's usable positions.
        """
        truncates = bool(self.text_kwargs.get("truncation"))
        call_max = self.text_kwargs.get("max_length")
        source = self._text_sources.get("max_length")
        tok_max = call_max if source == "tokenizer" else getattr(self.tokenizer, "model_max_length", None)
        tokenizer = int(tok_max) if truncates and isinstance(tok_max, int) and 0 < tok_max < _NO_LIMIT else None
        processor = int(call_max) if truncates and source == "processor" and isinstance(call_max, int) else None
        return {"tokenizer": tokenizer, "processor": processor, "model": self.max_text_tokens}

    # -- calls ------------------------------------------------------------------------------------

    @staticmethod
    def _features(out: Any) -> Any:
        # transformers < 5 returns a tensor; 5 returns an output whose pooler_output is projected.
        return out if hasattr(out, "detach") else out.pooler_output

    def _to_numpy(self, tensor: Any) -> FloatArray:
        return np.ascontiguousarray(tensor.detach().to("cpu", self.torch.float32).numpy())

    def preprocess_inputs(self, images: Sequence[ImageArray]) -> dict[str, Any]:
        """Everything the image processor returns (pixels, and masks/shapes where it has them)."""
        batch = self.image_processor(
            images=[np.asarray(i) for i in images],
            return_tensors="pt",
            input_data_format="channels_last",
            **self.image_kwargs,
        )
        return {k: v.to(self.device) if hasattr(v, "to") else v for k, v in dict(batch).items()}

    def preprocess_images(self, images: Sequence[ImageArray]) -> Any:
        return self.preprocess_inputs(images)["pixel_values"]

    def tokenize(self, texts: Sequence[str]) -> dict[str, Any]:
        enc = self.tokenizer(list(texts), return_tensors="pt", **self.text_kwargs)
        wanted = self._text_inputs or {"input_ids", "attention_mask"}
        return {k: v.to(self.device) for k, v in enc.items() if k in wanted}

    def embed_images(self, images: Sequence[ImageArray]) -> FloatArray:
        if not images:
            return np.zeros((0, 0), dtype=np.float32)
        for i, image in enumerate(images):
            # Typed refusal of anything but a sane (H, W, 3) uint8 picture, before any copy.
            check_image_array(image, i, max_pixels=self.max_image_pixels)
        if self.processor_unfit:
            raise TargetCallError(
                f"not run: the processor does not fit the model ({self.processor_unfit})", code="processor_unfit"
            )
        inputs = self.preprocess_inputs(images)
        with self.torch.inference_mode():
            return self._to_numpy(self._features(self.model.get_image_features(**inputs)))

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
        self._refuse_overlong(enc)
        with self.torch.inference_mode():
            return self._to_numpy(self._features(self.model.get_text_features(**enc)))

    def _refuse_overlong(self, enc: dict[str, Any]) -> None:
        """A typed refusal where the shipped tokenizer lets through more tokens than the model has
        positions (a deployment would crash with an index error there)."""
        limit = self.max_text_tokens
        ids = enc.get("input_ids")
        if limit is None or ids is None or int(ids.shape[-1]) <= limit:
            return
        mask = enc.get("attention_mask")
        lengths = mask.sum(dim=-1) if mask is not None else self.torch.full((ids.shape[0],), ids.shape[-1])
        i = int(lengths.argmax())
        if int(lengths[i]) <= limit:  # the real tokens fit: the padding does not
            raise TargetCallError(
                f"texts are padded to {int(ids.shape[-1])} tokens (padding={self.text_kwargs.get('padding')!r}, "
                f"max_length={self.text_kwargs.get('max_length')}), but the model has {limit} usable positions: "
                "as shipped, the model fails on every text",
                code="text_exceeds_model_positions",
            )
        tok = self.text_limits()["tokenizer"]
        allowed = f"allows {tok}" if tok is not None else "sets no limit"
        raise TargetCallError(
            f"text {i} has {int(lengths[i])} tokens after the tokenizer (which {allowed}), but the model has "
            f"{limit} usable positions: as shipped, the model fails on it with an index error",
            code="text_exceeds_model_positions",
        )

    def torch_module(self) -> Any:
        return self.model

    def fingerprint(self) -> Fingerprint:
        if self._fingerprint is None:
            self._fingerprint = directory_fingerprint(self.path)
        return self._fingerprint

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "text_limits": self.text_limits(),
            "call_settings": self.call_settings,
            "load_report": self.load_report,
        }
