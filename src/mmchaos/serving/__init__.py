"""Serving chaos: the fault proxy, its control API, the load driver and a tiny echo upstream.

    from mmchaos.serving import FaultProxy, ProxyThread, LoadDriver, LoadConfig, embeddings_mix

Names load on first access: ``import mmchaos.serving`` costs almost nothing, the proxy needs
only the standard library, pydantic and prometheus-client, and only the load driver needs
``httpx`` (imported when a run starts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mmchaos._lazy import lazy_exports

if TYPE_CHECKING:
    from mmchaos.serving.config import (
        HTTP_TOXIC_TYPES,
        TCP_TOXIC_TYPES,
        TOXIC_TYPES,
        ProxyConfig,
        Toxic,
        ToxicsFile,
        load_toxics_file,
        parse_toxic,
    )
    from mmchaos.serving.control import ControlServer, render_metrics
    from mmchaos.serving.echo import EchoHTTPServer, TcpEchoServer
    from mmchaos.serving.load import (
        ERROR_KINDS,
        LatencySummary,
        LoadConfig,
        LoadDriver,
        LoadRequest,
        LoadResult,
        MixEntry,
        PayloadMix,
        RequestRecord,
        embeddings_mix,
        ensure_loopback,
        run_load,
    )
    from mmchaos.serving.proxy import FaultProxy, ProxyStats, ProxyThread

__all__ = [
    "ERROR_KINDS",
    "HTTP_TOXIC_TYPES",
    "TCP_TOXIC_TYPES",
    "TOXIC_TYPES",
    "ControlServer",
    "EchoHTTPServer",
    "FaultProxy",
    "LatencySummary",
    "LoadConfig",
    "LoadDriver",
    "LoadRequest",
    "LoadResult",
    "MixEntry",
    "PayloadMix",
    "ProxyConfig",
    "ProxyStats",
    "ProxyThread",
    "RequestRecord",
    "TcpEchoServer",
    "Toxic",
    "ToxicsFile",
    "embeddings_mix",
    "ensure_loopback",
    "load_toxics_file",
    "parse_toxic",
    "render_metrics",
    "run_load",
]

_MODULE_OF = {
    **dict.fromkeys(
        [
            "HTTP_TOXIC_TYPES",
            "TCP_TOXIC_TYPES",
            "TOXIC_TYPES",
            "ProxyConfig",
            "Toxic",
            "ToxicsFile",
            "load_toxics_file",
            "parse_toxic",
        ],
        "mmchaos.serving.config",
    ),
    **dict.fromkeys(["ControlServer", "render_metrics"], "mmchaos.serving.control"),
    **dict.fromkeys(["EchoHTTPServer", "TcpEchoServer"], "mmchaos.serving.echo"),
    **dict.fromkeys(
        [
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
        ],
        "mmchaos.serving.load",
    ),
    **dict.fromkeys(["FaultProxy", "ProxyStats", "ProxyThread"], "mmchaos.serving.proxy"),
}


__getattr__, __dir__ = lazy_exports("mmchaos.serving", _MODULE_OF, globals())
