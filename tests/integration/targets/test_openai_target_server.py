"""The ``openai:`` target against the real reference server on loopback, and ``mmchaos validate``
through HTTP agreeing with the in-process run of the same target."""

from __future__ import annotations

import inspect
import json
import logging
import math
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from mmchaos.errors import TargetCallError, TargetLoadError
from mmchaos.guard.breaker import BreakerConfig
from mmchaos.server import ServerConfig, ServerThread
from mmchaos.targets import TargetOptions, load_target
from mmchaos.targets.base import Capability
from mmchaos.targets.openai_http import EndpointError, OpenAITarget
from tests.fakes.server_targets import ControlledTarget, ReaderTarget
from tests.fakes.targets import HashEmbedTarget

pytestmark = pytest.mark.integration

#: The target both runs use (the built-in model ships with the package).
COMPARED = "builtin:tiny-clip"
IMG = np.random.default_rng(1).integers(0, 255, (40, 48, 3), dtype=np.uint8)


@pytest.fixture()
def served() -> Iterator[tuple[ServerThread, HashEmbedTarget]]:
    target = HashEmbedTarget()
    with ServerThread(target) as srv:
        yield srv, target


def test_embeddings_through_http_equal_in_process(served: tuple[ServerThread, HashEmbedTarget]) -> None:
    srv, target = served
    remote = load_target(f"openai:{srv.base_url}")
    try:
        assert isinstance(remote, OpenAITarget)
        assert remote.capabilities == {Capability.EMBED_IMAGE, Capability.EMBED_TEXT}
        assert remote.image_input == "input" and remote.model == "hash_embed"
        images = [IMG, IMG[:20], np.zeros((16, 16, 3), np.uint8)]
        np.testing.assert_array_equal(remote.embed_images(images), target.embed_images(images))
        texts = ["a red circle", "", "ünïcödé ✓"]
        np.testing.assert_array_equal(remote.embed_texts(texts), target.embed_texts(texts))
        fp, ref = remote.fingerprint(), target.fingerprint()
        assert fp.weights == ref.weights and fp.versions["endpoint"] == srv.base_url
        assert fp.versions["model"] == "hash_embed"
        assert dict(remote.load_options) == {"model": "hash_embed", "allow_remote": False}
    finally:
        remote.close()


def test_the_servers_refusals_arrive_typed_with_their_codes(served: tuple[ServerThread, HashEmbedTarget]) -> None:
    import io

    srv, _ = served
    remote = OpenAITarget.connect(srv.base_url)
    tiff = io.BytesIO()
    Image.fromarray(IMG).save(tiff, "TIFF")
    with pytest.raises(TargetCallError) as info:
        remote.embed_encoded_images([tiff.getvalue()])
    assert info.value.code == "unsupported_format"
    with pytest.raises(TargetCallError) as info:
        remote.embed_encoded_images([b"garbage"])
    assert info.value.code == "bad_image"
    with pytest.raises(TargetCallError) as info:
        remote.embed_encoded_texts([b"\xff\xfe"])  # refused before sending: JSON cannot carry it
    assert info.value.code == "bad_utf8"
    remote.close()


def test_model_failures_and_an_open_breaker_are_endpoint_errors() -> None:
    target = ControlledTarget()
    breaker = BreakerConfig(minimum_number_of_calls=2, sliding_window_size=2, wait_duration_in_open_state=60)
    with ServerThread(target, ServerConfig(breaker=breaker)) as srv:
        remote = OpenAITarget.connect(srv.base_url, max_retries=1, sleep=lambda s: None)
        target.fail = True
        for _ in range(2):
            with pytest.raises(EndpointError) as info:
                remote.embed_texts(["x"])
            assert info.value.status == 500 and info.value.code == "model_error"
        with pytest.raises(EndpointError) as info:
            remote.embed_texts(["x"])
        # 503 with a Retry-After of about a minute: more than the target waits, so no retry
        assert info.value.status == 503 and info.value.code == "call_not_permitted"
        assert remote.retries == 0
        remote.close()


def test_a_full_queue_is_retried_after_retry_after() -> None:
    target = ControlledTarget()
    target.delay = 0.3
    with ServerThread(target, ServerConfig(max_concurrency=1, max_queue=0)) as srv:
        remote = OpenAITarget.connect(srv.base_url, max_concurrency=2)
        first = threading.Thread(target=remote.embed_texts, args=(["slow one"],))
        first.start()
        assert target.entered.acquire(timeout=10)  # the first request holds the only slot
        out = remote.embed_texts(["waits its turn"])  # 429 (Retry-After: 1), then 200
        first.join(10)
        assert out.shape == (1, 32) and remote.retries >= 1
        remote.close()


def test_reading_text_through_chat_completions() -> None:
    with ServerThread(ReaderTarget()) as srv:
        remote = load_target(f"openai:{srv.base_url}", TargetOptions(model="ReaderTarget"))
        assert remote.capabilities == {Capability.READ_TEXT}
        light, dark = np.full((20, 30, 3), 250, np.uint8), np.zeros((16, 16, 3), np.uint8)
        assert remote.read_text([light, dark]) == ["30x20 light", "16x16 dark"]
        remote.close()


def test_load_errors() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here (bound, not listening)
        with pytest.raises(TargetLoadError, match="cannot reach"):
            load_target(f"openai:http://127.0.0.1:{port}/v1")
    with ServerThread(HashEmbedTarget()) as srv, pytest.raises(TargetLoadError, match="does not serve model"):
        load_target(f"openai:{srv.base_url}", TargetOptions(model="gpt-4"))


# -- validate through HTTP ---------------------------------------------------------------------------


def _validate_has_model_option() -> bool:
    from mmchaos.cli import validate

    return "model" in inspect.signature(validate).parameters


def _run(run_cli: Any, tmp_path: Path, name: str, target: str, suite: str, model: str | None) -> dict[str, Any]:
    extra = ["--model", model] if model and _validate_has_model_option() else []
    out = tmp_path / name
    code, stdout, stderr = run_cli(
        "validate", "--target", target, "--suite", suite, "--out", str(out), "--store", str(tmp_path / f"{name}.db"),
        *extra,
    )  # fmt: skip
    assert code in (0, 1), stderr
    assert "Traceback" not in stdout + stderr
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    return results


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)


# The foundation's checks, which need no white-box access (precision, thread safety and the other
# white-box checks are skipped over HTTP by design, so they are left out of the comparison).
FOUNDATION_SUITE = """
name: foundation
seed: 0
checks:
  - check: robustness
    params:
      samples: 48
      severities: [1, 3]
      perturbations: [gaussian_noise, jpeg_compression, low_light, keyboard_typo, homoglyph]
      worst_cases: 3
  - check: missing_modality
  - check: batch_invariance
    params: {samples: 8, batch_sizes: [1, 2, 7]}
"""


def test_validate_through_http_agrees_with_in_process(run_cli: Any, tmp_path: Path) -> None:
    suite = tmp_path / "foundation.yaml"
    suite.write_text(FOUNDATION_SUITE)
    local = load_target(COMPARED)
    try:
        with ServerThread(local) as srv:
            name = srv.state.model_name
            http = _run(run_cli, tmp_path, "http", f"openai:{srv.base_url}", str(suite), name)
            served_requests = srv.state.metrics.requests.labels("/v1/embeddings", "200")._value.get()
    finally:
        local.close()
    inproc = _run(run_cli, tmp_path, "local", COMPARED, str(suite), None)
    assert served_requests > 10  # the checks really went through HTTP
    assert http["target"]["uri"].startswith("openai:http://127.0.0.1:")
    assert http["summary"]["exit_code"] == inproc["summary"]["exit_code"]
    a, b = inproc["findings"], http["findings"]
    assert [(f["check"], f["title"], f["verdict"]) for f in a] == [(f["check"], f["title"], f["verdict"]) for f in b]
    for fa, fb in zip(a, b):
        assert set(fa["metrics"]) == set(fb["metrics"]), fa["title"]
        bad = {k: (fa["metrics"][k], fb["metrics"][k]) for k in fa["metrics"]
               if not _close(fa["metrics"][k], fb["metrics"][k])}  # fmt: skip
        assert not bad, f"{fa['title']}: {bad}"


SMALL_SUITE = """
name: small
seed: 1
checks:
  - check: batch_invariance
    params: {samples: 4, batch_sizes: [1, 3]}
  - check: missing_modality
    params: {image_size: 16}
"""


def test_the_api_key_never_reaches_reports_store_or_logs(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "sk-mmchaos-test-SECRET-5678"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    caplog.set_level(logging.DEBUG)
    suite = tmp_path / "suite.yaml"
    suite.write_text(SMALL_SUITE)
    with ServerThread(HashEmbedTarget(), ServerConfig(api_keys=(secret,))) as srv:
        results = _run(run_cli, tmp_path, "keyed", f"openai:{srv.base_url}", str(suite), "hash_embed")
        ok = srv.state.metrics.requests.labels("/v1/embeddings", "200")._value.get()
        refused = srv.state.metrics.requests.labels("/v1/embeddings", "401")._value.get()
    assert results["summary"]["exit_code"] == 0 and ok > 0 and refused == 0  # the key was sent
    assert results["target"]["endpoint"]["api_key_set"] is True
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert leaks == []
    assert secret not in caplog.text


@pytest.mark.parametrize(
    ("url", "message"),
    [("openai:http://192.0.2.1:8000/v1", "--allow-remote"), ("openai:ftp://127.0.0.1/v1", "http(s) base URL")],
)
def test_cli_load_errors_exit_2_with_one_line(run_cli: Any, tmp_path: Path, url: str, message: str) -> None:
    code, out, err = run_cli("validate", "--target", url, "--out", str(tmp_path / "o"),
                             "--store", str(tmp_path / "s.db"))  # fmt: skip
    assert code == 2 and message in err and "Traceback" not in out + err
    assert [line for line in err.splitlines() if line.startswith("error")] == [err.strip().splitlines()[-1]]


def test_a_transformers_clip_through_http_equals_in_process(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A real CLIPModel (tiny-clip, or a random tiny one): exact equality, and the preprocess stage timed."""
    pytest.importorskip("transformers")
    import httpx

    from tests.fakes.broken_targets import ensure_tiny_clip

    local = load_target(f"hf:{ensure_tiny_clip(tmp_path_factory.mktemp('model'))}")
    try:
        with ServerThread(local) as srv:
            remote = load_target(f"openai:{srv.base_url}")
            images = [np.random.default_rng(i).integers(0, 255, (64, 64, 3), dtype=np.uint8) for i in range(3)]
            np.testing.assert_array_equal(remote.embed_images(images), local.embed_images(images))
            texts = ["a photo of a red circle", "", "a blue square"]
            np.testing.assert_array_equal(remote.embed_texts(texts), local.embed_texts(texts))
            assert remote.fingerprint().weights == local.fingerprint().weights
            metrics = httpx.get(f"{srv.url}/metrics").text
            for modality in ("image", "text"):
                assert f'mmchaos_server_stage_seconds_count{{modality="{modality}",stage="preprocess"}} 1.0' in metrics
            remote.close()
        assert "tokenize" not in vars(local)  # the timing hooks left with the server
    finally:
        local.close()
