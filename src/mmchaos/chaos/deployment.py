"""The deployment under test: an ``openai:`` endpoint as it is, or the reference server started
here over an in-process target; a fault proxy in front of either.

Kept apart from the experiment so its teardown (every fault removed, the proxy and server stopped,
their ports and threads checked gone) can be read and tested on its own.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from mmchaos.errors import ConfigError
from mmchaos.server.config import ServerConfig
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.wrappers import unwrap

if TYPE_CHECKING:
    from mmchaos.proxy.thread import ProxyThread

__all__ = ["Deployment", "port_open"]


def port_open(host: str, port: int) -> bool:
    """Whether something still accepts connections on ``host:port`` (the teardown's last check)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.settimeout(0.5)
        return s.connect_ex((host.strip("[]"), port)) == 0


class Deployment:
    """What the experiment talks to: the ``openai:`` endpoint as is, or the reference server started
    here over the in-process target; with a fault proxy in front. ``close()`` always tears down."""

    def __init__(
        self,
        target: Target,
        server_config: ServerConfig,
        *,
        proxy: bool = True,
        seed: int = 0,
        loopback_only: bool = True,
        served: Target | None = None,
    ) -> None:
        self.target = unwrap(target)
        self.served = served
        self.server_config = server_config
        self.want_proxy = proxy
        self.seed = seed
        self.loopback_only = loopback_only
        self.server: Any = None
        self.proxy: ProxyThread | None = None
        self.root = ""  # scheme://host:port of the service itself
        self.prefix = "/v1"
        self.model = "default"
        self.auth: dict[str, str] = {}
        self.in_process = False
        self.events: list[dict[str, Any]] = []
        self._threads_before: set[int] = set()
        self._ports: list[tuple[str, int, str]] = []

    @property
    def capabilities(self) -> frozenset[Capability]:
        return self.target.capabilities

    @property
    def url(self) -> str:
        """Where the load goes: the proxy when there is one, else the service."""
        return self.proxy.url if self.proxy is not None else self.root

    def start(self) -> Deployment:
        from mmchaos.targets.openai_http import OpenAITarget, check_endpoint

        self._threads_before = {t.ident for t in threading.enumerate() if t.ident is not None}
        if isinstance(self.target, OpenAITarget):
            url, host_header = check_endpoint(self.target.base_url, allow_remote=not self.loopback_only)
            if host_header is not None:
                self.auth["Host"] = host_header
            parts = urlsplit(url)
            self.root = f"{parts.scheme}://{parts.netloc}"
            self.prefix = parts.path.rstrip("/")
            self.model = self.target.model
            key = os.environ.get(self.target.api_key_env)
            if key:
                self.auth["Authorization"] = f"Bearer {key}"
            self.events.append({"action": "use_endpoint", "endpoint": self.target.base_url, "model": self.model})
        else:
            from mmchaos.server import ServerThread

            served = self.served if self.served is not None else self.target
            self.server = ServerThread(served, self.server_config, graceful_timeout=5.0).start()
            self.in_process = True
            self.root = self.server.url
            self.model = self.server.state.model_name
            self._ports.append(("127.0.0.1", int(self.server.port), "server"))
            self.events.append(
                {"action": "start_server", "url": self.root, "target": self.target.uri, "model": self.model}
            )
        if self.want_proxy:
            from mmchaos.proxy.thread import ProxyThread

            parts = urlsplit(self.root)
            if parts.scheme != "http":
                raise ConfigError("the fault proxy speaks plain HTTP only; point the target at an http:// URL")
            upstream = parts.netloc
            proxy = ProxyThread(upstream, seed=self.seed, name="serving", allow_remote=not self.loopback_only)
            proxy.start()
            self.proxy = proxy
            host, port = proxy.address
            self._ports.append((host, int(port), "proxy"))
            self.events.append({"action": "start_proxy", "listen": proxy.listen, "upstream": upstream})
        return self

    def close(self) -> dict[str, Any]:
        """Remove every fault, stop the proxy and the server; report what (if anything) is left."""
        out: dict[str, Any] = {}
        if self.proxy is not None:
            with contextlib.suppress(Exception):
                left = [t.name for t in self.proxy.toxics]
                self.proxy.clear_toxics()
                out["toxics_removed"] = left
            self.proxy.stop()
            self.proxy = None
            out["proxy_stopped"] = True
        if self.server is not None:
            self.server.stop(timeout=10.0)
            self.server = None
            out["server_stopped"] = True
        deadline = time.monotonic() + 3.0
        listening = [f"{what} {h}:{p}" for h, p, what in self._ports if port_open(h, p)]
        while listening and time.monotonic() < deadline:
            time.sleep(0.05)
            listening = [f"{what} {h}:{p}" for h, p, what in self._ports if port_open(h, p)]
        threads = self.leftover_threads()
        while threads and time.monotonic() < deadline:
            time.sleep(0.05)
            threads = self.leftover_threads()
        out["still_listening"] = listening
        out["threads_left"] = threads
        out["clean"] = not listening and not threads
        return out

    def leftover_threads(self) -> list[str]:
        """Threads this deployment started (the proxy's; the server's and its workers' when in-process)."""
        owned = (
            ("mmchaos-proxy-serving", "mmchaos-server-", "mmchaos-serve_")
            if self.in_process
            else ("mmchaos-proxy-serving",)
        )
        return sorted(
            t.name
            for t in threading.enumerate()
            if t.ident not in self._threads_before and t.is_alive() and t.name.startswith(owned)
        )

    def add_toxic(self, toxic: Mapping[str, Any]) -> str:
        if self.proxy is None:
            raise RuntimeError("this deployment has no fault proxy")
        return self.proxy.add_toxic(dict(toxic)).name

    def clear_toxics(self) -> list[str]:
        if self.proxy is None:
            return []
        names = [t.name for t in self.proxy.toxics]
        self.proxy.clear_toxics()
        return names
