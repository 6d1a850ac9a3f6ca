"""Typed proxy configuration: toxics in toxiproxy's JSON, files, the --toxic shorthand, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import mmchaos.chaos as chaos
import mmchaos.proxy as serving

EXPECTED_ALL = [
    "HTTP_TOXIC_TYPES",
    "TCP_TOXIC_TYPES",
    "TOXIC_TYPES",
    "ControlServer",
    "EchoHTTPServer",
    "FaultProxy",
    "ProxyConfig",
    "ProxyStats",
    "ProxyThread",
    "TcpEchoServer",
    "Toxic",
    "ToxicsFile",
    "load_toxics_file",
    "parse_toxic",
    "render_metrics",
]

EXPECTED_CHAOS_ALL = [
    "ERROR_KINDS",
    "LatencySummary",
    "LoadConfig",
    "LoadDriver",
    "LoadRequest",
    "LoadResult",
    "MixEntry",
    "PayloadMix",
    "RequestRecord",
    "embeddings_mix",
    "ensure_loopback",
    "run_load",
]


@pytest.mark.integration  # a child interpreter
def test_public_surface_is_pinned_and_lazy() -> None:
    assert serving.__all__ == EXPECTED_ALL
    assert chaos.__all__ == EXPECTED_CHAOS_ALL
    for name in EXPECTED_ALL:
        assert getattr(serving, name) is not None
    for name in EXPECTED_CHAOS_ALL:
        assert getattr(chaos, name) is not None
    code = (
        "import json, sys, mmchaos.proxy as s; s.FaultProxy; s.ControlServer; "
        "print(json.dumps(sorted(m for m in ('httpx', 'torch') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []  # the proxy needs neither httpx nor torch
