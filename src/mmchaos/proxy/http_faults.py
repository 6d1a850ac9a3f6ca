"""HTTP/1.1 faults toxiproxy cannot do: it frames requests and responses to rewrite them.

One :class:`HttpSession` per proxied connection, while HTTP toxics exist. It frames both
directions incrementally (Content-Length, chunked, read-until-close, 1xx, HEAD, 204/304,
Upgrade/CONNECT tunnels), so keep-alive connections stay in step, and works on whole chunks
(no per-byte Python work except the bytes it flips). Anything that does not parse as HTTP/1.x is
passed through untouched from that point on. Faults are drawn per request (seeded), not per
connection, because one keep-alive connection carries many requests.
"""

from __future__ import annotations

import json
import logging
import random
import re
from collections import deque
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Protocol

from mmchaos.proxy.config import Toxic

__all__ = ["CloseItem", "HttpHost", "HttpSession", "StallItem", "looks_like_request", "parse_head"]

log = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024
_METHOD = re.compile(rb"[A-Z]{1,20} ")
_METHOD_PARTIAL = re.compile(rb"[A-Z]{1,20}")
_REQUEST_START = re.compile(rb"(?:GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH|CONNECT|TRACE) ")


def looks_like_request(data: bytes) -> bool:
    """Whether a chunk read from a client starts an HTTP/1.x request (to join a live connection)."""
    return _REQUEST_START.match(data) is not None


class NotHttp(Exception):
    """The stream stopped parsing as HTTP/1.x; the session passes it through from here on."""


@dataclass(slots=True)
class StallItem:
    """Hold the rest of a direction until the toxic is removed or ``seconds`` pass."""

    toxic: Toxic
    seconds: float | None


@dataclass(slots=True)
class CloseItem:
    """Close the connection once everything before this item was written."""

    reason: str
    reset: bool = False


class HttpHost(Protocol):
    """What a session needs from its connection and proxy."""

    def forward_request(self, data: bytes) -> None: ...
    def forward_response(self, data: bytes) -> None: ...
    def response_control(self, item: StallItem | CloseItem) -> None: ...
    def http_toxics(self) -> Sequence[Toxic]: ...
    def toxic_live(self, toxic: Toxic) -> bool: ...
    def draw(self, toxic: Toxic, request_index: int) -> bool: ...
    def request_rng(self, toxic: Toxic, request_index: int) -> random.Random: ...
    def count_fault(self, toxic: Toxic) -> None: ...
    def detach_http(self, rest: bytes) -> None: ...
    def wait_removed(self, toxic: Toxic, seconds: float | None) -> Awaitable[None]: ...


# --- heads -------------------------------------------------------------------------------------


@dataclass(slots=True)
class Head:
    raw: bytes
    start: list[bytes]
    headers: list[tuple[bytes, bytes]]

    def get(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    def get_all(self, name: bytes) -> list[bytes]:
        return [value for key, value in self.headers if key.lower() == name]


def parse_head(raw: bytes) -> Head:
    """Split a head (ending in a blank line) into its start line and header fields."""
    lines = raw.rstrip(b"\r\n").split(b"\r\n")
    start = lines[0].split(b" ", 2)
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise NotHttp(f"bad header line {line[:40]!r}")
        headers.append((name, value.strip()))
    return Head(raw, start, headers)


def render_head(start: list[bytes], headers: list[tuple[bytes, bytes]]) -> bytes:
    return b" ".join(start) + b"\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in headers) + b"\r\n"


# --- framing -----------------------------------------------------------------------------------

NONE, LENGTH, CHUNKED, UNTIL_EOF, TUNNEL = range(5)
_HEAD, _WAIT, _DONE, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_EOF, _TUNNEL, _CLOSED = range(11)


@dataclass(slots=True)
class HeadEv:
    head: Head


@dataclass(slots=True)
class DataEv:
    data: bytes
    offset: int


@dataclass(slots=True)
class FrameEv:
    data: bytes


@dataclass(slots=True)
class EndEv:
    pass


@dataclass(slots=True)
class RawEv:
    data: bytes


_END = EndEv()
Event = HeadEv | DataEv | FrameEv | EndEv | RawEv


class _Framer:
    """Incremental HTTP/1.1 framing of one direction: heads, body data, chunk framing, ends."""

    def __init__(self, *, response: bool) -> None:
        self.response = response
        self.buf = bytearray()
        self.state = _HEAD
        self.remaining = 0
        self.offset = 0
        self.eof = False

    def feed(self, data: bytes) -> None:
        self.buf += data

    def idle(self) -> bool:
        return self.state == _HEAD and not self.buf

    def take(self) -> bytes:
        data = bytes(self.buf)
        self.buf.clear()
        return data

    def begin_body(self, mode: int, length: int = 0) -> None:
        self.offset = 0
        if mode == NONE or (mode == LENGTH and length == 0):
            self.state = _DONE
        elif mode == LENGTH:
            self.state, self.remaining = _LENGTH, length
        elif mode == CHUNKED:
            self.state = _CHUNK_SIZE
        elif mode == UNTIL_EOF:
            self.state = _UNTIL_EOF
        else:
            self.state = _TUNNEL

    def _check_start(self) -> None:
        buf = self.buf
        if self.response:
            n = min(len(buf), 7)
            if buf[:n] != b"HTTP/1."[:n]:
                raise NotHttp("not an HTTP/1.x response")
        elif buf and _METHOD.match(buf[:21]) is None and not (len(buf) < 21 and _METHOD_PARTIAL.fullmatch(buf)):
            raise NotHttp("not an HTTP/1.x request")

    def next(self) -> Event | None:
        st, buf = self.state, self.buf
        if st == _HEAD:
            while buf[:2] == b"\r\n":
                del buf[:2]
            self._check_start()
            i = buf.find(b"\r\n\r\n")
            if i < 0:
                if len(buf) > MAX_HEAD:
                    raise NotHttp("head too large")
                return None
            raw = bytes(buf[: i + 4])
            head = parse_head(raw)  # before the bytes leave the buffer: on NotHttp they pass through
            del buf[: i + 4]
            self.state = _WAIT
            return HeadEv(head)
        if st == _DONE:
            self.state = _HEAD
            return _END
        if st in (_LENGTH, _CHUNK_DATA):
            n = min(len(buf), self.remaining)
            if n == 0:
                return None
            data = bytes(buf[:n])
            del buf[:n]
            self.remaining -= n
            off = self.offset
            self.offset += n
            if self.remaining == 0:
                self.state = _DONE if st == _LENGTH else _CHUNK_END
            return DataEv(data, off)
        if st == _CHUNK_SIZE:
            i = buf.find(b"\r\n")
            if i < 0:
                if len(buf) > 4096:
                    raise NotHttp("chunk size line too long")
                return None
            line = bytes(buf[: i + 2])
            del buf[: i + 2]
            try:
                size = int(line[:i].split(b";")[0].strip(), 16)
            except ValueError:
                raise NotHttp(f"bad chunk size {line[:20]!r}") from None
            if size < 0:
                raise NotHttp("negative chunk size")
            if size == 0:
                self.state = _TRAILER
            else:
                self.state, self.remaining = _CHUNK_DATA, size
            return FrameEv(line)
        if st == _CHUNK_END:
            if len(buf) < 2:
                return None
            if buf[:2] != b"\r\n":
                raise NotHttp("chunk data not followed by CRLF")
            del buf[:2]
            self.state = _CHUNK_SIZE
            return FrameEv(b"\r\n")
        if st == _TRAILER:
            i = buf.find(b"\r\n")
            if i < 0:
                if len(buf) > MAX_HEAD:
                    raise NotHttp("trailers too large")
                return None
            line = bytes(buf[: i + 2])
            del buf[: i + 2]
            if i == 0:
                self.state = _DONE
            return FrameEv(line)
        if st == _UNTIL_EOF:
            if buf:
                off = self.offset
                data = self.take()
                self.offset += len(data)
                return DataEv(data, off)
            if self.eof:
                self.state = _CLOSED
                return _END
            return None
        if st == _TUNNEL and buf:
            return RawEv(self.take())
        return None  # _WAIT, _CLOSED, empty _TUNNEL


def _content_length(head: Head) -> int | None:
    values = head.get_all(b"content-length")
    if not values:
        return None
    distinct = {v.strip() for v in b",".join(values).split(b",")}
    if len(distinct) != 1:
        raise NotHttp("conflicting Content-Length")
    (value,) = distinct
    if not value.isdigit():
        raise NotHttp("bad Content-Length")
    return int(value)


def _is_chunked(head: Head) -> bool | None:
    """True when chunked is the last coding, False for other codings, None without the header."""
    values = head.get_all(b"transfer-encoding")
    if not values:
        return None
    codings = [c.strip().lower() for c in b",".join(values).split(b",") if c.strip()]
    return bool(codings) and codings[-1] == b"chunked"


def _keep_alive(head: Head, version: bytes) -> bool:
    conn = (head.get(b"connection") or b"").lower()
    if b"close" in conn:
        return False
    return version == b"HTTP/1.1" or b"keep-alive" in conn


# --- the session -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Exchange:
    index: int
    method: bytes
    toxics: list[Toxic]
    upgrade: bool = False
    local_response: bytes | None = None
    close_after: bool = False
    sent: bool = False


@dataclass(slots=True)
class _Plan:
    """What one response's faults do to its body."""

    flips: list[int] = field(default_factory=list)
    lazy_flips: tuple[int, random.Random] | None = None
    cut: int | None = None
    lazy_cut: float | None = None
    stall: tuple[Toxic, int, float | None] | None = None
    close_after: bool = False
    truncated: bool = False
    stalled: bool = False

    @property
    def plain(self) -> bool:
        return not (self.flips or self.lazy_flips or self.cut is not None or self.lazy_cut is not None or self.stall)


def _matches(toxic: Toxic, target: str) -> bool:
    prefix = getattr(toxic.attributes, "path_prefix", None)
    return prefix is None or target.startswith(prefix)


def render_status(toxic: Toxic, *, keep_alive: bool, head_only: bool) -> bytes:
    """The response an ``http_status`` toxic answers with, framed with Content-Length."""
    attrs = toxic.attributes
    status: int = attrs.status  # type: ignore[union-attr]
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Injected"
    body_text: str | None = attrs.body  # type: ignore[union-attr]
    if body_text is None:
        message = f"{status} {reason} injected by mmchaos proxy toxic {toxic.name!r}"
        body_text = json.dumps({"error": {"message": message, "type": "mmchaos_injected_fault", "code": status}})
    body = body_text.encode("utf-8")
    headers = [
        (b"Content-Type", attrs.content_type.encode("latin-1")),  # type: ignore[union-attr]
        (b"Content-Length", str(len(body)).encode()),
        (b"X-MMChaos-Toxic", toxic.name.encode("latin-1")),
        (b"Connection", b"keep-alive" if keep_alive else b"close"),
    ]
    retry_after: int | None = attrs.retry_after  # type: ignore[union-attr]
    if retry_after is not None:
        headers.insert(2, (b"Retry-After", str(retry_after).encode()))
    start = [b"HTTP/1.1", str(status).encode(), reason.encode("latin-1")]
    return render_head(start, headers) + (b"" if head_only else body)


class HttpSession:
    """Frames one connection's HTTP traffic and applies the HTTP toxics drawn for each request."""

    def __init__(self, host: HttpHost) -> None:
        self.host = host
        self.req = _Framer(response=False)
        self.resp = _Framer(response=True)
        self.pending: deque[_Exchange] = deque()
        self.passthrough = False
        self._index = 0
        self._req_ex: _Exchange | None = None
        self._resp_ex: _Exchange | None = None
        self._interim = False
        self._plan = _Plan()

    # client -> server

    def feed_request(self, data: bytes) -> None:
        if self.passthrough:
            self.host.forward_request(data)
            return
        self.req.feed(data)
        try:
            while not self.passthrough:
                ev = self.req.next()
                if ev is None:
                    return
                try:
                    if self._on_request(ev):
                        return
                except NotHttp:
                    if isinstance(ev, HeadEv):
                        self.host.forward_request(ev.head.raw)  # the head read but not forwarded
                    raise
        except NotHttp as exc:
            self._give_up(f"request: {exc}")

    def _on_request(self, ev: Event) -> bool:
        """Handle one request event; True when the session detached from the connection."""
        if isinstance(ev, HeadEv):
            return self._on_request_head(ev.head)
        ex = self._req_ex
        if isinstance(ev, DataEv | FrameEv | RawEv):
            if ex is None or ex.local_response is None:
                self.host.forward_request(ev.data)
            return False
        # end of a request
        self._req_ex = None
        if ex is not None and ex.local_response is not None and not ex.sent:
            if self.pending or self._resp_ex is not None:
                self.pending.append(ex)  # answered in turn, after the responses before it
            else:
                self._send_local(ex)
        if ex is not None and ex.upgrade and ex.local_response is None:
            self.req.begin_body(TUNNEL)
        return False

    def _on_request_head(self, head: Head) -> bool:
        if len(head.start) != 3 or not head.start[2].startswith(b"HTTP/1."):
            raise NotHttp("bad request line")
        toxics = self.host.http_toxics()
        if not toxics and not self.pending and self._resp_ex is None and self.resp.idle():
            self.host.detach_http(head.raw + self.req.take())  # no HTTP faults left: back to the plain pump
            return True
        method, target, version = head.start
        chunked = _is_chunked(head)
        if chunked is False:
            raise NotHttp("request with a non-chunked Transfer-Encoding")
        length = _content_length(head)
        index = self._index
        self._index += 1
        upgrade = method == b"CONNECT" or head.get(b"upgrade") is not None
        path = target.decode("latin-1")
        drawn = [t for t in toxics if _matches(t, path) and self.host.draw(t, index)]
        status = next((t for t in drawn if t.type == "http_status"), None)
        ex = _Exchange(index, method, [t for t in drawn if t.type != "http_status"], upgrade)
        self._req_ex = ex
        if status is not None and not upgrade:
            expects_continue = (head.get(b"expect") or b"").lower() == b"100-continue"
            keep = _keep_alive(head, version) and not expects_continue
            ex.local_response = render_status(status, keep_alive=keep, head_only=method == b"HEAD")
            ex.close_after = not keep
            self.host.count_fault(status)
            if expects_continue and not self.pending and self._resp_ex is None:
                self._send_local(ex)  # the client waits for 100 before its body: answer now, then close
        else:
            self.pending.append(ex)
            self.host.forward_request(head.raw)
        self.req.begin_body(CHUNKED if chunked else LENGTH if length else NONE, length or 0)
        return False

    def _send_local(self, ex: _Exchange) -> None:
        assert ex.local_response is not None
        ex.sent = True
        self.host.forward_response(ex.local_response)
        if ex.close_after:
            self.host.response_control(CloseItem("http_status"))

    # server -> client

    def feed_response(self, data: bytes) -> None:
        if self.passthrough:
            self.host.forward_response(data)
            return
        self.resp.feed(data)
        self._drain_responses()

    def feed_response_eof(self) -> None:
        if not self.passthrough:
            self.resp.eof = True
            self._drain_responses()

    def _drain_responses(self) -> None:
        try:
            while not self.passthrough:
                ev = self.resp.next()
                if ev is None:
                    return
                try:
                    self._on_response(ev)
                except NotHttp:
                    if isinstance(ev, HeadEv):
                        self.host.forward_response(ev.head.raw)  # the head read but not forwarded
                    raise
        except NotHttp as exc:
            self._give_up(f"response: {exc}")

    def _on_response(self, ev: Event) -> None:
        if isinstance(ev, HeadEv):
            self._on_response_head(ev.head)
        elif isinstance(ev, DataEv):
            self._body(ev.data, ev.offset)
        elif isinstance(ev, FrameEv | RawEv):
            if not self._plan.truncated:
                self.host.forward_response(ev.data)
        else:
            if self._interim:
                self._interim = False
                return
            plan = self._plan
            if plan.close_after and not plan.truncated:
                self.host.response_control(CloseItem("http_drop_header"))
            self._resp_ex, self._plan = None, _Plan()
            while self.pending and self.pending[0].local_response is not None:
                self._send_local(self.pending.popleft())

    def _on_response_head(self, head: Head) -> None:
        if len(head.start) < 2 or not head.start[1].isdigit() or len(head.start[1]) != 3:
            raise NotHttp("bad status line")
        status = int(head.start[1])
        if 100 <= status < 200 and status != 101:
            self._interim = True
            self.host.forward_response(head.raw)
            self.resp.begin_body(NONE)
            return
        while self.pending and self.pending[0].local_response is not None and self.pending[0].sent:
            self.pending.popleft()
        if not self.pending or self.pending[0].local_response is not None:
            raise NotHttp("a response nobody asked for")
        ex = self.pending.popleft()
        chunked = _is_chunked(head)
        length = _content_length(head)
        if ex.method == b"HEAD" or status in (204, 304):
            mode = NONE
        elif status == 101 or (ex.method == b"CONNECT" and 200 <= status < 300):
            mode = TUNNEL
        elif chunked:
            mode = CHUNKED
        elif chunked is None and length is not None:
            mode = LENGTH
        else:
            mode = UNTIL_EOF
        raw = self._plan_response(ex, head, mode, length or 0)
        self.host.forward_response(raw)
        self._resp_ex = ex
        if mode == TUNNEL:
            self._give_up("tunnel")
            return
        self.resp.begin_body(mode, length or 0)
        if self._plan.cut == 0:
            self._truncate_now()

    def _plan_response(self, ex: _Exchange, head: Head, mode: int, length: int) -> bytes:
        """Decide what this response's faults do; returns the (possibly rewritten) head."""
        plan = _Plan()
        self._plan = plan
        raw, headers = head.raw, head.headers
        has_body = mode in (LENGTH, CHUNKED, UNTIL_EOF) and not (mode == LENGTH and length == 0)
        for toxic in ex.toxics:
            if not self.host.toxic_live(toxic):
                continue
            attrs = toxic.attributes
            applied = False
            if toxic.type == "http_drop_header":
                drop = {h.lower().encode("latin-1") for h in attrs.headers}  # type: ignore[union-attr]
                kept = [(k, v) for k, v in headers if k.lower() not in drop]
                if len(kept) != len(headers):
                    applied = True
                    if {b"content-length", b"transfer-encoding"} & drop and mode in (LENGTH, CHUNKED):
                        plan.close_after = True  # without its length the body ends at the close
                    headers = kept
                    raw = render_head(head.start, headers)
            elif toxic.type == "http_corrupt" and has_body:
                rng = self.host.request_rng(toxic, ex.index)
                flips: int = attrs.flips  # type: ignore[union-attr]
                if mode == LENGTH:
                    plan.flips = sorted(rng.sample(range(length), min(flips, length)))
                else:
                    plan.lazy_flips = (flips, rng)
                applied = True
            elif toxic.type == "http_truncate" and has_body:
                cut_bytes: int | None = attrs.bytes  # type: ignore[union-attr]
                fraction: float = attrs.fraction  # type: ignore[union-attr]
                if cut_bytes is not None:
                    plan.cut = cut_bytes
                elif mode == LENGTH:
                    plan.cut = int(length * fraction)
                else:
                    plan.lazy_cut = fraction
                applied = not (mode == LENGTH and plan.cut is not None and plan.cut >= length)
                if not applied:
                    plan.cut = None
            elif toxic.type == "http_stall" and has_body:
                ctype = (head.get(b"content-type") or b"").lower()
                streaming = mode != LENGTH or ctype.startswith(b"text/event-stream")
                after: int = attrs.after_bytes  # type: ignore[union-attr]
                if (streaming or not attrs.streaming_only) and not (mode == LENGTH and after >= length):  # type: ignore[union-attr]
                    duration: float = attrs.duration  # type: ignore[union-attr]
                    plan.stall = (toxic, after, duration / 1000.0 if duration > 0 else None)
                    applied = True
            if applied:
                self.host.count_fault(toxic)
        return raw

    def _body(self, data: bytes, off: int) -> None:
        plan = self._plan
        if plan.plain:
            self.host.forward_response(data)
            return
        if plan.truncated:
            return
        n = len(data)
        if plan.lazy_flips is not None:
            count, rng = plan.lazy_flips
            plan.flips = sorted(rng.sample(range(off, off + n), min(count, n)))  # within the first data
            plan.lazy_flips = None
        if plan.lazy_cut is not None:
            plan.cut = off + int(n * plan.lazy_cut)
            plan.lazy_cut = None
        if plan.flips and plan.flips[-1] >= off and plan.flips[0] < off + n:
            buf = bytearray(data)
            for p in plan.flips:
                if off <= p < off + n:
                    buf[p - off] ^= 0xFF
            data = bytes(buf)
        if plan.stall is not None and not plan.stalled:
            toxic, after, seconds = plan.stall
            cut_first = plan.cut is not None and plan.cut <= after
            if off + len(data) > after and not cut_first:
                k = max(0, after - off)
                if k:
                    self.host.forward_response(data[:k])
                plan.stalled = True
                self.host.response_control(StallItem(toxic, seconds))
                data, off = data[k:], off + k
        if plan.cut is not None and off + len(data) >= plan.cut:
            k = max(0, plan.cut - off)
            if k:
                self.host.forward_response(data[:k])
            self._truncate_now()
            return
        if data:
            self.host.forward_response(data)

    def _truncate_now(self) -> None:
        self._plan.truncated = True
        self.host.response_control(CloseItem("http_truncate"))

    def _give_up(self, why: str) -> None:
        """Stop parsing: whatever the framers hold goes out as it is, and so does all that follows."""
        if why != "tunnel":
            log.debug("http session passes through from here: %s", why)
        self.passthrough = True
        if self.req.buf:
            self.host.forward_request(self.req.take())
        if self.resp.buf:
            self.host.forward_response(self.resp.take())
