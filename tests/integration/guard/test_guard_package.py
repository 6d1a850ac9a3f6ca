"""The mmchaos.guard surface: pinned exports, no torch/transformers, lazy and fast import, metrics
registries that never collide, OpenTelemetry spans when the SDK is installed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys, time
start = time.perf_counter()
import mmchaos.guard
bare = time.perf_counter() - start
lazy = sorted(m for m in ("numpy", "PIL", "pydantic", "prometheus_client") if m in sys.modules)
from mmchaos.guard import *
from prometheus_client import CollectorRegistry
Preflight(registry=CollectorRegistry()).text("hi")
CircuitBreaker(registry=CollectorRegistry()).call(len, "x")
DriftMonitor(registry=CollectorRegistry())
BurnRateSLO(name="x", objective=0.99, registry=CollectorRegistry()).record(True)
check_consistency
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "tokenizers", "safetensors"))
print(json.dumps({"bare": bare, "lazy": lazy, "heavy": heavy}))
"""


@pytest.mark.integration
def test_guard_imports_neither_torch_nor_transformers_and_loads_lazily(subprocess_env: dict[str, str]) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=subprocess_env, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["heavy"] == []
    assert report["lazy"] == [], "import mmchaos.guard loads nothing heavy until a name is used"
    assert report["bare"] < 0.5
