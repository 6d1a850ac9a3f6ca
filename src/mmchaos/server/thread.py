"""Run the reference server with uvicorn: in a background thread (tests, the serving suite) or in
the foreground (``mmchaos serve``), always with graceful shutdown.

Graceful shutdown is uvicorn's: stop accepting, let every in-flight request finish (answers sent
in full), close idle keep-alive connections, then the app's shutdown waits for model calls still
running. ``/readyz`` answers 503 from the moment shutdown starts, so a load balancer drains first.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from mmchaos.errors import UsageError
from mmchaos.net import require_loopback
from mmchaos.server.app import create_app
from mmchaos.server.config import ServerConfig
from mmchaos.server.core import GuardedServer
from mmchaos.targets.base import Target

__all__ = ["ServerThread", "bind", "serve"]


def bind(host: str, port: int, *, allow_remote: bool = False) -> socket.socket:
    """A listening-ready TCP socket on ``host:port`` (port 0: a free one), or a UsageError.

    A host that is not loopback (``0.0.0.0`` and ``::`` included: every interface) is refused with
    :data:`~mmchaos.net.REMOTE_REFUSED` unless ``allow_remote``: the rule of ``proxy`` and ``openai:``.
    """
    if not allow_remote:
        require_loopback(host, what="--host")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UsageError(f"cannot resolve host {host!r}: {exc.strerror}", code="listen_failed") from exc
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", code="listen_failed") from exc
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, telling the app when shutdown starts (so /readyz turns 503 at once)."""

    def __init__(
        self, config: uvicorn.Config, state: GuardedServer | None, on_started: Callable[[], object] | None = None
    ) -> None:
        super().__init__(config)
        self.mmchaos = state
        self.on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_started is not None:
            self.on_started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # uvicorn's own handler, except that the signal is not re-raised after the graceful
        # shutdown: SIGTERM ends the process with exit code 0 once every request got its answer.
        self.begin_shutdown()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True

    def begin_shutdown(self) -> None:
        if self.mmchaos is not None:
            self.mmchaos.draining = True


class _HeaderDeadlineH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline on reading a request's headers (slowloris).

    uvicorn times out idle keep-alive connections only between requests; a client that opens a
    connection and sends its headers a byte at a time holds it forever. Here a connection waiting
    for a request (h11's ``IDLE``) gets ``header_timeout`` seconds from its first byte (or from
    connecting) to complete the headers, then it is closed without an answer. The body has its own
    deadline in the app (``body_timeout``, answered 408).
    """

    header_timeout = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        if self._header_deadline is None:
            self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._arm()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def _h11_with_header_timeout(seconds: float) -> type[H11Protocol]:
    return type("HeaderDeadlineH11", (_HeaderDeadlineH11,), {"header_timeout": seconds})


def _uvicorn_config(app: FastAPI, graceful_timeout: float | None, log_level: str) -> uvicorn.Config:
    state: GuardedServer | None = getattr(app.state, "mmchaos", None)
    limits: dict[str, Any] = {}
    if state is not None:
        cfg = state.config
        limits = {
            "http": _h11_with_header_timeout(cfg.header_timeout),
            "timeout_keep_alive": cfg.keep_alive_timeout,
            "h11_max_incomplete_event_size": cfg.max_header_bytes,
        }
    return uvicorn.Config(
        app,
        lifespan="on",
        log_config=None,  # leave the process's logging alone
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=None if graceful_timeout is None else max(1, round(graceful_timeout)),
        server_header=False,
        **limits,
    )


def _as_app(app_or_target: FastAPI | Target, config: ServerConfig | None) -> FastAPI:
    if isinstance(app_or_target, Target):
        return create_app(app_or_target, config)
    if config is not None:
        raise UsageError("give the config to create_app, not to the server, when passing an app")
    return app_or_target


class ServerThread:
    """The server on a loopback port in a background thread; ``with ServerThread(target) as srv:``.

    ``srv.url`` is ``http://127.0.0.1:PORT`` and ``srv.base_url`` the OpenAI base URL (``.../v1``).
    ``stop()`` shuts down gracefully: requests in flight get their answers.
    """

    def __init__(
        self,
        app_or_target: FastAPI | Target,
        config: ServerConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        graceful_timeout: float | None = 60.0,
        log_level: str = "warning",
        allow_remote: bool = False,
    ) -> None:
        self.app = _as_app(app_or_target, config)
        self.allow_remote = allow_remote
        self.host = host
        self.port = port
        self.graceful_timeout = graceful_timeout
        self.log_level = log_level
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def state(self) -> GuardedServer:
        server: GuardedServer = self.app.state.mmchaos
        return server

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self, timeout: float = 30.0) -> ServerThread:
        if self._thread is not None:
            raise UsageError("this server thread was already started")
        sock = bind(self.host, self.port, allow_remote=self.allow_remote)
        self.port = int(sock.getsockname()[1])
        state = getattr(self.app.state, "mmchaos", None)
        server = _Server(_uvicorn_config(self.app, self.graceful_timeout, self.log_level), state)
        self._server = server

        def run() -> None:
            try:
                server.run(sockets=[sock])
            except BaseException as exc:  # reported by start() or stop()
                self._error = exc
            finally:
                sock.close()

        self._thread = threading.Thread(target=run, name=f"mmchaos-server-{self.port}", daemon=True)
        self._thread.start()
        end = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > end:
                self.stop(timeout=5.0)
                raise UsageError(f"the server did not start on {self.url}: {self._error!r}", code="listen_failed")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop gracefully: in-flight requests finish; after ``timeout`` seconds, force it."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.begin_shutdown()
        server.should_exit = True
        thread.join(timeout)
        if thread.is_alive():
            server.force_exit = True
            thread.join(10.0)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ServerThread({self.url}, running={self._thread is not None and self._thread.is_alive()})"


def serve(
    target: Target,
    config: ServerConfig | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    graceful_timeout: float | None = 60.0,
    log_level: str = "warning",
    on_ready: Callable[[str], object] | None = None,
    allow_remote: bool = False,
) -> None:
    """Serve ``target`` in the foreground until SIGINT/SIGTERM, then shut down gracefully.

    ``on_ready(url)`` is called once the server accepts connections; a ``host`` that is not
    loopback needs ``allow_remote`` (:func:`bind`).
    """
    sock = bind(host, port, allow_remote=allow_remote)
    app = create_app(target, config)
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    url = f"http://{shown}:{bound[1]}"
    started = None if on_ready is None else (lambda: on_ready(url))
    server = _Server(_uvicorn_config(app, graceful_timeout, log_level), app.state.mmchaos, started)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
