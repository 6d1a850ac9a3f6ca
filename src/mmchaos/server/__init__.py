"""``mmchaos serve``: an OpenAI-compatible HTTP server over any in-process target, guards on the path.

    from mmchaos.server import ServerConfig, ServerThread, create_app

    with ServerThread(load_target("builtin:tiny-clip")) as srv:   # a free loopback port
        httpx.post(f"{srv.base_url}/embeddings", json={"input": ["a red circle"]})

Needs the ``serve`` extra (FastAPI and uvicorn); names load on first access, with an install hint
when they are missing. See ``docs/server.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mmchaos.errors import MissingDependencyError

if TYPE_CHECKING:
    from mmchaos.server.app import create_app
    from mmchaos.server.config import ServerConfig, contract_from_yaml
    from mmchaos.server.core import GuardedServer
    from mmchaos.server.middleware import REQUEST_ID_HEADER
    from mmchaos.server.thread import ServerThread, serve

__all__ = [
    "REQUEST_ID_HEADER",
    "GuardedServer",
    "ServerConfig",
    "ServerThread",
    "contract_from_yaml",
    "create_app",
    "serve",
]

_MODULE_OF = {
    "REQUEST_ID_HEADER": "mmchaos.server.middleware",
    "GuardedServer": "mmchaos.server.core",
    "create_app": "mmchaos.server.app",
    "ServerConfig": "mmchaos.server.config",
    "contract_from_yaml": "mmchaos.server.config",
    "ServerThread": "mmchaos.server.thread",
    "serve": "mmchaos.server.thread",
}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'mmchaos.server' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in ("fastapi", "uvicorn", "starlette"):
            raise
        raise MissingDependencyError(
            f"the reference server needs {exc.name}, which is not installed; install it with: "
            'pip install "mmchaos[serve]"'
        ) from exc
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
