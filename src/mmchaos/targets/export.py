"""Export a white-box contrastive target to an ONNX directory that ``onnx:<dir>`` loads.

The directory holds ``image_encoder.onnx`` (``pixel_values`` -> ``image_embeds``) and/or
``text_encoder.onnx`` (``input_ids``, ``attention_mask`` -> ``text_embeds``) with dynamic batch
and sequence axes, the source's tokenizer, image processor and ``config.json`` files unchanged,
and ``mmchaos_export.json``: the source URI and fingerprint, the hashes the exported components
must keep (so a swapped tokenizer or processor is caught later), the export settings and the
torch-vs-ONNX Runtime differences measured at export.

``dtype="float16"`` is the half-precision graph a GPU deployment serves: the float32 export
converted by ONNX Runtime's own converter (``onnxruntime.transformers.float16``, the one its
transformer optimiser uses), graph inputs and outputs included, so the processor's float32
pixels must be cast at the boundary (the ``onnx:`` target does; ``backend_differential`` reports
it). Converting the exported graph, rather than exporting a ``.half()`` model, is what works on the
CPU: torch's half-precision tracing leaves mixed float types in LayerNormalization that ONNX
Runtime refuses to load.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from mmchaos._lazy import require
from mmchaos.errors import CapabilityError, ConfigError, TargetCallError
from mmchaos.guard.artefacts import package_versions
from mmchaos.targets.base import (
    CONFIG_FILES,
    PROCESSOR_FILES,
    TOKENIZER_FILES,
    Capability,
    Target,
    component_hashes,
)
from mmchaos.targets.onnx import IMAGE_FILE, MANIFEST, TEXT_FILE, OnnxTarget

__all__ = [
    "EXPORT_DTYPES",
    "IMAGE_FILE",
    "MANIFEST",
    "PROCESSOR_FILES",
    "TEXT_FILE",
    "TOKENIZER_FILES",
    "ExportDtype",
    "ExportResult",
    "export_onnx",
    "export_towers",
    "towers",
]

ExportDtype = Literal["float32", "float16"]
EXPORT_DTYPES: tuple[ExportDtype, ...] = ("float32", "float16")

RECORD_FILES = ("training.json",)  # what the weights were validated at (the fingerprint check reads it)


@dataclass
class ExportResult:
    directory: Path
    files: dict[str, str]
    manifest: dict[str, Any]
    differences: dict[str, float] = field(default_factory=dict)


def _features(out: Any) -> Any:
    return out if hasattr(out, "detach") else out.pooler_output


def towers(model: Any) -> tuple[Any, Any]:
    torch = require("torch")

    class ImageTower(torch.nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: Any) -> Any:
            return _features(self.model.get_image_features(pixel_values=pixel_values))

    class TextTower(torch.nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return _features(self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask))

    return ImageTower().eval(), TextTower().eval()


def _sample_images() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (64, 80, 3), dtype=np.uint8), rng.integers(0, 256, (90, 60, 3), dtype=np.uint8)]


_SAMPLE_TEXTS = ("a photo", "a photo of a small red circle at the top left on a white background")


def _require_white_box(target: Target) -> Any:
    if not target.has(Capability.TORCH_MODULE):
        raise CapabilityError(f"{target.uri} gives no torch module to export (only white-box targets export)")
    missing = [m for m in ("preprocess_images", "tokenize") if not callable(getattr(target, m, None))]
    if missing:
        raise CapabilityError(f"{target.uri} has no {' / '.join(missing)}: mmchaos exports HF contrastive targets")
    return target.torch_module()


def to_float16(path: Path) -> None:
    """Convert the ONNX graph at ``path`` to float16 in place, its inputs and outputs included."""
    onnx = require("onnx")
    try:
        from onnxruntime.transformers.float16 import convert_float_to_float16
    except ImportError as exc:
        raise ConfigError(
            f"--dtype float16 needs onnxruntime's float16 converter ({exc}): pip install 'mmchaos[onnx]'",
            code="export_dtype_unavailable",
        ) from exc
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the converter warns of every value it clamps to fp16's range
        onnx.save(convert_float_to_float16(onnx.load(str(path)), keep_io_types=False), str(path))


def export_towers(
    target: Target, directory: Path, *, opset: int = 17, dtype: ExportDtype = "float32"
) -> dict[str, str]:
    """Write the ONNX graphs only; returns {"image": path, "text": path} for what was exported."""
    if dtype not in EXPORT_DTYPES:
        raise ConfigError(f"export dtype {dtype!r}: choose one of {', '.join(EXPORT_DTYPES)}", code="bad_export_dtype")
    torch = require("torch")
    require("onnx")
    model = _require_white_box(target)
    image_tower, text_tower = towers(model)
    directory.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            if target.has(Capability.EMBED_IMAGE):
                pixels = target.preprocess_images(_sample_images())  # type: ignore[attr-defined]
                torch.onnx.export(
                    image_tower,
                    (pixels,),
                    str(directory / IMAGE_FILE),
                    dynamo=False,
                    input_names=["pixel_values"],
                    output_names=["image_embeds"],
                    dynamic_axes={"pixel_values": {0: "batch"}, "image_embeds": {0: "batch"}},
                    opset_version=opset,
                )
                files["image"] = IMAGE_FILE
            if target.has(Capability.EMBED_TEXT):
                enc = target.tokenize(list(_SAMPLE_TEXTS))  # type: ignore[attr-defined]
                # int64 ids and mask, as every HF tokenizer hands them over, whatever this pipeline's
                # tokenizer gives (backend_differential reports a pipeline feeding another type)
                ids, mask = (torch.as_tensor(enc[k]).to(torch.int64) for k in ("input_ids", "attention_mask"))
                torch.onnx.export(
                    text_tower,
                    (ids, mask),
                    str(directory / TEXT_FILE),
                    dynamo=False,
                    input_names=["input_ids", "attention_mask"],
                    output_names=["text_embeds"],
                    dynamic_axes={
                        "input_ids": {0: "batch", 1: "sequence"},
                        "attention_mask": {0: "batch", 1: "sequence"},
                        "text_embeds": {0: "batch"},
                    },
                    opset_version=opset,
                )
                files["text"] = TEXT_FILE
        except Exception as exc:
            raise TargetCallError(f"torch.onnx.export failed for {target.uri}: {type(exc).__name__}: {exc}",
                                  code="export_failed") from exc  # fmt: skip
    if dtype == "float16":
        for name in files.values():
            to_float16(directory / name)
    return files


def _copy_preprocessing(target: Target, directory: Path) -> None:
    source = getattr(target, "path", None)
    if isinstance(source, Path) and source.is_dir():
        for name in (*TOKENIZER_FILES, *PROCESSOR_FILES, *CONFIG_FILES, *RECORD_FILES):
            if (source / name).is_file():
                shutil.copy2(source / name, directory / name)
        return
    for attr in ("tokenizer", "image_processor"):
        obj = getattr(target, attr, None)
        if obj is not None and hasattr(obj, "save_pretrained"):
            obj.save_pretrained(str(directory))
    model = target.torch_module()
    if hasattr(model, "config") and hasattr(model.config, "to_json_file"):
        model.config.to_json_file(str(directory / "config.json"))


def _differences(target: Target, directory: Path) -> dict[str, float]:
    """Max |torch - ONNX Runtime| on the export's own sample inputs, end to end."""

    exported = OnnxTarget(str(directory))
    out: dict[str, float] = {}
    if exported.has(Capability.EMBED_IMAGE):
        imgs = _sample_images()
        out["image_max_abs_diff"] = float(np.abs(exported.embed_images(imgs) - target.embed_images(imgs)).max())
    if exported.has(Capability.EMBED_TEXT):
        texts = list(_SAMPLE_TEXTS)
        out["text_max_abs_diff"] = float(np.abs(exported.embed_texts(texts) - target.embed_texts(texts)).max())
    exported.close()
    return out


def export_onnx(
    target: Target,
    directory: Path | str,
    *,
    opset: int = 17,
    overwrite: bool = False,
    validate: bool = True,
    dtype: ExportDtype = "float32",
) -> ExportResult:
    """Export ``target`` to ``directory`` (see the module docstring); refuses a non-empty directory
    unless ``overwrite``."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"export destination {directory} is a file")
    if directory.is_dir() and any(directory.iterdir()) and not overwrite:
        raise ConfigError(f"export destination {directory} is not empty (pass --force to overwrite it)")
    _require_white_box(target)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mmchaos-export-", dir=directory.parent) as tmp:
        staging = Path(tmp)
        files = export_towers(target, staging, opset=opset, dtype=dtype)
        _copy_preprocessing(target, staging)
        for old in (IMAGE_FILE, TEXT_FILE, MANIFEST):
            (directory / old).unlink(missing_ok=True)
        for item in staging.iterdir():
            shutil.move(str(item), directory / item.name)
    model = target.torch_module()
    text_cfg = getattr(getattr(model, "config", None), "text_config", None)
    manifest: dict[str, Any] = {
        "format": "mmchaos-onnx-export",
        "version": 1,
        "source": {"uri": target.uri, "fingerprint": target.fingerprint().to_dict()},
        "files": files,
        "inputs": {"image": ["pixel_values"], "text": ["input_ids", "attention_mask"]},
        "outputs": {"image": "image_embeds", "text": "text_embeds"},
        "dynamic_axes": {"pixel_values": ["batch"], "input_ids": ["batch", "sequence"]},
        "opset": opset,
        "dtype": dtype,
        "exporter": "torch.onnx.export(dynamo=False)"
        + (", then onnxruntime.transformers.float16 (inputs and outputs too)" if dtype == "float16" else ""),
        "max_text_tokens": getattr(target, "max_text_tokens", None)
        or getattr(text_cfg, "max_position_embeddings", None),
        "text_padding": getattr(target, "text_padding", True),
        "expected_components": component_hashes(directory),
        "versions": package_versions("torch", "onnx", "onnxruntime", "transformers", "tokenizers", "numpy"),
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    diffs = _differences(target, directory) if validate else {}
    if diffs:
        manifest["validation"] = diffs
        (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return ExportResult(directory=directory, files=files, manifest=manifest, differences=diffs)


def onnx_input_dims(path: Path) -> dict[str, list[str | int]]:
    """Each graph input's dimensions: an int when fixed, the axis name when dynamic."""
    onnx = require("onnx")
    model = onnx.load(str(path), load_external_data=False)
    out: dict[str, list[str | int]] = {}
    for inp in model.graph.input:
        dims: Sequence[Any] = inp.type.tensor_type.shape.dim
        out[inp.name] = [d.dim_param or int(d.dim_value) for d in dims]
    return out
