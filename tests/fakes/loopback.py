"""Serve a fake's socket server on a loopback thread for the length of a ``with`` block.

One place for what every fake OpenAI-compatible server needs around its handler: a daemon thread
that polls often (a short shutdown, so tests do not wait on it), the ``/v1`` base URL of the port
the OS chose, and a shutdown that closes the socket and joins the thread even when the test fails.
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["serving"]


@contextmanager
def serving(server: socketserver.TCPServer, *, name: str | None = None) -> Iterator[str]:
    """Run ``server`` (bound to 127.0.0.1) in a thread; yields its base URL ``http://127.0.0.1:P/v1``."""
    thread = threading.Thread(target=server.serve_forever, name=name, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
