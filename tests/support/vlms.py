"""Tiny VLMs loaded as ``hf:`` targets once per test module, by family.

Shared by the family-matrix tests (``test_vlm_families.py``) and the generation-check tests: both
load a family on first use, keep it for the module (the checks leave a model as it was), and close
every loaded model at the end of the module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from mmchaos.targets import load_target
from mmchaos.targets.hf_vlm import HFVisionLanguageTarget

__all__ = ["loaded_vlms"]


def loaded_vlms(dirs: Callable[[str], Path]) -> Iterator[Callable[[str], HFVisionLanguageTarget]]:
    """Yield ``family -> loaded hf: target`` (from ``dirs(family)``), then close what was loaded.

    For a module fixture: ``yield from loaded_vlms(tiny_vlm_dirs)``."""
    loaded: dict[str, HFVisionLanguageTarget] = {}

    def get(family: str) -> HFVisionLanguageTarget:
        if family not in loaded:
            target = load_target(f"hf:{dirs(family)}")
            assert isinstance(target, HFVisionLanguageTarget)
            loaded[family] = target
        return loaded[family]

    yield get
    for target in loaded.values():
        target.close()
