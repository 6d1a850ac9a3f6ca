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
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from mmchaos.errors import ConfigError
from mmchaos.server.config import ServerConfig
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.openai_forms import ImageForm
from mmchaos.targets.wrappers import DelegatingTarget, unwrap
from mmchaos.timing import ModelClock, clock_of

if TYPE_CHECKING:
    from mmchaos.executors.resources import RunResources
    from mmchaos.proxy.thread import ProxyThread

R = TypeVar("R")

__all__ = ["Deployment", "SharedServer", "port_open"]


class _ClockRouter(DelegatingTarget):
    """The shared server's target: model calls time into the clock of the check holding the server."""

    clock: ModelClock | None = None

    def call(self, fn: Callable[..., R], *args: Any) -> R:
        clock = self.clock
        if clock is None:
            return fn(*args)
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            clock.time(start)


class SharedServer:
    """The run's reference server over one in-process target and config (see :mod:`mmchaos.executors.resources`)."""

    def __init__(self, target: Target, config: ServerConfig) -> None:
        from mmchaos.server import ServerThread

        self.router = _ClockRouter(target)
        self.thread = ServerThread(self.router, config, graceful_timeout=5.0).start()
        self.steady: tuple[float, Any, Any, str] | None = None

    def stop(self) -> None:
        self.thread.stop(timeout=10.0)


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
        resources: RunResources | None = None,
    ) -> None:
        self.target = unwrap(target)
        self.given = target  # the runner's timing wrapper, if any: the server's model calls are model time
        self.served = served
        self.resources = resources
        self.shared: SharedServer | None = None
        self._shared_key: tuple[Any, ...] | None = None
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
        self.image_form: ImageForm = "messages"
        """How images go to ``/embeddings`` here (:mod:`mmchaos.targets.openai_forms`)."""
        self.image_form_source = "the reference server takes 'messages' and 'input'; vLLM's 'messages' is sent"
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
            self.image_form = self.target.image_input
            source = str(self.target.probe.get("source", "declared"))
            self.image_form_source = {
                "probe": "probed by the openai: target (the first form whose answers depend on the pixels)",
                "declared": "declared to the openai: target (image_input)",
            }.get(source, f"the openai: target's {source}")
            key = os.environ.get(self.target.api_key_env)
            if key:
                self.auth["Authorization"] = f"Bearer {key}"
            self.events.append({"action": "use_endpoint", "endpoint": self.target.base_url, "model": self.model})
        else:
            self.in_process = True
            if self.served is None and self.resources is not None:
                self._start_shared(self.resources)
            else:
                from mmchaos.server import ServerThread

                served = self.served if self.served is not None else self.given
                self.server = ServerThread(served, self.server_config, graceful_timeout=5.0).start()
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

    def _start_shared(self, resources: RunResources) -> None:
        key = ("reference_server", id(self.target), self.server_config.model_dump_json())
        fresh: list[bool] = []

        def start() -> SharedServer:
            fresh.append(True)
            return SharedServer(self.target, self.server_config)

        shared = resources.get(key, start, SharedServer.stop)
        shared.router.clock = clock_of(self.given)
        self.shared, self._shared_key = shared, key
        self.root = shared.thread.url
        self.model = shared.thread.state.model_name
        self.events.append(
            {
                "action": "start_server" if fresh else "use_shared_server",
                "url": self.root,
                "target": self.target.uri,
                "model": self.model,
                "shared": "the run's reference server for this target and config, stopped at the run's end",
            }
        )

    @property
    def warm(self) -> bool:
        """Whether the service already answered traffic before this deployment (a shared server)."""
        return self.shared is not None and self.shared.steady is not None

    def recent_steady_state(self, slo: Any, max_age_s: float = 10.0) -> tuple[Any, dict[str, Any]] | None:
        """The shared server's last met steady state, when recent and judged on the same SLO: the
        previous check's "after" probe is this check's "before" (the same server, moments ago)."""
        steady = self.shared.steady if self.shared is not None else None
        if steady is None:
            return None
        at, phase, used_slo, check_id = steady
        age = time.monotonic() - at
        if age > max_age_s or used_slo != slo:
            return None
        return phase, {"reused_from": check_id, "age_s": round(age, 3), "why": "the run's shared server"}

    def remember_steady_state(self, phase: Any, slo: Any, check_id: str) -> None:
        if self.shared is not None:
            self.shared.steady = (time.monotonic(), phase, slo, check_id)

    def close(self, *, healthy: bool = True) -> dict[str, Any]:
        """Remove every fault, stop the proxy and the server; report what (if anything) is left.

        A shared server stays up for the run's next check when ``healthy``, else it is stopped."""
        out: dict[str, Any] = {}
        if self.shared is not None:
            self.shared.router.clock = None
            if healthy:
                out["server"] = "shared by the run: left running for its next check, stopped at its end"
            elif self.resources is not None and self._shared_key is not None:
                self.resources.discard(self._shared_key)
                out["server_stopped"] = True
                out["server"] = "shared by the run: stopped, the next check starts a fresh one"
            self.shared = None
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
            if self.in_process and self._shared_key is None
            else ("mmchaos-proxy-serving",)
        )
        return sorted(
            t.name
            for t in threading.enumerate()
            if t.ident not in self._threads_before and t.is_alive() and t.name.startswith(owned)
        )

    def diagnose(self, timeout: float = 1.0) -> dict[str, Any]:
        """Where a service that stopped answering is stuck: the reference server's admission and
        breaker (read, not awaited), the proxy's connection counters, and whether ``/healthz``
        answers directly and through the proxy within ``timeout``. Never blocks longer than that."""
        import httpx

        out: dict[str, Any] = {}
        server = self.shared.thread if self.shared is not None else self.server
        state = getattr(server, "state", None) if server is not None else None
        if state is not None:
            admission = state.admission
            out["server"] = {
                "active": admission.active,
                "waiting": len(admission.waiters),
                "pixels": admission.pixels,
                "outstanding": state.outstanding,
                "breaker": str(state.breaker.state.value),
            }
        if self.proxy is not None:
            with contextlib.suppress(RuntimeError):
                stats = self.proxy.proxy.stats
                out["proxy"] = {"connections_active": stats.connections_active, "total": stats.connections_total}
        for name, base in (("service", self.root), ("via_proxy", self.url if self.proxy is not None else None)):
            if not base or not self.in_process:
                continue
            started = time.monotonic()
            try:
                with httpx.Client(trust_env=False, timeout=timeout, headers=self.auth) as client:
                    status: int | str = client.get(f"{base}/healthz").status_code
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            out[f"healthz_{name}"] = {"status": status, "seconds": round(time.monotonic() - started, 3)}
        return out

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
