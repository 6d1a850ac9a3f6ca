"""Where a Hugging Face-style model's files are, and what its ``config.json`` says.

Shared by the contrastive (``hf.py``) and generative (``hf_vlm.py``) loaders and by the ``hf:``
scheme's dispatch between them. Never downloads: a hub id must already be in the local cache.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mmchaos.errors import TargetLoadError
from mmchaos.guard.artefacts import Fingerprint, component_hashes, package_versions

__all__ = ["directory_fingerprint", "drop_length_notice", "local_dir", "quiet_transformers", "read_config"]


def local_dir(source: str) -> Path:
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


def read_config(path: Path) -> dict[str, Any]:
    """``config.json`` of a model directory ({} when absent or unreadable: the loader reports it)."""
    try:
        data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def directory_fingerprint(path: Path) -> Fingerprint:
    """The fingerprint of a transformers model directory, with the libraries that read it."""
    return Fingerprint(
        **component_hashes(path),
        versions=package_versions("torch", "transformers", "tokenizers", "safetensors", "numpy"),
    )


class _NoLengthNotice(logging.Filter):
    """Drops transformers' "Both `max_new_tokens` and `max_length` seem to have been set" notice:
    Janus's ``generate`` passes its own copy of the generation config (default ``max_length`` 20)
    to the generic one, which then says on every request what mmchaos already asks for
    (``max_new_tokens`` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "seem to have been set. `max_new_tokens` will take precedence" not in record.getMessage()


_LENGTH_NOTICE = _NoLengthNotice()


def drop_length_notice() -> None:
    """Install the filter once on transformers' generation logger (a constant filter, so concurrent
    requests need no lock, unlike a verbosity switched around each call)."""
    logger = logging.getLogger("transformers.generation.utils")
    if _LENGTH_NOTICE not in logger.filters:
        logger.addFilter(_LENGTH_NOTICE)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' warnings held back for a load: its report of missing or unexpected weights is
    a multi-line table, and mmchaos states the same facts in one line (a refusal or a warning)."""
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
