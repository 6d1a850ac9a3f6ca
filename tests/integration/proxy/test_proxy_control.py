"""The control API (toxiproxy's REST, plus /metrics), ProxyThread for sync code, and `mmchaos proxy`."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from mmchaos.proxy import EchoHTTPServer
from tests.paths import SRC
from tests.support.proxy_control import refused


@pytest.mark.integration
def test_cli_runs_until_interrupted(tmp_path: Path) -> None:
    """`mmchaos proxy` in a child process: toxics from flags and a file, control API, clean Ctrl-C."""
    toxics = tmp_path / "toxics.yaml"
    toxics.write_text("toxics:\n  - {type: http_status, name: busy, attributes: {status: 503, path_prefix: /json}}\n")
    script = (
        "import typer, sys\n"
        "from mmchaos.cli.proxy_cmd import register\n"
        "app = typer.Typer()\n"
        "@app.callback()\n"
        "def root() -> None: pass\n"
        "register(app)\n"
        "app()\n"
    )

    async def main() -> None:
        async with EchoHTTPServer() as echo:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                listen_port = s.getsockname()[1]
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                control_port = s.getsockname()[1]
            env = dict(os.environ, PYTHONPATH=str(SRC))
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", script, "proxy",
                "--listen", f"127.0.0.1:{listen_port}", "--upstream", f"127.0.0.1:{echo.address[1]}",
                "--toxic", "latency:latency=1,jitter=0,stream=upstream,toxicity=1",
                "--toxics-file", str(toxics), "--control", f"127.0.0.1:{control_port}", "--loop", "asyncio",
                stderr=subprocess.PIPE, env=env,
            )  # fmt: skip
            assert proc.stderr is not None
            lines = []
            try:
                async with asyncio.timeout(20):
                    while not (line := (await proc.stderr.readline()).decode()).startswith("Ctrl-C"):
                        assert line, "".join(lines)
                        lines.append(line)
                assert f"listening 127.0.0.1:{listen_port}" in lines[0]
                assert "latency_upstream (latency)" in lines[0] and "busy (http_status)" in lines[0]
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{listen_port}", trust_env=False) as c:
                    assert (await c.get("/json")).status_code == 503
                    assert (await c.get("/healthz")).status_code == 200
                    api = f"http://127.0.0.1:{control_port}"
                    assert (await c.delete(f"{api}/proxies/mmchaos/toxics/busy")).status_code == 204
                    assert (await c.get("/json")).status_code == 200
                proc.send_signal(signal.SIGINT)
                async with asyncio.timeout(15):
                    rest = (await proc.stderr.read()).decode()
                    assert await proc.wait() == 0
                assert "proxy stopped" in rest
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            assert refused(listen_port) and refused(control_port)

    asyncio.run(main())
