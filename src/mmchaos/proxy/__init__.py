"""The fault proxy: toxiproxy-compatible TCP toxics, HTTP faults, its control API and echo upstreams.

    from mmchaos.proxy import FaultProxy, ProxyThread, ControlServer

Names load on first access: ``import mmchaos.proxy`` costs almost nothing, and the proxy needs
only the standard library, pydantic and prometheus-client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mmchaos._lazy import lazy_exports

if TYPE_CHECKING:
    from mmchaos.proxy.config import (
        HTTP_TOXIC_TYPES,
        TCP_TOXIC_TYPES,
        TOXIC_TYPES,
        ProxyConfig,
        Toxic,
        ToxicsFile,
        load_toxics_file,
        parse_toxic,
    )
    from mmchaos.proxy.control import ControlServer, render_metrics
    from mmchaos.proxy.echo import EchoHTTPServer, TcpEchoServer
    from mmchaos.proxy.proxy import FaultProxy, ProxyStats
    from mmchaos.proxy.thread import ProxyThread

__all__ = [
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
        "mmchaos.proxy.config",
    ),
    **dict.fromkeys(["ControlServer", "render_metrics"], "mmchaos.proxy.control"),
    **dict.fromkeys(["EchoHTTPServer", "TcpEchoServer"], "mmchaos.proxy.echo"),
    **dict.fromkeys(["FaultProxy", "ProxyStats"], "mmchaos.proxy.proxy"),
    "ProxyThread": "mmchaos.proxy.thread",
}

__getattr__, __dir__ = lazy_exports("mmchaos.proxy", _MODULE_OF, globals())
