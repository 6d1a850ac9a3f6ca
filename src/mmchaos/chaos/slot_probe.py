"""Does a server give back the slot of a client that left mid-stream? Probed from outside, for
servers that export no gauge.

Raw sockets, so the probe decides exactly when a connection closes. Three phases, each bounded in
streams and time:

1. **capacity**: open long streams one after another and keep each open once its first content
   delta came, until one is refused (429/503, any non-200) or gets no first token within the
   admission time; the streams held then are what the server holds at once (or at least ``limit``);
2. **churn**: close them all (each a client leaving mid-stream), then leave mid-stream once more
   than that many times again, one stream after another, each given until the release deadline to
   be admitted;
3. **admission**: as many streams as the server held, at once, each admitted and answered with its
   first token within the admission time, retried while refused until the release deadline.

A server whose slots leak has none left by phase 2 or 3 and refuses (or queues past the time);
one that gives them back admits the same number again.
"""

from __future__ import annotations

import json
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

__all__ = ["METHOD", "Endpoint", "SlotProbe", "leave_mid_stream", "open_stream", "probe_slot_release"]

METHOD = "black-box probe"
"""How a finding judged by this probe names its method (beside ``gauge``)."""

#: A content delta with text in it (the role chunk's ``"content": ""`` does not count).
_FIRST_CONTENT = re.compile(rb'"content"\s*:\s*"[^"]')
#: A finish_reason with a value (the role chunk's ``"finish_reason": null`` does not count): a stream
#: that ends without ``[DONE]`` (transformers serve's) has ended there.
_FINISHED = re.compile(rb'"finish_reason"\s*:\s*"')


class Endpoint(Protocol):
    """Where the streams go (a :class:`~mmchaos.chaos.deployment.Deployment` is one)."""

    root: str
    prefix: str
    auth: dict[str, str]


@dataclass
class Opened:
    """One stream as far as its first content delta: ``admitted`` keeps ``sock`` open."""

    outcome: str
    """``admitted``, ``ended`` (finished before a first delta was read past), ``refused`` (no 200),
    ``slow`` (no first delta within the time), ``failed`` (could not connect or speak)."""
    detail: str
    sock: socket.socket | None = None
    ttft_s: float | None = None
    seen: bytes = b""

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def open_stream(ep: Endpoint, body: dict[str, Any], timeout: float) -> Opened:
    """Send a streamed chat request on a raw socket and read up to its first content delta."""
    parts = urlsplit(ep.root)
    if parts.scheme != "http" or parts.hostname is None:
        return Opened("failed", f"the raw-socket probe speaks plain http only, not {parts.scheme}")
    payload = json.dumps(body).encode()
    # Connection: close, so a server ends a refusal by closing (one that keeps the connection
    # anyway is read to the refusal's end: _refused_in_full).
    headers = {"Host": ep.auth.get("Host", parts.netloc), "Content-Type": "application/json",
               "Content-Length": str(len(payload)), "Connection": "close"}  # fmt: skip
    headers.update({k: v for k, v in ep.auth.items() if k != "Host"})
    head = f"POST {ep.prefix}/chat/completions HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    start = time.perf_counter()
    deadline = start + timeout
    try:
        sock = socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout)
    except OSError as exc:
        return Opened("failed", f"{type(exc).__name__}: {exc}")
    opened = Opened("failed", "", sock)
    try:
        sock.sendall(head.encode("latin-1") + b"\r\n" + payload)
        seen = b""
        while _FIRST_CONTENT.search(seen) is None:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                break
            seen += chunk
            if _refused_in_full(seen):
                break
            if _ended(seen):
                opened.close()
                return Opened("ended", "the stream finished before the client left", seen=seen,
                              ttft_s=time.perf_counter() - start)  # fmt: skip
        opened.seen = seen
        status = seen.split(b"\r\n", 1)[0].decode("latin-1", "replace")
        if " 200 " not in status + " ":
            opened.close()
            return Opened("refused", status[:120] or "no answer", seen=seen)
        if _FIRST_CONTENT.search(seen) is None:
            opened.close()
            return Opened("failed", "the connection closed before a first delta", seen=seen)
    except TimeoutError:
        opened.close()
        return Opened("slow", f"no first token within {timeout:g} s")
    except OSError as exc:
        opened.close()
        return Opened("failed", f"{type(exc).__name__}: {exc}")
    opened.outcome, opened.detail, opened.ttft_s = "admitted", "", time.perf_counter() - start
    return opened


def leave_mid_stream(ep: Endpoint, body: dict[str, Any], timeout: float) -> tuple[str, str]:
    """Open a stream, read up to its first content delta, close the connection.

    Returns (outcome, detail): ``left`` (closed mid-stream), ``ended``, ``refused``, ``slow`` or
    ``failed`` as :func:`open_stream` says.
    """
    opened = open_stream(ep, body, timeout)
    if opened.outcome != "admitted":
        return opened.outcome, opened.detail
    opened.close()
    return "left", "read the first delta and closed the connection"


def _refused_in_full(seen: bytes) -> bool:
    """Whether ``seen`` is a whole answer other than 200: its headers and its body, by Content-Length
    or the last chunk. A refusal on a connection the server keeps alive ends there, not when the
    server closes it: uvicorn keeps one 20 s by default, and the disconnect probe's request that is
    refused as too long (then asked again with fewer tokens) waited that long each time."""
    head, sep, body = seen.partition(b"\r\n\r\n")
    if not sep:
        return False
    lines = head.split(b"\r\n")
    if b" 200 " in lines[0] + b" ":
        return False
    fields = {name.strip().lower(): value.strip() for name, _, value in (line.partition(b":") for line in lines[1:])}
    if b"chunked" in fields.get(b"transfer-encoding", b"").lower():
        return body.endswith(b"0\r\n\r\n")
    length = fields.get(b"content-length", b"")
    return length.isdigit() and len(body) >= int(length)


def _ended(seen: bytes) -> bool:
    """Whether a stream read so far has ended: ``[DONE]``, or a chunk with its finish_reason (a
    server such as transformers serve sends no ``[DONE]``; the usage chunk that may follow the
    finish is not part of the answer)."""
    return b"data: [DONE]" in seen or _FINISHED.search(seen) is not None


def _read_to_done(opened: Opened, deadline: float) -> bool:
    """Read an admitted stream to its end (:func:`_ended`) by ``deadline``; closes it."""
    sock, seen = opened.sock, opened.seen
    try:
        while sock is not None and not _ended(seen):
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                return False
            seen += chunk
        return sock is not None
    except OSError:
        return False
    finally:
        opened.close()


@dataclass
class SlotProbe:
    """What the probe saw."""

    tested: bool = False
    detail: str = ""
    capacity: int = 0
    """Streams held at once."""
    capacity_found: bool = False
    """Whether a stream past them was refused or kept waiting (else the capacity is at least ``capacity``)."""
    past_capacity: str = ""
    disconnected: int = 0
    churn_refused: int = 0
    asked_after: int = 0
    admitted_after: int = 0
    answered_after: int = 0
    ttft_after_ms: list[float] = field(default_factory=list)
    released_after_s: float | None = None
    """From the last disconnect until every admission stream was answered (when all were admitted)."""

    @property
    def released(self) -> bool:
        """Every slot came back: the churn was admitted and so were as many streams as were held."""
        return self.tested and self.churn_refused == 0 and self.answered_after == self.asked_after > 0

    def evidence(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "ttft_after_ms"} | {
            "ttft_after_ms": [round(t, 1) for t in self.ttft_after_ms]
        }


def _admit_until(ep: Endpoint, body: dict[str, Any], admit_s: float, until: float) -> Opened:
    """Open a stream, retrying while it is refused or slow, until ``until`` (at least once)."""
    while True:
        opened = open_stream(ep, body, admit_s)
        if opened.outcome == "admitted" or opened.outcome in ("ended", "failed") or time.perf_counter() >= until:
            return opened
        time.sleep(0.05)


def probe_slot_release(
    ep: Endpoint,
    long_body: dict[str, Any],
    short_body: dict[str, Any],
    *,
    limit: int,
    admit_s: float,
    release_s: float,
    answer_s: float,
) -> SlotProbe:
    """Run the three phases (see the module docstring); ``limit`` bounds the streams held at once,
    ``admit_s`` is the time to a first token that counts as admitted, ``release_s`` how long after
    the disconnects the slots must be free, ``answer_s`` the time a short stream may take to end."""
    out = SlotProbe()
    held: list[Opened] = []
    try:
        while len(held) < limit:
            opened = open_stream(ep, long_body, admit_s)
            if opened.outcome == "admitted":
                held.append(opened)
                continue
            if not held:
                out.detail = opened.detail
                return out
            out.capacity_found, out.past_capacity = opened.outcome in ("refused", "slow"), opened.detail
            if not out.capacity_found:
                out.detail = opened.detail
                return out
            break
    finally:
        out.capacity = len(held)
        for opened in held:
            opened.close()
    out.tested = True
    out.disconnected = len(held)
    last_disconnect = time.perf_counter()
    for _ in range(out.capacity + 1):
        opened = _admit_until(ep, long_body, admit_s, last_disconnect + release_s)
        if opened.outcome == "ended":
            continue  # admitted, but finished before it could be left: no slot taken
        if opened.outcome != "admitted":
            out.churn_refused += 1
            out.detail = f"a stream after the disconnects was not admitted: {opened.detail}"
            break
        opened.close()
        out.disconnected += 1
        last_disconnect = time.perf_counter()

    def admit_and_answer(_: int) -> tuple[float | None, bool]:
        opened = _admit_until(ep, short_body, admit_s, last_disconnect + release_s)
        if opened.outcome == "ended":
            return opened.ttft_s, True  # the whole short answer came in the first read
        if opened.outcome != "admitted":
            return None, False
        return opened.ttft_s, _read_to_done(opened, time.perf_counter() + answer_s)

    out.asked_after = out.capacity
    with ThreadPoolExecutor(out.capacity, thread_name_prefix="mmchaos-slot-probe") as pool:
        results = list(pool.map(admit_and_answer, range(out.capacity)))
    done = time.perf_counter()
    out.admitted_after = sum(1 for t, _ in results if t is not None)
    out.answered_after = sum(1 for t, ok in results if t is not None and ok)
    out.ttft_after_ms = [t * 1000.0 for t, _ in results if t is not None]
    if out.admitted_after == out.capacity:
        out.released_after_s = done - last_disconnect
    return out
