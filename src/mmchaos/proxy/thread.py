"""Run a :class:`~mmchaos.proxy.proxy.FaultProxy` and its control API on a daemon thread.

For synchronous callers (the serving checks, tests, notebooks): every method is thread-safe and
returns once the change is in effect on the proxy's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from mmchaos.net import require_loopback
from mmchaos.proxy.config import ProxyConfig, Toxic, parse_hostport, parse_toxic
from mmchaos.proxy.control import ControlServer
from mmchaos.proxy.proxy import FaultProxy, ProxyStats

__all__ = ["ProxyThread"]

_T = TypeVar("_T")


class ProxyThread:
    """A :class:`FaultProxy` (and optionally its control API) on an event loop in a daemon thread.

    ``with ProxyThread("127.0.0.1:8000") as proxy:`` starts it and stops it on exit; every method
    is thread-safe and returns once the change is in effect. Listen, upstream and control
    addresses must be loopback unless ``allow_remote``.
    """

    def __init__(
        self,
        upstream: str,
        *,
        listen: str = "127.0.0.1:0",
        name: str = "mmchaos",
        toxics: Iterable[Toxic | Mapping[str, Any]] = (),
        enabled: bool = True,
        seed: int = 0,
        control: str | None = None,
        allow_remote: bool = False,
    ) -> None:
        self._args: dict[str, Any] = {
            "upstream": upstream,
            "listen": listen,
            "name": name,
            "toxics": list(toxics),
            "enabled": enabled,
            "seed": seed,
        }
        # Validate now, in the caller's thread, so bad input raises here.
        ProxyConfig.parse({k: v for k, v in self._args.items() if k != "toxics"})
        for toxic in self._args["toxics"]:
            parse_toxic(toxic)
        control_address = parse_hostport(control, what="control") if control is not None else None
        if not allow_remote:  # here, so a refusal raises in the caller
            require_loopback(parse_hostport(listen, what="listen")[0], what="listen")
            require_loopback(parse_hostport(upstream, what="upstream")[0], what="upstream")
            if control_address is not None:
                require_loopback(control_address[0], what="control")
        self._allow_remote = allow_remote
        self._control_listen = control
        self._proxy: FaultProxy | None = None
        self._control: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    def __enter__(self) -> ProxyThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"mmchaos-proxy-{self._args['name']}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout=15):
            raise RuntimeError("the proxy thread did not start in 15 s")
        if self._error is not None:
            self._thread.join(timeout=5)
            raise self._error

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)
        self._thread = None

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to the thread that started us
            if not self._ready.is_set():
                self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        proxy = FaultProxy(**self._args, allow_remote=self._allow_remote)
        await proxy.start()
        self._proxy = proxy
        try:
            if self._control_listen is not None:
                self._control = ControlServer([proxy], listen=self._control_listen, allow_remote=self._allow_remote)
                await self._control.start()
            self._ready.set()
            await self._stop.wait()
        finally:
            if self._control is not None:
                await self._control.stop()
            await proxy.stop()

    def _call(self, fn: Callable[[FaultProxy], _T]) -> _T:
        async def invoke(proxy: FaultProxy) -> _T:
            return fn(proxy)

        return self._acall(invoke)

    def _acall(self, fn: Callable[[FaultProxy], Awaitable[_T]]) -> _T:
        if self._loop is None or self._proxy is None:
            raise RuntimeError("the proxy thread is not running")
        proxy = self._proxy

        async def invoke() -> _T:
            return await fn(proxy)

        return asyncio.run_coroutine_threadsafe(invoke(), self._loop).result(timeout=30)

    @property
    def proxy(self) -> FaultProxy:
        """The proxy itself, for reading; change it only through this object's methods."""
        if self._proxy is None:
            raise RuntimeError("the proxy thread is not running")
        return self._proxy

    @property
    def address(self) -> tuple[str, int]:
        return self.proxy.address

    @property
    def listen(self) -> str:
        return self.proxy.listen

    @property
    def url(self) -> str:
        return self.proxy.url

    @property
    def control_url(self) -> str | None:
        return None if self._control is None else str(self._control.url)

    def add_toxic(self, toxic: Toxic | Mapping[str, Any]) -> Toxic:
        return self._call(lambda p: p.add_toxic(toxic))

    def update_toxic(self, name: str, changes: Mapping[str, Any]) -> Toxic:
        return self._call(lambda p: p.update_toxic(name, changes))

    def remove_toxic(self, name: str) -> None:
        self._call(lambda p: p.remove_toxic(name))

    def clear_toxics(self) -> None:
        self._call(lambda p: p.clear_toxics())

    @property
    def toxics(self) -> list[Toxic]:
        return self._call(lambda p: p.toxics)

    def set_enabled(self, enabled: bool) -> None:
        self._acall(lambda p: p.set_enabled(enabled))

    def reset(self) -> None:
        self._acall(lambda p: p.reset())

    def stats(self) -> ProxyStats:
        return self._call(lambda p: p.snapshot())
