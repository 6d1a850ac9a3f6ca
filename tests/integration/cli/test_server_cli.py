"""``mmchaos serve`` as a real process: it serves, and SIGTERM lets every request in flight finish."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from mmchaos.cli import app
from mmchaos.cli.serve_cmd import register

register(app)
register(app)  # idempotent: the lead may also register it when building the app

pytestmark = pytest.mark.integration

# The CLI with the serve command registered (the lead adds it to the app; this works either way).
LAUNCH = "from mmchaos.cli import app, main; from mmchaos.cli.serve_cmd import register; register(app); main()"


def start(subprocess_env: dict[str, str], *args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, "serve", "--port", "0", *args],
        env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    line = proc.stderr.readline()  # the ready line, or the error that stopped it
    found = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line)
    if not found:
        proc.kill()
        raise AssertionError(f"no ready line: {line!r} {proc.communicate(timeout=10)}")
    return proc, found.group(1)


def inflight(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    values = re.findall(r"^mmchaos_server_(?:inflight|queued) ([0-9.]+)$", text, re.M)
    return sum(float(v) for v in values)


def test_sigterm_drains_requests_in_flight(subprocess_env: dict[str, str]) -> None:
    env = {**subprocess_env, "MMCHAOS_TEST_DELAY": "0.4"}
    proc, url = start(env, "--target", "py:tests.fakes.targets:slow", "--max-concurrency", "2")
    port = int(url.rsplit(":", 1)[1])
    try:
        n = 4

        def post(i: int) -> httpx.Response:
            return httpx.post(f"{url}/v1/embeddings", json={"input": [f"text {i}"]}, timeout=30.0)

        with ThreadPoolExecutor(n) as pool:
            futures = [pool.submit(post, i) for i in range(n)]
            end = time.monotonic() + 15
            while inflight(url) < n:
                assert time.monotonic() < end, "the requests never arrived"
                time.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            responses = [f.result(30) for f in futures]
        assert [r.status_code for r in responses] == [200] * n
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "still listening after shutdown"


def test_serve_options_reach_the_server(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    contract = tmp_path / "contract.yaml"
    contract.write_text("max_text_bytes: 10\n")
    env = {**subprocess_env, "SERVE_KEY": "k-123"}
    proc, url = start(env, "--target", "py:tests.fakes.targets:hash_embed", "--contract", str(contract),
                      "--served-model-name", "clip", "--served-model-name", "clip-v2", "--api-key-env", "SERVE_KEY",
                      "--max-queue", "0")  # fmt: skip
    try:
        auth = {"Authorization": "Bearer k-123"}
        assert httpx.post(f"{url}/v1/embeddings", json={"input": "x"}).status_code == 401
        ok = httpx.post(f"{url}/v1/embeddings", json={"model": "clip", "input": ""}, headers=auth)
        assert ok.status_code == 200  # empty texts are the model's business unless the contract says
        for name in ("clip-v2", "py:tests.fakes.targets:hash_embed"):  # an alias, and the target URI, as vLLM takes
            named = httpx.post(f"{url}/v1/embeddings", json={"model": name, "input": "x"}, headers=auth)
            assert named.status_code == 200 and named.json()["model"] == "clip", named.text
        long = httpx.post(f"{url}/v1/embeddings", json={"input": "longer than ten bytes"}, headers=auth)
        assert long.status_code == 413 and long.json()["error"]["code"] == "text_too_long"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_serve_takes_an_api_key_from_the_flag_or_the_environment(subprocess_env: dict[str, str]) -> None:
    """As vLLM's ``--api-key`` / ``VLLM_API_KEY``: ``MMCHAOS_API_KEY`` unless ``--api-key`` is given."""
    env = {**subprocess_env, "MMCHAOS_API_KEY": "from-env"}
    for flag, accepted, refused in (
        ([], "from-env", "from-flag"),
        (["--api-key", "from-flag"], "from-flag", "from-env"),
    ):
        proc, url = start(env, "--target", "py:tests.fakes.targets:hash_embed", *flag)
        try:
            body = {"input": "x"}
            assert httpx.post(f"{url}/v1/embeddings", json=body).status_code == 401
            ok = httpx.post(f"{url}/v1/embeddings", json=body, headers={"Authorization": f"Bearer {accepted}"})
            assert ok.status_code == 200, ok.text
            wrong = httpx.post(f"{url}/v1/embeddings", json=body, headers={"Authorization": f"Bearer {refused}"})
            assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
            assert httpx.get(f"{url}/healthz").status_code == 200  # liveness stays open, as vLLM's /health
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "nonsense"], "target must be a URI"),
        (
            ["--target", "py:tests.fakes.targets:hash_embed", "--contract", "/no/such.yaml"],
            "cannot read input contract",
        ),
        (["--target", "py:tests.fakes.targets:hash_embed", "--api-key-env", "MMCHAOS_UNSET_VAR"], "is not set"),
        (["--target", "py:tests.fakes.targets:hash_embed", "--port", "{busy}"], "cannot listen on"),
    ],
)
def test_bad_serve_input_exits_2_with_one_line(run_cli: Any, args: list[str], message: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        code, out, err = run_cli("serve", *[a.replace("{busy}", port) for a in args])
    assert code == 2, err
    assert message in err and "Traceback" not in out + err
    assert os.environ.get("MMCHAOS_UNSET_VAR") is None
