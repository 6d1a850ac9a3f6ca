"""A fork server holding the run's loaded target, so pool workers never import torch or load it again.

A spawned worker (:mod:`mmchaos.executors.pool`) is a fresh interpreter that imports torch and
transformers and loads the target: on tiny-vlm that is as much CPU as the whole quick suite's
model time, and on a small machine it competes with the run's own load. Instead the runner forks
this server once, right after it loaded the target and before any check ran the model: the server
holds the loaded target and, for each worker the pool wants (the first ones and every replacement
of a worker a hostile input killed), forks a child that already has it. The isolation is the
spawned worker's: a process of its own, its memory limit, its stderr log, killed on a hang.

Why a server and not ``fork`` from the run: by the time a worker is replaced, the run has run the
model, and a process forked after torch's OpenMP pool started would hang in its next parallel
region; the server never runs the model, and its children use one intra-op thread, as the shared
pool's spec asks (other specs get spawned workers). Only targets that are models in this process
(``builtin:``, ``hf:``, ``onnx:``) on the CPU are forked (CUDA cannot be used in a forked child):
a ``py:`` or remote target may hold sockets or threads that a child must not share.
``MMCHAOS_FORK_WORKERS=0`` turns it off (spawned workers).

The server is the parent of its workers, so it reaps them and reports each exit status to the run
(:class:`ForkedProcess` gives the pool the ``subprocess.Popen`` calls it uses).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

__all__ = ["FORK_SCHEMES", "ForkServer", "ForkedProcess", "fork_enabled", "held_dataset"]

log = logging.getLogger(__name__)

FORK_SCHEMES = ("builtin", "hf", "onnx")
"""Targets that are a model in this process (nothing a forked child must not share)."""


def fork_enabled(uri: str) -> bool:
    """Whether the run forks its workers for ``uri`` (Linux, a model target, not turned off)."""
    if not sys.platform.startswith("linux") or os.environ.get("MMCHAOS_FORK_WORKERS", "1") == "0":
        return False
    return uri.partition(":")[0] in FORK_SCHEMES


def _options_key(options: Any) -> str:
    return json.dumps(options or {}, sort_keys=True, default=str)


def _on_accelerator(options: dict[str, Any]) -> bool:
    """Whether the target may hold an accelerator context, which a forked child cannot use (CUDA
    refuses to be re-initialised in a fork): then workers are spawned."""
    if not str(options.get("device", "cpu")).startswith("cpu"):
        return True
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    return bool(cuda is not None and cuda.is_initialized())


# -- the server side (a child of the run) -------------------------------------------------------

_held: dict[str, Any] = {}
"""What the server holds besides the target (the run's dataset), set in the server process only."""


def held_dataset() -> Any:
    """The run's dataset in a forked worker (None in any other process, or when the run gave none)."""
    return _held.get("dataset")



def _serve(sock: socket.socket, target: Any) -> None:
    """Fork a worker for each request; report every worker's exit; leave when the run does."""
    children: set[int] = set()
    try:
        while True:
            ready, _, _ = select.select([sock], [], [], 0.05)
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                children.discard(pid)
                sock.send(json.dumps(["exit", pid, os.waitstatus_to_exitcode(status)]).encode())
            if not ready:
                continue
            msg, fds, _, _ = socket.recv_fds(sock, 4096, 2)
            if not msg or json.loads(msg)[0] == "stop":
                return
            conn_fd, log_fd = fds
            pid = os.fork()
            if pid == 0:
                sock.close()
                _worker(conn_fd, log_fd, target)
            os.close(conn_fd)
            os.close(log_fd)
            children.add(pid)
            sock.send(json.dumps(["spawned", pid]).encode())
    finally:
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _worker(conn_fd: int, log_fd: int, target: Any) -> None:
    """A forked worker: the pool's worker loop on the server's target, stderr to the pool's log."""
    code = 0
    try:
        os.dup2(log_fd, 2)
        os.close(log_fd)
        # Python's stderr (and so faulthandler's trace) on fd 2, whatever the run had made of it
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 - the worker's stderr
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        from multiprocessing.connection import Connection

        from mmchaos.executors.pool import worker_loop

        conn = Connection(conn_fd)
        spec, handler = conn.recv()
        worker_loop(conn, spec, handler, target)
    except BaseException:  # the worker must leave, whatever happened
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


# -- the run side -------------------------------------------------------------------------------


class ForkedProcess:
    """A worker forked by the server, with the ``subprocess.Popen`` calls the pool uses."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def poll(self) -> int | None:
        return self.server.exit_code(self.pid)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        return code

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class ForkServer:
    """The run's fork server for one loaded target (see the module docstring); thread-safe."""

    def __init__(self, pid: int, sock: socket.socket, uri: str, options: Any) -> None:
        self.pid = pid
        self._sock = sock
        self.uri = uri
        self._options = _options_key(options)
        self._lock = threading.Lock()
        self._codes: dict[int, int] = {}
        self._spawned: list[int] = []
        self._alive = True
        self.forks = 0
        """Workers forked so far."""

    @classmethod
    def start(cls, target: Any, dataset: Any = None) -> ForkServer | None:
        """Fork the server now (call it before the run's process runs the model); None if it cannot.

        ``dataset`` (the run's) is held too, so work units on forked workers
        (:mod:`mmchaos.executors.forked`) read the samples without loading the set again."""
        uri = str(getattr(target, "uri", ""))
        options = dict(getattr(target, "load_options", None) or {})
        if not fork_enabled(uri) or _on_accelerator(options):
            return None
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for stream in (sys.stdout, sys.stderr):  # nothing buffered twice
            with contextlib.suppress(Exception):
                stream.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            log.warning("cannot fork a worker server (%s); workers will load the target themselves", exc)
            parent.close()
            child.close()
            return None
        if pid == 0:  # the server: never returns into the run's code
            parent.close()
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the run, which stops the server
            _held["dataset"] = dataset
            try:
                _serve(child, target)
            finally:
                os._exit(0)
        child.close()
        return cls(pid, parent, uri, options)

    def accepts(self, spec: Any) -> bool:
        """Whether a worker for ``spec`` can be forked: the same target and load options, one thread,
        and no fresh process asked for (a cross-process comparison)."""
        return (
            self._alive
            and not getattr(spec, "fresh_process", False)
            and spec.uri == self.uri
            and _options_key(spec.options) == self._options
            and spec.threads == 1
        )

    def _pump(self, timeout: float) -> None:
        """Read what the server sent (exit statuses, spawn replies); the caller holds the lock."""
        while self._alive:
            ready, _, _ = select.select([self._sock], [], [], timeout)
            if not ready:
                return
            try:
                msg = self._sock.recv(4096)
            except OSError:
                msg = b""
            if not msg:
                self._alive = False
                return
            kind, pid, *rest = json.loads(msg)
            if kind == "exit":
                self._codes[pid] = int(rest[0])
            else:
                self._spawned.append(pid)
            timeout = 0.0

    def spawn(self, conn_fd: int, log_fd: int, timeout: float = 30.0) -> ForkedProcess:
        """Fork a worker talking on ``conn_fd``, its stderr on ``log_fd``; OSError if the server is gone."""
        with self._lock:
            if not self._alive:
                raise OSError("the worker server has exited")
            socket.send_fds(self._sock, [json.dumps(["spawn"]).encode()], [conn_fd, log_fd])
            deadline = time.monotonic() + timeout
            while not self._spawned:
                left = deadline - time.monotonic()
                if left <= 0 or not self._alive:
                    self._alive = False
                    raise OSError("the worker server did not answer")
                self._pump(left)
            self.forks += 1
            return ForkedProcess(self, self._spawned.pop(0))

    def exit_code(self, pid: int) -> int | None:
        with self._lock:
            self._pump(0.0)
            code = self._codes.get(pid)
            if code is None and not self._alive:
                # The server is gone: its workers were killed with it (see _serve), or are leaving.
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return -signal.SIGKILL
            return code

    def close(self) -> None:
        """Stop the server (its remaining workers are killed) and reap it."""
        with self._lock:
            if self._alive:
                with contextlib.suppress(OSError):
                    self._sock.send(json.dumps(["stop"]).encode())
            self._alive = False
            self._sock.close()
        for _ in range(200):
            try:
                if os.waitpid(self.pid, os.WNOHANG)[0] != 0:
                    return
            except ChildProcessError:
                return
            time.sleep(0.01)
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
