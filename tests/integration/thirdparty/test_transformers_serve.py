"""mmchaos against a real third-party server: ``transformers serve`` (transformers' OpenAI-compatible
server, FastAPI on uvicorn) on builtin:tiny-vlm's model directory, offline on CPU.

What this server is, checked by direct requests here (not assumed from mmchaos's reading of it):
its streams end with a ``finish_reason`` chunk and no ``data: [DONE]``; it ignores ``logprobs``
(the answer carries none); a request it crashes on gets a plain-text 500, and then it closes the
connection without ``Connection: close``. What it crashes on moved between releases: up to
transformers 5.24 an undecodable image or an image/placeholder mismatch was a 500; 5.25 refuses
both with a 400 whose body is FastAPI's ``{"detail": ...}`` (not OpenAI's error shape), and a
message whose ``content`` is a number still crashes it. So the expected findings are read from
direct requests to the server under test, not from one release's behaviour. mmchaos must read all
of that right: streaming checks measure TTFT/TPOT and stream equality, the report says the
logprobs were ignored, and every failing finding is one a direct request confirms.

One server for the module (it loads in seconds). Skipped only when the ``serving`` extra of
transformers is not installed; a server that does not come up is a failure, with its log.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import yaml

from mmchaos.errors import TargetCallError
from mmchaos.targets.builtin import TINY_VLM_DIR
from mmchaos.targets.generation import GenerationParams
from mmchaos.targets.openai_http import EndpointError, OpenAITarget
from mmchaos.targets.openai_wire import data_url, png_bytes
from tests.support.serving import FAST

pytestmark = pytest.mark.integration

for _module in ("fastapi", "uvicorn", "openai"):  # transformers[serving]
    pytest.importorskip(_module, reason="transformers serve needs transformers[serving] (in mmchaos[dev])")

MODEL = str(TINY_VLM_DIR)
"""transformers serve names a local model by its path."""
STARTUP_S = 180.0
LAUNCH = "from transformers.cli.transformers import main; main()"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def tf_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``transformers serve <tiny-vlm dir>`` on a loopback port; yields its ``/v1`` base URL."""
    import httpx

    log = tmp_path_factory.mktemp("tfserve") / "server.log"
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, "serve", MODEL, "--host", "127.0.0.1", "--port", str(port),
             "--device", "cpu", "--log-level", "warning"],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{root}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"transformers serve not healthy within {STARTUP_S:g} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"{root}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def _chat(content: Any, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0,
            **extra}  # fmt: skip


def _image_parts(url: str, text: str = "What colour is the shape?") -> list[dict[str, Any]]:
    return [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]


def _red() -> np.ndarray:
    image = np.zeros((32, 32, 3), np.uint8)
    image[..., 0] = 255
    return image


RED = data_url(png_bytes(_red()))


def _post(base: str, body: dict[str, Any]) -> Any:
    import httpx

    with httpx.Client(timeout=60.0) as client:  # a new connection: what the server does, not the pool
        return client.post(f"{base}/chat/completions", json=body)


CRASH_CANDIDATES: dict[str, dict[str, Any]] = {
    "an empty image": _chat(_image_parts("data:image/png;base64,")),  # a 500 up to transformers 5.24
    "a number as content": {"model": MODEL, "messages": [{"role": "user", "content": 5}]},  # 5.25: TypeError
}


def _crashing_body(base: str) -> dict[str, Any]:
    """The first candidate this release of the server answers with a 500 (by a direct request)."""
    statuses = {}
    for name, body in CRASH_CANDIDATES.items():
        statuses[name] = _post(base, body).status_code
        if statuses[name] == 500:
            return body
    pytest.fail(f"no request this test knows crashes this transformers serve: {statuses}")


def _crashes(base: str, body: dict[str, Any]) -> bool:
    """True when the server answers ``body`` with a 500; any other answer must be a 4xx refusal."""
    status: int = _post(base, body).status_code
    assert status == 500 or 400 <= status < 500, status
    return status == 500


# -- what the server is (direct requests) ---------------------------------------------------------


def test_its_streams_end_at_a_finish_reason_without_done_and_it_ignores_logprobs(tf_serve: str) -> None:
    import httpx

    with httpx.Client(timeout=60.0) as client, client.stream(
        "POST", f"{tf_serve}/chat/completions", json=_chat(_image_parts(RED), stream=True)
    ) as resp:  # fmt: skip
        events = [line[5:].strip() for line in resp.iter_lines() if line.startswith("data:")]
    assert "[DONE]" not in events
    last = json.loads(events[-1])
    assert last["choices"][0]["finish_reason"] in ("stop", "length")
    answer = _post(tf_serve, _chat(_image_parts(RED), logprobs=True, top_logprobs=2)).json()
    assert answer["choices"][0].get("logprobs") is None  # asked for, not given


def test_mmchaos_reads_its_streams_and_says_it_ignores_logprobs(tf_serve: str) -> None:
    target = OpenAITarget.connect(tf_serve, model=MODEL)
    try:
        assert target.logprobs == "ignored"  # the probe asked
        params = GenerationParams(max_new_tokens=8)
        image = _red()
        streamed = "".join(target.generate_stream("What colour is the shape?", [image], params))
        whole = target.generate("What colour is the shape?", [image], params)
        assert streamed == whole.text and whole.text
        assert whole.completions[0].logprobs is None
        assert target.describe()["endpoint"]["logprobs"] == "ignored"
    finally:
        target.close()


def test_a_500_closes_its_connection_and_the_next_request_is_not_blamed(tf_serve: str) -> None:
    """uvicorn closes the connection after a 500; mmchaos sends the next request again on a new one."""
    crashing = _crashing_body(tf_serve)
    target = OpenAITarget.connect(tf_serve, model=MODEL, max_concurrency=1)
    params = GenerationParams(max_new_tokens=2, logprobs=False)
    try:
        for _ in range(3):
            with pytest.raises(EndpointError) as crashed:
                # through the target's own connection pool; its typed API will not build this body
                target._post_chat(crashing)
            assert crashed.value.status == 500
            assert target.generate("Say OK.", (), params).completions  # answered, not a reset
    finally:
        target.close()
    with socket.create_connection(("127.0.0.1", int(tf_serve.split(":")[2].split("/")[0])), timeout=30) as raw:
        body = json.dumps(crashing).encode()
        raw.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body) + body)  # fmt: skip
        got = b""
        while chunk := raw.recv(65536):  # ends when the server closes
            got += chunk
    head = got.split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 500") and b"connection: close" not in head


def test_a_refusal_reaches_the_user_with_the_servers_reason(tf_serve: str) -> None:
    """transformers serve 5.25 refuses an empty image with FastAPI's ``{"detail": ...}`` 400: mmchaos's
    error says why (it said only 'HTTP 400: Bad Request')."""
    answer = _post(tf_serve, CRASH_CANDIDATES["an empty image"])
    if answer.status_code == 500:
        pytest.skip("this release crashes on an empty image (transformers <= 5.24): no refusal to read")
    target = OpenAITarget.connect(tf_serve, model=MODEL, max_concurrency=1)
    try:
        with pytest.raises(TargetCallError) as refused:
            target.generate_encoded("What is this?", [b""], GenerationParams(max_new_tokens=2, logprobs=False))
    finally:
        target.close()
    reason = answer.json()["detail"]
    assert "Incorrect image source" in str(refused.value) and refused.value.code == "http_400", (reason, refused.value)


# -- the suites' checks against it ----------------------------------------------------------------

POISONS = ["malformed_base64", "garbage_image", "truncated_png"]
SUITE: dict[str, Any] = {
    "name": "tfserve",
    "seed": 0,
    "checks": [
        {"check": "modality_coverage"},
        {"check": "robustness", "params": {"samples": 4, "severities": [3], "perturbations": ["gaussian_noise"],
                                           "worst_cases": 1}},
        {"check": "contract", "params": {"cases": ["zero_byte", "truncated_jpeg", "mode_CMYK_jpeg"], "workers": 1}},
        {"check": "generation_batch_invariance", "params": {"probes": 1, "runs": 1}},
        {"check": "image_token_consistency"},
        {"check": "serving_streaming", "params": {"requests": 2, "max_tokens": 8, "load_requests": 4,
                                                  "concurrency": 2, "disconnect_max_tokens": 240,
                                                  "max_probe_streams": 4, "release_timeout_s": 5.0},
         "gate": {"ttft_slo_ms": 30000, "tpot_slo_ms": 10000}},
        {"check": "serving_poison", "params": {**FAST, "poisons": POISONS, "poison_s": 1.5,
                                               "slo": {**FAST["slo"], "p99_ms": 30000}}},
        {"check": "multi_turn_consistency", "params": {"last_images": 2}},
    ],
}  # fmt: skip
"""The quick and serving suites' checks that apply to a chat endpoint, at small counts."""


@pytest.fixture(scope="module")
def findings(tf_serve: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    from mmchaos.cli import main

    where = tmp_path_factory.mktemp("tfserve-run")
    suite = where / "suite.yaml"
    suite.write_text(yaml.safe_dump(SUITE))
    try:
        main(["validate", "--target", f"openai:{tf_serve}", "--model", MODEL, "--suite", str(suite),
              "--out", str(where / "out"), "--store", str(where / "runs.db")])  # fmt: skip
    except SystemExit as exc:
        assert exc.code in (0, 1), exc.code
    out: list[dict[str, Any]] = json.loads((where / "out" / "results.json").read_text())["findings"]
    return out


def _one(findings: list[dict[str, Any]], check: str, title: str = "") -> dict[str, Any]:
    found = [f for f in findings if f["check"] == check and f["title"].startswith(title)]
    assert len(found) == 1, [f["title"] for f in findings if f["check"] == check]
    return found[0]


def test_streaming_is_measured_and_equal(findings: list[dict[str, Any]]) -> None:
    eq = _one(findings, "serving_streaming", "streaming equivalence")
    assert eq["verdict"] == "pass" and eq["metrics"]["mismatches"] == 0 and eq["metrics"]["failures"] == 0
    assert all(r["done"] for r in eq["evidence"]["requests"])
    latency = _one(findings, "serving_streaming", "stream latency")
    m = latency["metrics"]
    assert m["errors"] == 0 and m["goodput_ratio"] == 1.0
    assert 0 < m["ttft_p50_ms"] <= m["ttft_p95_ms"] and m["tpot_p95_ms"] > 0 and m["itl_p50_ms"] > 0
    assert "not measured" not in latency["title"] and "-1" not in latency["title"]


def test_the_disconnect_probe_sees_its_streams_end_without_done(findings: list[dict[str, Any]]) -> None:
    """No gauge: the black-box probe. It read each stream after the disconnects up to [DONE] only, and
    transformers serve sends none and keeps the connection open: every answered stream looked held,
    'the slot was not given back'. Read to the finish_reason, all are answered."""
    probe = _one(findings, "serving_streaming", "disconnect mid-stream")
    assert probe["verdict"] != "fail", probe["message"]
    assert probe["evidence"]["method"] == "black-box probe" and probe["evidence"]["tested"]
    assert probe["metrics"]["answered_after"] == probe["evidence"]["asked_after"] > 0
    assert "given back" not in probe["title"]  # nothing shown it was: the probe never ran out of slots


def test_the_report_says_logprobs_were_ignored(findings: list[dict[str, Any]]) -> None:
    coverage = _one(findings, "modality_coverage")
    assert coverage["verdict"] == "pass" and "ignores logprobs" in coverage["title"]
    invariance = _one(findings, "generation_batch_invariance")
    assert "max_logprob_deviation" not in invariance["metrics"]  # nothing measured, no 0 claimed
    assert "no logprobs" in invariance["title"]


def test_every_failing_finding_is_true(tf_serve: str, findings: list[dict[str, Any]]) -> None:
    """The failing findings are exactly those direct requests confirm: the contract cases and the
    placeholder mismatches this release crashes on (a 500, not a typed 4xx), the multi-turn answer and
    the poisons (a 500, or a refusal that is not OpenAI error JSON: the next test)."""
    from mmchaos.hostile import CorpusBase, get_case

    base = CorpusBase(image=_red(), caption="a red square")
    cases = {case: _chat(_image_parts(data_url(get_case(case).build(base).data))) for case in ("zero_byte",
             "truncated_jpeg", "mode_CMYK_jpeg")}  # fmt: skip
    assert _post(tf_serve, cases.pop("mode_CMYK_jpeg")).status_code == 200  # answered, in every release
    crashing_cases = {case for case, body in cases.items() if _crashes(tf_serve, body)}
    mismatch = _one(findings, "image_token_consistency", "mismatch")["evidence"]
    question = f"{mismatch['placeholder']} What colour is the shape?"
    mismatches = {"placeholder_without_image": _chat(question), "extra_placeholder": _chat(_image_parts(RED, question))}
    crashing_mismatches = {name for name, body in mismatches.items() if _crashes(tf_serve, body)}

    failing = {(f["check"], f["title"].split(":")[0]) for f in findings if f["verdict"] in ("fail", "error")}
    expected = {*(("contract", case) for case in crashing_cases),
                *([("image_token_consistency", "mismatch")] if crashing_mismatches else []),
                ("multi_turn_consistency", "the last turn is not answered about its own image"),
                *(("serving_poison", f"poison {kind}") for kind in POISONS)}  # fmt: skip
    assert failing == expected, (failing, crashing_cases, crashing_mismatches)
    assert _one(findings, "contract", f"{3 - len(crashing_cases)} of 3 hostile inputs")["verdict"] == "pass"
    for name in mismatches:
        outcome = mismatch["outcomes"][name]
        if name in crashing_mismatches:
            assert outcome["outcome"] == "untyped_error" and "HTTP 500" in outcome["error"], outcome  # not a reset
        else:
            assert "HTTP 500" not in str(outcome), outcome


def test_poison_fails_as_the_server_answers_it_and_the_good_traffic_next_to_it_is_answered(
    tf_serve: str, findings: list[dict[str, Any]]
) -> None:
    """A poison the server crashes on fails as '5xx' (up to transformers 5.24, a plain-text 500); one
    it refuses with FastAPI's ``{"detail": ...}`` 400 (5.25) fails as not OpenAI error JSON."""
    isolation = _one(findings, "serving_poison", "isolation")
    assert isolation["verdict"] == "pass", isolation["title"]  # no good request blamed for a closed connection
    for kind, url in (("malformed_base64", "data:image/png;base64,!!not base64!!"),
                      ("garbage_image", "data:image/png;base64," + "QUJD" * 8)):  # fmt: skip
        answer = _post(tf_serve, _chat(_image_parts(url)))
        title = _one(findings, "serving_poison", f"poison {kind}")["title"]
        if answer.status_code == 500:
            assert not answer.headers["content-type"].startswith("application/json")
            assert "5xx" in title, title
        else:
            assert answer.status_code == 400 and "error" not in answer.json(), answer.text
            assert "not OpenAI error JSON" in title, title


def test_the_multi_turn_failure_is_what_the_model_does(tf_serve: str, findings: list[dict[str, Any]]) -> None:
    """True of the deployment, by direct requests: turn 2 is answered with the first image's colour
    while its own image alone is answered right. The in-process model answers the same chat the same
    way: transformers serve relays the model faithfully, and the black-box probe (no logprobs) sees it."""
    from mmchaos.data.vqa import QUESTIONS, known_answer_samples
    from mmchaos.targets import load_target
    from mmchaos.targets.generation import Message

    finding = _one(findings, "multi_turn_consistency")
    (chat,) = [c for c in finding["evidence"]["chats"] if c["known_alone"]]
    first, *lasts = known_answer_samples(3, "colour", seed=1, split="val")
    last = next(s for s in lasts if s.answer == chat["right_answer"])
    params = GenerationParams(max_new_tokens=8, logprobs=False)
    opening_q, follow_up = QUESTIONS["colour"][0], QUESTIONS["colour"][1]
    answers = []
    for target in (OpenAITarget.connect(tf_serve, model=MODEL), load_target("builtin:tiny-vlm")):
        try:
            opening = target.generate(opening_q, [first.load_image()], params).text
            messages = [Message("user", (first.load_image(), opening_q)), Message("assistant", opening),
                        Message("user", (last.load_image(), follow_up))]  # fmt: skip
            answers.append((target.generate(messages, params=params).text,
                            target.generate(follow_up, [last.load_image()], params).text))  # fmt: skip
        finally:
            target.close()
    served, in_process = answers
    assert first.answer in served[0] and last.answer not in served[0]  # the first image's colour
    assert last.answer in served[1]  # alone, its own
    assert served == in_process
