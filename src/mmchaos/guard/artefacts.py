"""What a model directory is made of, and the hashes that identify each part.

One definition of which files make up the weights, tokenizer, processor and config, so a
directory, its ``hf:`` target, its ONNX export and the runtime guards hash alike. Standard
library only: serving code imports it through :mod:`mmchaos.guard`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CONFIG_FILES",
    "PROCESSOR_FILES",
    "TOKENIZER_FILES",
    "WEIGHT_GLOBS",
    "Fingerprint",
    "component_hashes",
    "hash_file",
    "hash_files",
    "package_versions",
]


@dataclass(frozen=True)
class Fingerprint:
    """Hashes that identify exactly what was tested: weights, tokenizer, processor, versions."""

    weights: str = ""
    tokenizer: str = ""
    processor: str = ""
    config: str = ""
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        """One short hash over every component, to compare two targets at a glance."""
        blob = json.dumps(self.to_dict(include_digest=False), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_dict(self, *, include_digest: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "weights": self.weights,
            "tokenizer": self.tokenizer,
            "processor": self.processor,
            "config": self.config,
            "versions": dict(self.versions),
        }
        if include_digest:
            out["digest"] = self.digest
        return out


# Which files of a Hugging Face-style model directory make up each fingerprint component. One
# definition, so a directory, its hf: target, its ONNX export and the guards hash alike.
WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt", "*.onnx")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "spiece.model",
    "vocab.txt",
    "added_tokens.json",
    "chat_template.jinja",  # a VLM's chat template decides where the image placeholders go
    "chat_template.json",
)
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "image_processor_config.json")
CONFIG_FILES = ("config.json", "generation_config.json")


def hash_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def component_hashes(directory: Path) -> dict[str, str]:
    """The weights/tokenizer/processor/config hashes of a model directory (see the file sets above)."""
    return {
        "weights": hash_files(sorted(p for g in WEIGHT_GLOBS for p in directory.glob(g))),
        "tokenizer": hash_files([directory / f for f in TOKENIZER_FILES]),
        "processor": hash_files([directory / f for f in PROCESSOR_FILES]),
        "config": hash_files([directory / f for f in CONFIG_FILES]),
    }


def hash_files(paths: Sequence[Path]) -> str:
    """A sha256 over (name, content hash) of each existing file, order-independent."""
    digest = hashlib.sha256()
    for path in sorted(p for p in paths if p.is_file()):
        digest.update(path.name.encode())
        digest.update(hash_file(path).encode())
    return digest.hexdigest()


def package_versions(*packages: str) -> dict[str, str]:
    """The installed version of each package ("absent" when it is not installed): the
    ``versions`` of a fingerprint, so a report says which libraries read the artefacts."""
    out = {}
    for name in packages:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out
