"""Contract tests over the perturbation registry: every registered perturbation, held to the contract.

Builds with defaults, one-line summary, group and source; deterministic under a seed; replays bit
for bit (also from a JSON round trip of its record); severity 0 is the clean input; images keep
dtype, shape and layout (grayscale, RGBA) and move further from clean as severity grows; texts
stay valid UTF-8; multimodal samples keep the fields a perturbation does not own.
"""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.integration  # a child interpreter
def test_perturb_package_does_not_import_torch() -> None:
    modules = "mmchaos.perturb." + ", mmchaos.perturb.".join(
        ["noise", "blur", "weather", "digital", "deployment", "saliency", "typographic", "text", "multimodal",
         "meaning", "textures", "_slic", "_ops"]
    )  # fmt: skip
    code = f"import sys, mmchaos.perturb, {modules}; print([m for m in ('torch', 'transformers') if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
