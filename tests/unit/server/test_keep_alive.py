"""The keep-alive race (benchmarks/keepalive_race.py): a client that takes an idle connection from
its pool as the server closes it fails its request (``httpx.ReadError``) with nothing on the
server. Neither side of mmchaos may meet a common peer at the same idle time."""

from __future__ import annotations

import httpx

from mmchaos.net import CLIENT_KEEPALIVE_EXPIRY
from mmchaos.server import ServerConfig
from mmchaos.targets.openai_http import OpenAITarget

#: Idle expiry of the client pools that call servers like ours: httpx and the openai SDK, aiohttp.
CLIENT_POOLS_S = (httpx.Limits().keepalive_expiry or 0.0, 15.0)
#: Keep-alive timeouts of the servers mmchaos calls: uvicorn (vLLM, SGLang, transformers serve), Node.
SERVERS_S = (5.0, 5.0)


def test_the_server_keeps_idle_connections_longer_than_common_client_pools() -> None:
    assert ServerConfig().keep_alive_timeout > max(CLIENT_POOLS_S)


def test_mmchaos_clients_drop_idle_connections_before_common_servers_close_them() -> None:
    assert min(SERVERS_S) > CLIENT_KEEPALIVE_EXPIRY
    target = OpenAITarget("http://127.0.0.1:9/v1", model="m", capabilities=["generate"])
    try:
        pool = target._client._transport._pool  # httpx's own connection pool (no public accessor)
        assert pool._keepalive_expiry == CLIENT_KEEPALIVE_EXPIRY
    finally:
        target.close()
