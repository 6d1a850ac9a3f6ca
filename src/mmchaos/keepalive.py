"""Tell a request lost on a kept-alive connection the server had already closed from a real failure.

uvicorn closes a connection after answering 500 for an exception in the application, without a
``Connection: close`` header (``transformers serve`` and every FastAPI server do it). A request sent
on that kept-alive connection before the close arrives is reset unread: the server's 500 is its own
request's failure, and the reset belongs to no input. httpcore's ``trace`` extension says whether a
request went out on a connection it opened or on one it reused, and whether any answer came; a
request whose reused connection failed before any answer may be sent again on another connection
(RFC 9112, section 9.3.1). One that failed on a new connection is the server's failure.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WireTrace"]


class WireTrace:
    """What one request did on the wire; pass ``self`` (sync clients) or :meth:`event` (async) as
    the request's ``extensions={"trace": ...}``. Use a new one per request."""

    def __init__(self) -> None:
        self.connected = self.sent = self.answered = False

    def __call__(self, name: str, info: dict[str, Any]) -> None:
        if name.startswith("connection.connect_tcp."):
            self.connected = True
        elif name == "http11.send_request_headers.started":
            self.sent = True
        elif name == "http11.receive_response_headers.complete":
            self.answered = True

    async def event(self, name: str, info: dict[str, Any]) -> None:
        self(name, info)

    def stale(self, exc: BaseException) -> bool:
        """The request went out on a kept-alive connection that was closed before any answer came."""
        import httpx

        closed = isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError)
        return closed and self.sent and not self.connected and not self.answered
