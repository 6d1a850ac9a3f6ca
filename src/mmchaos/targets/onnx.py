"""``onnx:<dir>``: an exported contrastive model run by ONNX Runtime, with its HF preprocessing.

The directory is what ``mmchaos export`` writes (see :mod:`mmchaos.targets.export`): ONNX graphs
plus the tokenizer, image processor and config files of the source model. Every check that needs
no white-box access runs against it; its fingerprint can be compared with the one recorded at
export time, so a tokenizer or processor swapped in later is caught.

Unlike the array API of most adapters, this one validates its inputs and refuses bad ones with
typed errors (step 1's contract), so it also serves as a reference adapter.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from mmchaos._lazy import require
from mmchaos.errors import TargetCallError, TargetLoadError
from mmchaos.guard.artefacts import package_versions
from mmchaos.targets.base import Capability, Fingerprint, FloatArray, ImageArray, Target, component_hashes
from mmchaos.targets.decode import check_image_array
from mmchaos.targets.options import SchemeOptions, takes_options

__all__ = [
    "IMAGE_FILE",
    "MANIFEST",
    "TEXT_FILE",
    "OnnxOptions",
    "OnnxTarget",
    "boundary_cast",
    "graph_input_types",
    "load_onnx",
]

log = logging.getLogger(__name__)

# The files of an exported directory (written by :mod:`mmchaos.targets.export`).
MANIFEST = "mmchaos_export.json"
IMAGE_FILE = "image_encoder.onnx"
TEXT_FILE = "text_encoder.onnx"

#: ONNX Runtime's names of tensor element types and the numpy dtype that feeds each.
ORT_ELEMENT_TYPES: dict[str, Any] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
}


def graph_input_types(session: Any) -> dict[str, np.dtype[Any] | None]:
    """Each graph input's element type as a numpy dtype (None for a type mmchaos does not feed)."""
    return {
        i.name: (np.dtype(ORT_ELEMENT_TYPES[i.type]) if i.type in ORT_ELEMENT_TYPES else None)
        for i in session.get_inputs()
    }


def boundary_cast(fed: np.dtype[Any], graph: np.dtype[Any] | None) -> bool:
    """Whether the ``onnx:`` target casts ``fed`` to ``graph`` at the graph's boundary (ONNX Runtime
    itself refuses any mismatch): floats to the graph's float precision (an fp16 export fed the
    processor's float32), integers to a wider integer. Anything else (float ids, a narrowing integer
    cast) is left for ONNX Runtime to refuse. ``backend_differential`` reports every mismatch a
    pipeline feeds, cast or not: a server that feeds the raw tensors fails on it."""
    if graph is None or fed == graph:
        return False
    if fed.kind == "f" and graph.kind == "f":
        return True
    return fed.kind in "iu" and graph.kind == "i" and graph.itemsize >= fed.itemsize


class OnnxOptions(SchemeOptions):
    """``onnx:`` options: where ONNX Runtime runs the graphs, and on how many threads."""

    device: str = "cpu"
    """``cpu`` (CPUExecutionProvider) or ``cuda`` / ``cuda:N`` (CUDAExecutionProvider on device N)."""
    threads: int | None = Field(None, ge=1)
    """ONNX Runtime intra-op threads of each session (None: its default, one per core)."""

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if not re.fullmatch(r"cpu|cuda(:[0-9]+)?", value):
            raise ValueError("ONNX Runtime runs on cpu, cuda or cuda:N")
        return value

    def providers(self) -> list[Any]:
        """The execution providers for :class:`OnnxTarget`, in ONNX Runtime's list form."""
        if self.device == "cpu":
            return ["CPUExecutionProvider"]
        _, _, index = self.device.partition(":")
        return [("CUDAExecutionProvider", {"device_id": int(index or 0)})]


class OnnxTarget(Target):
    """ONNX Runtime sessions for the image and/or text encoder, HF tokenizer and image processor."""

    def __init__(
        self,
        directory: str,
        *,
        uri: str | None = None,
        threads: int | None = None,
        providers: Sequence[Any] = ("CPUExecutionProvider",),
    ) -> None:
        ort = require("onnxruntime")
        transformers = require("transformers")
        self.path = Path(directory).expanduser()
        self.uri = uri or f"onnx:{directory}"
        if not self.path.is_dir():
            raise TargetLoadError(f"onnx target {directory!r} is not a directory")
        manifest_path = self.path / MANIFEST
        try:
            self.manifest: dict[str, Any] = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
        except (OSError, ValueError) as exc:
            raise TargetLoadError(f"unreadable {manifest_path}: {exc}") from exc
        wanted = [p if isinstance(p, str) else p[0] for p in providers]
        missing = [p for p in wanted if p not in ort.get_available_providers()]
        if missing:
            raise TargetLoadError(
                f"this onnxruntime has no {', '.join(missing)} (it has: {', '.join(ort.get_available_providers())}); "
                "install the build for that device (onnxruntime-gpu for cuda) or choose another device",
                code="onnx_provider_missing",
            )
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.threads = threads
        self.sessions: dict[str, Any] = {}
        for kind, name in (("image", IMAGE_FILE), ("text", TEXT_FILE)):
            if (self.path / name).is_file():
                try:
                    self.sessions[kind] = ort.InferenceSession(
                        str(self.path / name), sess_options=options, providers=list(providers)
                    )
                except Exception as exc:  # onnxruntime raises its own untyped errors
                    raise TargetLoadError(f"ONNX Runtime cannot load {self.path / name}: {exc}") from exc
                running = self.sessions[kind].get_providers()
                if running[:1] != wanted[:1]:  # ONNX Runtime falls back to the CPU without a word
                    raise TargetLoadError(
                        f"ONNX Runtime runs {name} on {running[0] if running else 'nothing'}, not {wanted[0]}",
                        code="onnx_provider_missing",
                    )
        if not self.sessions:
            raise TargetLoadError(f"{self.path} holds neither {IMAGE_FILE} nor {TEXT_FILE} (make one: mmchaos export)")
        caps = {Capability.PREPROCESS}
        self.tokenizer: Any = None
        self.image_processor: Any = None
        if "image" in self.sessions:
            caps.add(Capability.EMBED_IMAGE)
            self.image_processor = self._load(transformers.AutoImageProcessor, "image processor")
        if "text" in self.sessions:
            caps.add(Capability.EMBED_TEXT)
            self.tokenizer = self._load(transformers.AutoTokenizer, "tokenizer")
        self.capabilities = frozenset(caps)
        config = self._config()
        limit = self.manifest.get("max_text_tokens") or config.get("text_config", {}).get("max_position_embeddings")
        self.max_text_tokens: int | None = int(limit) if limit else None
        self.text_padding: str | bool = self.manifest.get("text_padding", True)
        self._fingerprint: Fingerprint | None = None

    def _load(self, auto: Any, what: str) -> Any:
        try:
            return auto.from_pretrained(str(self.path), local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:
            raise TargetLoadError(f"cannot load the {what} from {self.path}: {exc}") from exc

    def _config(self) -> dict[str, Any]:
        try:
            data = json.loads((self.path / "config.json").read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    # -- preprocessing, exposed (PREPROCESS) --------------------------------------------------

    def preprocess_images(self, images: Sequence[ImageArray]) -> np.ndarray:
        for i, img in enumerate(images):
            check_image_array(img, i, max_pixels=self.max_image_pixels)
        batch = self.image_processor(
            images=[np.asarray(i) for i in images], return_tensors="np", input_data_format="channels_last"
        )
        return np.ascontiguousarray(batch["pixel_values"], dtype=np.float32)

    def tokenize(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TargetCallError(f"text {i} is {type(t).__name__}, not str", code="bad_text_type")
            try:
                t.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise TargetCallError(
                    f"text {i} holds characters UTF-8 cannot encode ({exc.reason})", code="bad_utf8"
                ) from exc
        # The tokenizer truncates at its own limit, as a deployment that loads it would; a text
        # that still has more tokens than the graph has positions is a typed refusal.
        enc = self.tokenizer(list(texts), padding=self.text_padding, truncation=True, return_tensors="np")
        out = {k: np.asarray(enc[k], dtype=np.int64) for k in ("input_ids", "attention_mask") if k in enc}
        limit = self.max_text_tokens
        if limit and out["input_ids"].shape[-1] > limit:
            mask = out.get("attention_mask", np.ones_like(out["input_ids"]))
            lengths = mask.sum(axis=-1)
            i = int(np.argmax(lengths))
            tok = self.text_limits()["tokenizer"]
            allowed = f"allows {tok}" if tok is not None else "sets no limit"
            raise TargetCallError(
                f"text {i} has {int(lengths[i])} tokens after the tokenizer (which {allowed}), but the model has "
                f"{limit} positions: as shipped, the model fails on it",
                code="text_exceeds_model_positions",
            )
        return out

    def text_limits(self) -> dict[str, int | None]:
        """The text length limit of each stage as shipped (None: the stage sets no limit)."""
        tok_max = getattr(self.tokenizer, "model_max_length", None)
        tokenizer = int(tok_max) if isinstance(tok_max, int) and 0 < tok_max < 1_000_000 else None
        return {"tokenizer": tokenizer, "processor": None, "model": self.max_text_tokens}

    # -- capabilities -------------------------------------------------------------------------

    def _run(self, kind: str, feeds: dict[str, np.ndarray]) -> FloatArray:
        session = self.sessions[kind]
        types = graph_input_types(session)
        ready = {}
        for name, value in feeds.items():
            if name in types:
                graph = types[name]
                ready[name] = value.astype(graph) if graph is not None and boundary_cast(value.dtype, graph) else value
        try:
            out = session.run(None, ready)[0]
        except Exception as exc:  # onnxruntime's errors are untyped
            raise TargetCallError(f"ONNX Runtime failed on the {kind} encoder: {exc}", code="onnx_run_failed") from exc
        return np.ascontiguousarray(out, dtype=np.float32)

    def embed_images(self, images: Sequence[ImageArray]) -> FloatArray:
        if "image" not in self.sessions:
            return super().embed_images(images)
        if not images:
            return np.zeros((0, 0), dtype=np.float32)
        return self._run("image", {"pixel_values": self.preprocess_images(images)})

    def embed_texts(self, texts: Sequence[str]) -> FloatArray:
        if "text" not in self.sessions:
            return super().embed_texts(texts)
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return self._run("text", self.tokenize(texts))

    # -- identity -----------------------------------------------------------------------------

    def fingerprint(self) -> Fingerprint:
        if self._fingerprint is None:
            versions = package_versions("onnxruntime", "transformers", "tokenizers", "numpy")
            self._fingerprint = Fingerprint(**component_hashes(self.path), versions=versions)
        return self._fingerprint

    def recorded_fingerprint(self) -> Fingerprint | None:
        """The component hashes written by ``mmchaos export`` (None for a hand-made directory)."""
        expected = self.manifest.get("expected_components")
        if not isinstance(expected, dict):
            return None
        return Fingerprint(
            weights=str(expected.get("weights", "")),
            tokenizer=str(expected.get("tokenizer", "")),
            processor=str(expected.get("processor", "")),
            config=str(expected.get("config", "")),
        )

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        first = next(iter(self.sessions.values()), None)
        if first is not None:  # read back from the session: what ONNX Runtime runs, not what was asked
            out["runtime"] = {
                "providers": list(first.get_providers()),
                "intra_op_threads": int(first.get_session_options().intra_op_num_threads),
                "input_types": {
                    kind: {k: (str(v) if v is not None else None) for k, v in graph_input_types(sess).items()}
                    for kind, sess in self.sessions.items()
                },
                "dtype": self.manifest.get("dtype", "float32"),
            }
        return out

    def close(self) -> None:
        self.sessions = {}


@takes_options(OnnxOptions)
def load_onnx(rest: str, options: OnnxOptions) -> Target:
    """The ``onnx:`` scheme's factory: ``onnx:<export directory>``."""
    return OnnxTarget(rest, uri=f"onnx:{rest}", threads=options.threads, providers=options.providers())
