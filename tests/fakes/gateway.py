"""A FAKE API gateway on a loopback port: it forwards every request to one upstream and strips the
``mmchaos`` block (and ``max_model_len``) from ``GET /v1/models``, as gateways that rebuild the model
list do (LiteLLM-style proxies answer their own ``/models``). A fake because the gateways users run
cannot run here; the upstream behind it is real (``mmchaos serve`` in the tests).

Bodies are forwarded whole (no streaming): enough for embeddings and plain chat requests.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

__all__ = ["stripping_gateway"]

_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


class _Gateway(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.client = httpx.Client(base_url=upstream, timeout=60.0, trust_env=False)
        self.requests: list[str] = []


class _Handler(BaseHTTPRequestHandler):
    server: _Gateway

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.requests.append(f"{self.command} {self.path}")
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
        resp = self.server.client.request(self.command, self.path, content=body, headers=headers)
        content = resp.content
        if self.command == "GET" and self.path.rstrip("/").endswith("/models") and resp.status_code == 200:
            listing = resp.json()
            for card in listing.get("data", []):
                card.pop("mmchaos", None)
                card.pop("max_model_len", None)
            content = json.dumps(listing).encode()
        self.send_response(resp.status_code)
        for key, value in resp.headers.items():
            if key.lower() not in _HOP_HEADERS:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    do_GET = do_POST = _forward


@contextmanager
def stripping_gateway(upstream_root: str) -> Iterator[tuple[str, _Gateway]]:
    """A gateway in front of ``upstream_root`` (``http://host:port``); yields (its base URL, itself)."""
    server = _Gateway(upstream_root)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", server
    finally:
        server.shutdown()
        server.server_close()
        server.client.close()
        thread.join(timeout=5)
