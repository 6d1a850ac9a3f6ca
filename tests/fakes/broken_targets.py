"""Deliberately broken targets for the engine and integration checks, and their correct twins.

Two families:

* numpy targets (fast to start in worker processes) for the contract, thread-safety and
  determinism checks: a correct, validating one and one broken copy per bug;
* real transformers CLIP models (``tiny_clip_dir()``: the built-in tiny-clip when it is
  installed, else a random-weight tiny CLIPModel built here) with one realistic bug each: a layer
  that overflows in fp16, a tokenizer that truncates early or drops EOS, left padding, a
  processor or tokenizer that does not belong with the weights, dropout left on, a shape baked in
  at export.

Factories are importable as ``py:tests.fakes.broken_targets:NAME`` so worker processes can load them.
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmchaos.errors import TargetCallError
from mmchaos.targets.base import Fingerprint, Target
from mmchaos.targets.decode import check_image_array
from tests.fakes.targets import DIM, HashEmbedTarget

MODEL_ENV = "MMCHAOS_TEST_MODEL_DIR"

# -- numpy targets ---------------------------------------------------------------------------------


def _resample(img: np.ndarray, side: int = 16) -> np.ndarray:
    h, w = img.shape[:2]
    ys = (np.arange(side) * h) // side
    xs = (np.arange(side) * w) // side
    return np.asarray(img[ys][:, xs])


class ContractSafeTarget(HashEmbedTarget):
    """Correct for step 1: validates arrays and texts with typed errors, resamples every picture."""

    uri = "py:tests.fakes.broken_targets:contract_safe"

    def _image(self, img: np.ndarray) -> np.ndarray:
        return np.asarray(super()._image(_resample(img)))

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        for i, img in enumerate(images):
            check_image_array(img, i)
        return super().embed_images(images)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TargetCallError(f"text {i} is not a str", code="bad_text_type")
            try:
                t.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise TargetCallError(f"text {i} is not valid Unicode: {exc.reason}", code="bad_utf8") from exc
            if not t.split():
                raise TargetCallError(f"text {i} is empty", code="text_empty")
        return super().embed_texts([t[:4096] for t in texts])


class ExifIgnoringTarget(ContractSafeTarget):
    """Broken: decodes uploads with Image.open(...).convert('RGB'), ignoring EXIF orientation."""

    uri = "py:tests.fakes.broken_targets:exif_ignoring"

    def decode_image(self, blob: bytes) -> np.ndarray:
        from PIL import Image

        try:
            with Image.open(io.BytesIO(blob)) as img:
                return np.asarray(img.convert("RGB"), dtype=np.uint8)
        except Exception as exc:
            raise TargetCallError(f"cannot decode: {exc}", code="image_undecodable") from exc


class HangOnTinyTarget(ContractSafeTarget):
    """Broken: 'upscales' tiny images by half their side per step; a 1-pixel side never grows."""

    uri = "py:tests.fakes.broken_targets:hang_on_tiny"

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        for img in images:
            side = min(img.shape[:2])
            while side < 16:
                side += side // 2
        return super().embed_images(images)


class SegfaultOnCMYKTarget(ContractSafeTarget):
    """Broken: a native decoder that reads through a null pointer on CMYK pictures."""

    uri = "py:tests.fakes.broken_targets:segfault_on_cmyk"

    def decode_image(self, blob: bytes) -> np.ndarray:
        from PIL import Image

        with Image.open(io.BytesIO(blob)) as img:
            if img.mode == "CMYK":
                ctypes.string_at(0)  # SIGSEGV, as a crashing C extension would
        return super().decode_image(blob)


class SharedBufferNumpyTarget(ContractSafeTarget):
    """Broken: preprocessing writes into one buffer shared by all calls (the 004 bug)."""

    uri = "py:tests.fakes.broken_targets:shared_buffer_numpy"

    def __init__(self) -> None:
        super().__init__()
        self._buffer = np.zeros((64, 16, 16, 3), np.uint8)

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        n = len(images)
        for i, img in enumerate(images):
            self._buffer[i] = _resample(img)
        time.sleep(0.002)  # the model runs here and releases the GIL; another thread refills
        return np.stack([HashEmbedTarget._image(self, self._buffer[i]) for i in range(n)]).astype(np.float32)


class ProcessSaltedTarget(ContractSafeTarget):
    """Broken across processes only: token vectors seeded with Python's salted ``hash()``."""

    uri = "py:tests.fakes.broken_targets:process_salted"

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        out = []
        for t in texts:
            vec = np.full(DIM, 0.1)
            for w in t.lower().split():
                vec += np.random.default_rng(hash(w) & 0xFFFFFFFF).normal(size=DIM)
            out.append(vec)
        return np.stack(out).astype(np.float32)


class NoisyTarget(ContractSafeTarget):
    """Broken within one process: a random augmentation left on at inference."""

    uri = "py:tests.fakes.broken_targets:noisy"

    def __init__(self) -> None:
        super().__init__()
        self._rng = np.random.default_rng()

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        clean = super().embed_texts(texts)
        return (clean + self._rng.normal(0, 1e-3, clean.shape)).astype(np.float32)


def contract_safe() -> Target:
    return ContractSafeTarget()


def exif_ignoring() -> Target:
    return ExifIgnoringTarget()


def hang_on_tiny() -> Target:
    return HangOnTinyTarget()


def segfault_on_cmyk() -> Target:
    return SegfaultOnCMYKTarget()


def shared_buffer_numpy() -> Target:
    return SharedBufferNumpyTarget()


def process_salted() -> Target:
    return ProcessSaltedTarget()


def noisy() -> Target:
    return NoisyTarget()


# -- a tiny CLIP model -----------------------------------------------------------------------------


def _bytes_to_unicode() -> list[str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs, strict=True))]


_WORDS = [
    "a",
    "photo",
    "of",
    "red",
    "green",
    "blue",
    "yellow",
    "purple",
    "orange",
    "circle",
    "square",
    "triangle",
    "cross",
    "small",
    "medium",
    "large",
    "on",
    "the",
    "at",
    "in",
    "top",
    "bottom",
    "left",
    "right",
    "middle",
    "center",
    "background",
    "black",
    "white",
    "gray",
    "beige",
    "dark",
    "an",
    "image",
    "showing",
]


def build_tiny_clip(out: Path, *, vocab_extra: Sequence[str] = (), max_len: int = 32, seed: int = 0) -> Path:
    """A random-weight CLIPModel (real transformers classes) with a byte-level BPE tokenizer."""
    import torch
    from transformers import (
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        CLIPProcessor,
        CLIPTextConfig,
        CLIPTokenizer,
        CLIPVisionConfig,
    )

    syms = _bytes_to_unicode()
    tokens = syms + [s + "</w>" for s in syms]
    merges: list[tuple[str, str]] = []
    for word in [*_WORDS, *vocab_extra]:  # whole-word merges, so common words are one token
        piece = word[0]
        for i, ch in enumerate(word[1:], start=1):
            nxt = ch + ("</w>" if i == len(word) - 1 else "")
            merges.append((piece, nxt))
            piece += nxt
            if piece not in tokens:
                tokens.append(piece)
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {t: i for i, t in enumerate(tokens)}
    seen: set[tuple[str, str]] = set()
    merges = [m for m in merges if not (m in seen or seen.add(m))]  # type: ignore[func-returns-value]
    tok = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=max_len)  # type: ignore[arg-type]
    text = CLIPTextConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, projection_dim=32, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=max_len, hidden_act="quick_gelu",
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, projection_dim=32, num_hidden_layers=2, num_attention_heads=2,
        image_size=32, patch_size=8, hidden_act="quick_gelu",
    )  # fmt: skip
    torch.manual_seed(seed)
    model = CLIPModel(CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=32))
    processor = CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}, do_center_crop=True,
        image_mean=[0.48145466, 0.4578275, 0.40821073], image_std=[0.26862954, 0.26130258, 0.27577711],
    )  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(out, safe_serialization=True)  # type: ignore[no-untyped-call]
    CLIPProcessor(image_processor=processor, tokenizer=tok).save_pretrained(out)  # type: ignore[no-untyped-call]
    processor.save_pretrained(out)
    return out


def tiny_clip_dir() -> Path:
    """The model the HF-based broken targets start from (see the module docstring)."""
    env = os.environ.get(MODEL_ENV)
    if env:
        return Path(env)
    from mmchaos.targets.builtin import TINY_CLIP_DIR

    if (TINY_CLIP_DIR / "model.safetensors").is_file():
        return TINY_CLIP_DIR
    raise RuntimeError(f"set {MODEL_ENV} (the tests' tiny_clip_dir fixture does) or install builtin:tiny-clip")


def copy_model(dst: Path, src: Path | None = None) -> Path:
    src = src or tiny_clip_dir()
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


def _hf(path: Path | None = None, uri: str = "") -> Any:
    from mmchaos.targets.hf import HFContrastiveTarget

    return HFContrastiveTarget(str(path or tiny_clip_dir()), uri=uri or None)


def tiny_clip() -> Any:
    """The correct twin of the HF-based broken targets."""
    return _hf(uri="py:tests.fakes.broken_targets:tiny_clip")


def fp16_overflow() -> Any:
    """Broken in fp16: the last vision MLP's output layer is scaled so that its activations reach
    about 2e5: finite in fp32 (the final LayerNorm rescales them), past fp16's 65504 (Inf)."""
    import torch

    from mmchaos.data.shapes import make_shapes

    target = _hf(uri="py:tests.fakes.broken_targets:fp16_overflow")
    layers = target.model.vision_model.encoder.layers
    fc2 = layers[len(layers) - 1].mlp.fc2
    peak: list[float] = []
    handle = fc2.register_forward_hook(lambda m, i, o: peak.append(float(o.abs().max())))
    target.embed_images([s.image for s in make_shapes(4, seed=9)])
    handle.remove()
    with torch.no_grad():
        fc2.weight.mul_(2e5 / peak[0])
        fc2.bias.mul_(2e5 / peak[0])
    return target


def int32_token_ids() -> Any:
    """Broken for ONNX serving only: its tokenizer hands over int32 ids (numpy's default int on
    Windows, a custom or JS tokenizer). torch's embedding takes them, so every torch answer is
    right; an ONNX graph exported with int64 ids refuses them."""
    target = _hf(uri="py:tests.fakes.broken_targets:int32_token_ids")
    tokenize = target.tokenize

    def int32_ids(texts: Sequence[str]) -> dict[str, Any]:
        import torch

        return {k: v.to(torch.int32) for k, v in tokenize(texts).items()}

    target.tokenize = int32_ids
    return target


def fp16_cancellation() -> Any:
    """Broken in low precision, finite throughout: the first vision MLP adds 2,000 to every hidden
    unit (fc1's bias) and fc2 takes it away again (its bias), so in fp32 the layer computes what it
    did; in fp16 (resolution 1-2 near 2,000) and bf16 the signal riding on the offset is rounded
    away, and fc2's output is mostly error. No value comes near fp16's 65504."""
    import torch

    target = _hf(uri="py:tests.fakes.broken_targets:fp16_cancellation")
    mlp = target.model.vision_model.encoder.layers[0].mlp
    offset = 2000.0
    with torch.no_grad():
        mlp.fc1.bias.add_(offset)
        mlp.fc2.bias.sub_(mlp.fc2.weight.sum(dim=1) * offset)
    return target


def _tokenize_with(target: Any, max_length: int, drop_eos: bool = False) -> Any:
    def tokenize(texts: Sequence[str]) -> dict[str, Any]:
        enc = target.tokenizer(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        out = {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask")}
        if drop_eos:  # truncate *after* adding EOS, by slicing: the EOS of long texts is cut off
            full = target.tokenizer(list(texts), padding=True, truncation=False, return_tensors="pt")
            out = {k: full[k][:, : target.max_text_tokens] for k in ("input_ids", "attention_mask")}
        return out

    return tokenize


def early_truncation() -> Any:
    """Broken: the serving tokenizer truncates at max-6 tokens, silently."""
    target = _hf(uri="py:tests.fakes.broken_targets:early_truncation")
    target.tokenize = _tokenize_with(target, target.max_text_tokens - 6)
    return target


def eos_dropping() -> Any:
    """Broken: truncation by slicing ids[:max] after EOS was added; long texts lose their EOS."""
    import logging

    logging.getLogger("transformers.tokenization_utils_base").setLevel(logging.ERROR)
    target = _hf(uri="py:tests.fakes.broken_targets:eos_dropping")
    target.tokenize = _tokenize_with(target, target.max_text_tokens, drop_eos=True)
    return target


def left_padding() -> Any:
    """Broken: pads texts on the left (as decoder LMs do) while CLIP's positions start at 0."""
    target = _hf(uri="py:tests.fakes.broken_targets:left_padding")
    target.tokenizer.padding_side = "left"
    return target


class _SharedPixelBuffer:
    """An image processor wrapper that reuses one output tensor for every call (the 004 bug)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.buffer: Any = None

    def __call__(self, images: Any, **kw: Any) -> dict[str, Any]:
        import torch

        fresh = self.inner(images=images, **kw)["pixel_values"]
        if self.buffer is None or self.buffer.shape[1:] != fresh.shape[1:] or self.buffer.shape[0] < len(fresh):
            self.buffer = torch.empty((64, *fresh.shape[1:]), dtype=fresh.dtype)
        n = len(fresh)
        self.buffer[:n].copy_(fresh)
        time.sleep(0.002)  # I/O or another GIL release between filling and using the buffer
        return {"pixel_values": self.buffer[:n]}


def shared_buffer() -> Any:
    """Broken under threads: preprocessing writes into one shared tensor."""
    target = _hf(uri="py:tests.fakes.broken_targets:shared_buffer")
    target.image_processor = _SharedPixelBuffer(target.image_processor)
    return target


def dropout_on() -> Any:
    """Broken: attention dropout 0.1 in the config and the model left in training mode."""
    target = _hf(uri="py:tests.fakes.broken_targets:dropout_on")
    for layer in [*target.model.text_model.encoder.layers, *target.model.vision_model.encoder.layers]:
        layer.self_attn.dropout = 0.1
    target.model.train()
    return target


def reshape_baked() -> Any:
    """Broken at export: the image head reshapes with a Python int taken from the batch size,
    which tracing records as a constant; the exported graph silently reshapes other batches."""
    import types

    target = _hf(uri="py:tests.fakes.broken_targets:reshape_baked")
    model = target.model
    original = model.get_image_features

    def get_image_features(self: Any, pixel_values: Any, **kw: Any) -> Any:
        feats = original(pixel_values=pixel_values, **kw)
        feats = feats if hasattr(feats, "reshape") else feats.pooler_output
        batch = int(pixel_values.shape[0])
        return feats.reshape(batch, -1)

    model.get_image_features = types.MethodType(get_image_features, model)
    return target


def mismatched_dir(kind: str, dst: Path, src: Path | None = None) -> Path:
    """A copy of the model directory with one component that does not belong with the weights.

    ``processor_size``: the processor resizes to 48 px, the vision tower wants 32/64;
    ``processor_norm``: mean/std (0.5, 0.5, 0.5) instead of CLIP's;
    ``tokenizer_vocab``: a tokenizer with a different vocabulary (more merges, other ids).
    """
    copy_model(dst, src)
    if kind in ("processor_size", "processor_norm"):
        for name in ("preprocessor_config.json", "processor_config.json"):
            path = dst / name
            if not path.is_file():
                continue
            cfg = json.loads(path.read_text())
            node = cfg.get("image_processor", cfg)
            if kind == "processor_size":
                node["size"] = {"shortest_edge": 48}
                node["crop_size"] = {"height": 48, "width": 48}
            else:
                node["image_mean"] = [0.5, 0.5, 0.5]
                node["image_std"] = [0.5, 0.5, 0.5]
            path.write_text(json.dumps(cfg, indent=2))
    elif kind == "tokenizer_vocab":
        other = build_tiny_clip(dst / "_other_tokenizer", vocab_extra=[f"zz{i}qq" for i in range(40)])
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json"):
            if (other / name).is_file():
                shutil.copy2(other / name, dst / name)
        shutil.rmtree(other)
    else:
        raise ValueError(kind)
    return dst


def fingerprint_of(target: Target) -> dict[str, Any]:
    fp: Fingerprint = target.fingerprint()
    return fp.to_dict()


def ensure_tiny_clip(cache: Path) -> Path:
    """The built-in tiny-clip when installed, else a random tiny CLIP built (once) under ``cache``;
    exported in MMCHAOS_TEST_MODEL_DIR so worker processes find it too."""
    from mmchaos.targets.builtin import TINY_CLIP_DIR

    if (TINY_CLIP_DIR / "model.safetensors").is_file():
        path = TINY_CLIP_DIR
    else:
        path = cache / "random-tiny-clip"
        if not (path / "model.safetensors").is_file():
            build_tiny_clip(path)
    os.environ[MODEL_ENV] = str(path)
    return path


def is_trained(path: Path) -> bool:
    """True for the shipped, trained model (functional probes need one)."""
    return (path / "training.json").is_file()


class RejectsLongText:
    """Mixin: over-long texts are refused with a typed error instead of being truncated."""

    def embed_texts(self, texts: Sequence[str]) -> Any:
        limit = self.max_text_tokens  # type: ignore[attr-defined]
        for i, t in enumerate(texts):
            n = len(self.tokenizer(t, truncation=False, verbose=False)["input_ids"])  # type: ignore[attr-defined]
            if n > limit:
                raise TargetCallError(f"text {i} has {n} tokens, over the limit of {limit}", code="text_too_long")
        return super().embed_texts(texts)  # type: ignore[misc]


def rejects_long_text() -> Any:
    """Correct for the context boundary: refuses texts past the limit with a typed error."""
    from mmchaos.targets.hf import HFContrastiveTarget

    class Strict(RejectsLongText, HFContrastiveTarget):
        pass

    return Strict(str(tiny_clip_dir()), uri="py:tests.fakes.broken_targets:rejects_long_text")


def exif_ignoring_hf() -> Any:
    """Broken: the real model behind an upload decoder that ignores EXIF orientation."""
    target = _hf(uri="py:tests.fakes.broken_targets:exif_ignoring_hf")
    target.decode_image = ExifIgnoringTarget.decode_image.__get__(target)
    return target
