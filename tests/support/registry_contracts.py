"""What the unit and integration halves of ``test_registry_contracts.py`` share.

Those tests: Contract tests over every registered kind: each target scheme, each check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mmchaos.errors import TargetLoadError, UnknownNameError, UsageError

#: (uri, error type, stable code) per scheme; ``{tmp}`` is an empty directory.
REFUSALS: dict[str, list[tuple[str, type[UsageError], str]]] = {
    "builtin": [("builtin:tiny-clipp", UnknownNameError, "unknown_name")],
    "hf": [
        ("hf:/nonexistent/mmchaos-model", TargetLoadError, "target_load_failed"),
        ("hf:{tmp}", TargetLoadError, "target_load_failed"),
    ],
    "py": [
        ("py:tests.no_such_module:factory", TargetLoadError, "target_load_failed"),
        ("py:tests.fakes.targets:not_a_target", TargetLoadError, "target_load_failed"),
        ("py:no_colon", TargetLoadError, "target_load_failed"),
    ],
    "onnx": [
        ("onnx:/nonexistent/mmchaos-export", TargetLoadError, "target_load_failed"),
        ("onnx:{tmp}", TargetLoadError, "target_load_failed"),
    ],
    "openai": [
        ("openai:http://192.0.2.1:8000/v1", TargetLoadError, "remote_not_allowed"),
        ("openai:ftp://127.0.0.1/v1", TargetLoadError, "target_load_failed"),
    ],
}


@contextlib.contextmanager
def _py(tmp: Path) -> Iterator[str]:
    yield "py:tests.fakes.targets:hash_embed"


@contextlib.contextmanager
def _builtin(tmp: Path) -> Iterator[str]:
    pytest.importorskip("transformers")
    yield "builtin:tiny-clip"


@contextlib.contextmanager
def _builtin_ppocr(tmp: Path) -> Iterator[str]:
    pytest.importorskip("rapidocr_onnxruntime")
    yield "builtin:ppocr"


@contextlib.contextmanager
def _hf(tmp: Path) -> Iterator[str]:
    pytest.importorskip("transformers")
    from mmchaos.targets.builtin import TINY_CLIP_DIR

    yield f"hf:{TINY_CLIP_DIR}"


@contextlib.contextmanager
def _onnx(tmp: Path) -> Iterator[str]:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from mmchaos.targets.builtin import TINY_CLIP_DIR
    from mmchaos.targets.export import export_onnx
    from mmchaos.targets.hf import HFContrastiveTarget

    source = HFContrastiveTarget(str(TINY_CLIP_DIR))
    try:
        export_onnx(source, tmp / "export")
    finally:
        source.close()
    yield f"onnx:{tmp / 'export'}"


@contextlib.contextmanager
def _openai(tmp: Path) -> Iterator[str]:
    from mmchaos.server.thread import ServerThread
    from tests.fakes.targets import HashEmbedTarget

    with ServerThread(HashEmbedTarget()) as srv:
        yield f"openai:{srv.base_url}"


#: Per scheme, fixtures that load (context managers giving a URI); all but ``py`` start a real
#: model or server, so they are in the integration tier.
LOADS: dict[str, list[Callable[[Path], contextlib.AbstractContextManager[str]]]] = {
    "py": [_py],
    "builtin": [_builtin, _builtin_ppocr],
    "hf": [_hf],
    "onnx": [_onnx],
    "openai": [_openai],
}

"""PREPROCESS has no method on the Target base: hf and onnx expose ``preprocess_images`` and
``tokenize`` (what the server times), ppocr exposes ``preprocess``. A target that declares it must
expose at least one of them, and each must answer."""
