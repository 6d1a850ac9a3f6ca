"""The control API: toxiproxy's REST API (JSON over HTTP) plus Prometheus ``/metrics``.

    GET    /version
    GET    /proxies                          {name: proxy}
    POST   /proxies                          create {name, listen, upstream, enabled}
    POST   /populate                         create or replace a list of proxies
    GET    /proxies/{proxy}
    POST   /proxies/{proxy}                  {"enabled": bool} (PATCH too)
    DELETE /proxies/{proxy}
    GET    /proxies/{proxy}/toxics
    POST   /proxies/{proxy}/toxics           add {name, type, stream, toxicity, attributes}
    GET    /proxies/{proxy}/toxics/{toxic}
    POST   /proxies/{proxy}/toxics/{toxic}   update (attributes merge; PATCH too)
    DELETE /proxies/{proxy}/toxics/{toxic}
    POST   /reset                            enable every proxy, remove every toxic
    GET    /metrics                          Prometheus text format

Errors are toxiproxy's ``{"error": message, "status": http_status}`` with mmchaos's stable ``"code"``
added; each code's one status is in :mod:`mmchaos.error_codes` (docs/error-codes.md).

Like toxiproxy, it refuses what a web page could send: any request from a ``Mozilla/`` user agent
or with an ``Origin`` other than its own (403 ``control_browser_refused``), any request whose ``Host``
is not a loopback name (403 ``control_host_refused``: DNS rebinding), and request bodies that are not
JSON by their Content-Type (415 ``control_unsupported_media_type``; a form or ``text/plain`` POST
needs no CORS preflight). Bodies are strict JSON (no ``NaN``/``Infinity``), at most
:data:`MAX_JSON_DEPTH` deep, and every value is validated and bounded before it reaches a proxy.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import unquote, urlsplit

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from mmchaos.errors import ConfigError, MMChaosError, UnknownNameError
from mmchaos.net import is_loopback_address, literal_ip, require_loopback, require_loopback_async
from mmchaos.proxy._http import HttpServer, Request, Response
from mmchaos.proxy.config import ProxyConfig
from mmchaos.proxy.proxy import FaultProxy

__all__ = ["MAX_JSON_DEPTH", "ControlServer", "render_metrics"]

MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects a control request body may have (toxiproxy's need 3)."""

_UPDATE_METHODS = ("POST", "PATCH")  # toxiproxy takes both for updates


class _ProxyCollector:
    def __init__(self, proxies: Iterable[FaultProxy]) -> None:
        self._proxies = list(proxies)

    def collect(self) -> Iterator[Metric]:
        conns = CounterMetricFamily("mmchaos_proxy_connections", "Client connections accepted", labels=["proxy"])
        active = GaugeMetricFamily("mmchaos_proxy_connections_active", "Client connections open now", labels=["proxy"])
        errors = CounterMetricFamily(
            "mmchaos_proxy_upstream_errors", "Connections whose upstream could not be reached", labels=["proxy"]
        )
        received = CounterMetricFamily(
            "mmchaos_proxy_received_bytes", "Bytes read, by direction", labels=["proxy", "direction"]
        )
        sent = CounterMetricFamily(
            "mmchaos_proxy_sent_bytes", "Bytes forwarded, by direction", labels=["proxy", "direction"]
        )
        faults = CounterMetricFamily(
            "mmchaos_proxy_faults",
            "Faults applied: TCP toxics per connection they hold, HTTP toxics per response",
            labels=["proxy", "toxic", "type"],
        )
        enabled = GaugeMetricFamily("mmchaos_proxy_enabled", "1 while the proxy accepts connections", labels=["proxy"])
        toxics = GaugeMetricFamily("mmchaos_proxy_toxics", "Toxics configured now", labels=["proxy"])
        for proxy in self._proxies:
            s = proxy.snapshot()
            conns.add_metric([proxy.name], s.connections_total)
            active.add_metric([proxy.name], s.connections_active)
            errors.add_metric([proxy.name], s.upstream_errors)
            for direction in ("upstream", "downstream"):
                received.add_metric([proxy.name, direction], s.received[direction])
                sent.add_metric([proxy.name, direction], s.sent[direction])
            for (toxic, kind), n in sorted(s.faults.items()):
                faults.add_metric([proxy.name, toxic, kind], n)
            enabled.add_metric([proxy.name], 1.0 if proxy.enabled else 0.0)
            toxics.add_metric([proxy.name], len(proxy.toxics))
        yield from (conns, active, errors, received, sent, faults, enabled, toxics)


def render_metrics(proxies: Iterable[FaultProxy]) -> bytes:
    """The proxies' counters in the Prometheus text format, from a private registry."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ProxyCollector(proxies))
    return generate_latest(registry)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:30]} overflows a double")
    return value


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth > MAX_JSON_DEPTH:
                break
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _body(req: Request) -> Any:
    """The request body as strict JSON ({} when empty); a ConfigError ``control_bad_json`` otherwise."""
    if not req.body.strip():
        return {}
    try:
        value = json.loads(req.body.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ConfigError(f"request body nests deeper than {MAX_JSON_DEPTH}", code="control_bad_json") from None
    except (ValueError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0][:200]
        raise ConfigError(f"request body is not JSON: {first}", code="control_bad_json") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise ConfigError(f"request body nests deeper than {MAX_JSON_DEPTH}", code="control_bad_json")
    return value


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _loopback_name(host: str) -> bool:
    return host.lower() == "localhost" or (literal_ip(host) and is_loopback_address(host))


def _authority(value: str) -> tuple[str, int] | None:
    """``(host, port)`` of a Host header or an Origin (port 80 when it names none); None when it does not parse."""
    try:
        parts = urlsplit(f"//{value}" if "://" not in value else value)
        return (parts.hostname or "", parts.port or 80)
    except ValueError:
        return None


def _foreign_host(req: Request) -> str | None:
    """Why the request's ``Host`` is not a loopback name, or None when it is.

    DNS rebinding: a page at ``evil.example`` whose name is re-pointed at 127.0.0.1 reaches a loopback
    server under the browser's same-origin rules, but its ``Host`` header still says ``evil.example``.
    Only a loopback name (``localhost`` or a loopback literal) is taken, on any port (an SSH tunnel
    forwards the control port under another number); a request without ``Host`` (HTTP/1.0 tools; no
    browser sends one) is let through.
    """
    value = req.headers.get("host")
    if value is None:
        return None
    parsed = _authority(value.strip())
    if parsed is None or not _loopback_name(parsed[0]):
        return f"Host {value[:100]!r} is not a loopback name"
    return None


def _browser_refusal(req: Request, own_port: int | None) -> Response | None:
    """toxiproxy's rule against requests a web page makes (403), plus a JSON-only body rule (415).

    ``Origin``, when sent, must be this server's own origin (a loopback name on its port): a page on
    another local port (a dev server, a notebook) is a foreign origin like any other.
    """
    if req.headers.get("user-agent", "").startswith("Mozilla/"):
        return Response.error("control_browser_refused", "requests from browsers are refused")
    origin = req.headers.get("origin")
    if origin is not None:
        parsed = _authority(origin)
        if parsed is None or not _loopback_name(parsed[0]) or (own_port is not None and parsed[1] != own_port):
            return Response.error("control_browser_refused", f"requests from origin {origin[:100]!r} are refused")
    if req.body.strip() and not _is_json(req.headers.get("content-type", "")):
        return Response.error(
            "control_unsupported_media_type", "request bodies must be JSON (Content-Type: application/json)"
        )
    return None


class ControlServer(HttpServer):
    """Serves the control API over ``proxies``; proxies created through it are stopped with it."""

    def __init__(
        self, proxies: Iterable[FaultProxy] = (), *, listen: str = "127.0.0.1:8474", allow_remote: bool = False
    ) -> None:
        super().__init__(self._handle, listen=listen, max_body=1 << 20)
        self.allow_remote = allow_remote
        host = self._listen[0]
        if not allow_remote and literal_ip(host):  # host names in start()
            require_loopback(host, what="control")
        self.proxies: dict[str, FaultProxy] = {p.name: p for p in proxies}
        self._owned: set[str] = set()

    async def start(self) -> None:
        if not self.allow_remote:
            await require_loopback_async(self._listen[0], what="control")
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        for name in list(self._owned):
            await self.proxies.pop(name).stop()
        self._owned.clear()

    async def _handle(self, req: Request) -> Response:
        own_port = self.address[1]
        if not self.allow_remote:  # a remote listener is reached by whatever names the machine has
            foreign = _foreign_host(req)
            if foreign is not None:
                return Response.error("control_host_refused", f"{foreign}: refused (DNS rebinding)")
        refusal = _browser_refusal(req, None if self.allow_remote else own_port)
        if refusal is not None:
            return refusal
        try:
            return await self._route(req)
        except MMChaosError as exc:  # the code's status: 400, 403 not loopback, 404 unknown, 409 duplicate
            return Response.error(exc.code, exc.message, fallback=exc.http_status)

    def _proxy(self, name: str) -> FaultProxy:
        try:
            return self.proxies[name]
        except KeyError:
            raise UnknownNameError(f"no proxy named {name!r}", code="proxy_not_found") from None

    async def _route(self, req: Request) -> Response:
        method, path = req.method, req.path
        if path == "/metrics" and method == "GET":
            return Response(200, render_metrics(self.proxies.values()), CONTENT_TYPE_LATEST)
        if path == "/version" and method == "GET":
            from importlib.metadata import PackageNotFoundError, version

            try:
                v = version("mmchaos")
            except PackageNotFoundError:
                v = "unknown"
            return Response.json({"version": v, "api": "toxiproxy-compatible"})
        if path == "/reset" and method == "POST":
            for proxy in self.proxies.values():
                await proxy.reset()
            return Response(204, content_type=None)
        if path == "/populate" and method == "POST":
            body = _body(req)
            if not isinstance(body, list):
                raise ConfigError("populate takes a list of proxies", code="config_invalid_proxy")
            configs = [ProxyConfig.parse(p) for p in body]
            names = [c.name for c in configs]
            if len(set(names)) != len(names):
                raise ConfigError("populate names a proxy twice", code="config_invalid_proxy")
            proxies = [self._new(config) for config in configs]  # every refusal before any change
            created = []
            for proxy in proxies:
                if proxy.name in self.proxies:
                    await self._delete(proxy.name)
                created.append(await self._start(proxy))
            return Response.json({"proxies": [p.to_json() for p in created]}, 201)
        parts = [unquote(p) for p in path.split("/") if p]
        if not parts or parts[0] != "proxies" or len(parts) > 4 or (len(parts) >= 3 and parts[2] != "toxics"):
            return Response.error("control_no_route", f"no route {method} {path}")
        name = parts[1] if len(parts) > 1 else None
        toxic_name = parts[3] if len(parts) > 3 else None
        if name is None:
            if method == "GET":
                return Response.json({n: p.to_json() for n, p in self.proxies.items()})
            if method == "POST":
                body = _body(req)
                if not isinstance(body, dict):
                    raise ConfigError("a proxy must be a JSON object", code="config_invalid_proxy")
                config = ProxyConfig.parse(body)
                if config.name in self.proxies:
                    raise ConfigError(f"proxy {config.name!r} already exists", code="proxy_exists")
                return Response.json((await self._start(self._new(config))).to_json(), 201)
            return Response.error("control_method", f"{method} not allowed on /proxies")
        proxy = self._proxy(name)
        if len(parts) == 2:
            if method == "GET":
                return Response.json(proxy.to_json())
            if method in _UPDATE_METHODS:
                body = _body(req)
                if not isinstance(body, dict) or set(body) - {"enabled", "name", "listen", "upstream"}:
                    raise ConfigError("a proxy update takes 'enabled'", code="config_invalid_proxy")
                for key in ("listen", "upstream"):
                    if key in body and body[key] != getattr(proxy, key):
                        raise ConfigError(
                            f"changing {key} is not supported; delete and re-create", code="config_invalid"
                        )
                if "enabled" in body:
                    if not isinstance(body["enabled"], bool):
                        raise ConfigError("enabled must be true or false", code="config_invalid_proxy")
                    await proxy.set_enabled(body["enabled"])
                return Response.json(proxy.to_json())
            if method == "DELETE":
                await self._delete(name)
                return Response(204, content_type=None)
            return Response.error("control_method", f"{method} not allowed here")
        if toxic_name is None:
            if method == "GET":
                return Response.json([t.model_dump(mode="json") for t in proxy.toxics])
            if method == "POST":
                body = _body(req)
                if not isinstance(body, dict):
                    raise ConfigError("a toxic must be a JSON object", code="config_invalid_toxic")
                return Response.json(proxy.add_toxic(body).model_dump(mode="json"))
            return Response.error("control_method", f"{method} not allowed here")
        if method == "GET":
            return Response.json(proxy.get_toxic(toxic_name).model_dump(mode="json"))
        if method in _UPDATE_METHODS:
            body = _body(req)
            if not isinstance(body, dict):
                raise ConfigError("a toxic update must be a JSON object", code="config_invalid_toxic")
            return Response.json(proxy.update_toxic(toxic_name, body).model_dump(mode="json"))
        if method == "DELETE":
            proxy.remove_toxic(toxic_name)
            return Response(204, content_type=None)
        return Response.error("control_method", f"{method} not allowed here")

    def _new(self, config: ProxyConfig) -> FaultProxy:
        return FaultProxy.from_config(config, allow_remote=self.allow_remote)

    async def _start(self, proxy: FaultProxy) -> FaultProxy:
        await proxy.start()
        self.proxies[proxy.name] = proxy
        self._owned.add(proxy.name)
        return proxy

    async def _delete(self, name: str) -> None:
        proxy = self._proxy(name)
        await proxy.stop()
        del self.proxies[name]
        self._owned.discard(name)
