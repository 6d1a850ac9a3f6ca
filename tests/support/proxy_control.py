"""What the unit and integration halves of ``test_proxy_control.py`` share.

Those tests: The control API (toxiproxy's REST, plus /metrics), ProxyThread for sync code, and `mmchaos proxy`.
"""

from __future__ import annotations

import socket


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0
