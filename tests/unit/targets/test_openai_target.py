"""The ``openai:`` target's client side, against httpx MockTransport: retries and backoff, error
mapping, capability discovery, bounded concurrency, the loopback rule and the API key's secrecy."""

from __future__ import annotations

import base64
import json
import logging
import socket
import threading
import time
from typing import Any

import httpx
import numpy as np
import pytest

from mmchaos.errors import MMChaosError, TargetCallError, TargetLoadError
from mmchaos.targets import TargetOptions, load_target
from mmchaos.targets.base import Capability
from mmchaos.targets.openai_http import EndpointError, OpenAITarget, check_endpoint, parse_retry_after

URL = "http://127.0.0.1:9/v1"  # never contacted: every test here injects a MockTransport
DIM = 4


def vec_b64(i: int) -> str:
    return base64.b64encode(np.full(DIM, i, "<f4").tobytes()).decode()


class FakeAPI:
    """A scripted OpenAI-compatible endpoint: ``script`` answers come first, then normal ones."""

    def __init__(self, *, meta: dict[str, Any] | None = None, script: list[httpx.Response] | None = None,
                 image_messages_ok: bool = True, delay: float = 0.0) -> None:  # fmt: skip
        self.meta = meta
        self.script = list(script or [])
        self.requests: list[httpx.Request] = []
        self.image_messages_ok = image_messages_ok
        self.delay = delay
        self.inflight = 0
        self.max_inflight = 0
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.requests.append(request)
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if self.delay:
                time.sleep(self.delay)
            if self.script and request.url.path != "/v1/models":
                return self.script.pop(0)
            return self.answer(request)
        finally:
            with self.lock:
                self.inflight -= 1

    def answer(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            card: dict[str, Any] = {"id": "m", "object": "model", "created": 1, "owned_by": "x"}
            if self.meta is not None:
                card["mmchaos"] = self.meta
            return httpx.Response(200, json={"object": "list", "data": [card]})
        body = json.loads(request.content)
        if request.url.path == "/v1/embeddings":
            if "messages" in body:
                if not self.image_messages_ok:
                    return httpx.Response(400, json={"error": {"message": "no images", "code": "bad_request"}})
                # The vector depends on the decoded pixels (the probe checks that images are read).
                url = body["messages"][0]["content"][0]["image_url"]["url"]
                pixels = decoded_mean(url)
                emb = base64.b64encode(np.array([pixels, 1, 2, 3], "<f4").tobytes()).decode()
                return httpx.Response(200, json={"object": "list", "data": [{"index": 0, "embedding": emb}]})
            else:
                n = len(body["input"]) if isinstance(body["input"], list) else 1
            data = [{"object": "embedding", "index": i, "embedding": vec_b64(i)} for i in range(n)]
            return httpx.Response(200, json={"object": "list", "data": data[::-1]})  # any order
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": "READ"}}]})


def decoded_mean(url: str) -> float:
    import io

    from PIL import Image

    try:
        blob = base64.b64decode(url.partition(",")[2])
        return float(np.asarray(Image.open(io.BytesIO(blob)).convert("RGB")).mean())
    except Exception:  # undecodable test bytes: a fixed vector
        return -1.0


def connect(api: FakeAPI, **kwargs: Any) -> OpenAITarget:
    sleeps: list[float] = kwargs.pop("sleeps", [])
    return OpenAITarget.connect(URL, transport=httpx.MockTransport(api), sleep=sleeps.append, seed=0, **kwargs)


def err(status: int, code: str = "x", headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": f"m{status}", "type": "t", "code": code}}, headers=headers)


# -- retries ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 503])
def test_429_and_503_are_retried_with_jittered_exponential_backoff(status: int) -> None:
    sleeps: list[float] = []
    api = FakeAPI(script=[err(status), err(status), err(status)])
    target = connect(api, model="m", capabilities=["embed_text"], sleeps=sleeps, max_retries=3, backoff_base=0.1)
    out = target.embed_texts(["a", "b"])
    assert out.shape == (2, DIM) and out[1, 0] == 1.0
    assert len(api.requests) == 1 + 4 and target.retries == 3
    assert len(sleeps) == 3
    for attempt, s in enumerate(sleeps):  # equal jitter: between half and all of base * 2**attempt
        cap = 0.1 * 2**attempt
        assert cap / 2 <= s <= cap


def test_retry_after_is_honoured_and_too_long_a_wait_gives_up() -> None:
    sleeps: list[float] = []
    api = FakeAPI(script=[err(429, headers={"Retry-After": "2"})])
    target = connect(api, model="m", capabilities=["embed_text"], sleeps=sleeps)
    target.embed_texts(["a"])
    assert sleeps == [2.0]
    sleeps.clear()
    api.script = [err(503, "call_not_permitted", headers={"Retry-After": "3600"})]
    with pytest.raises(EndpointError) as info:
        target.embed_texts(["a"])
    assert sleeps == [] and info.value.status == 503 and info.value.code == "call_not_permitted"


def test_retries_are_bounded() -> None:
    sleeps: list[float] = []
    api = FakeAPI(script=[err(503)] * 10)
    target = connect(api, model="m", capabilities=["embed_text"], sleeps=sleeps, max_retries=2)
    with pytest.raises(EndpointError):
        target.embed_texts(["a"])
    assert len(sleeps) == 2


@pytest.mark.parametrize("status", [400, 408, 413, 422, 500, 502, 504])
def test_other_statuses_are_never_retried(status: int) -> None:
    sleeps: list[float] = []
    api = FakeAPI(script=[err(status, code="some_code")])
    target = connect(api, model="m", capabilities=["embed_text"], sleeps=sleeps)
    before = len(api.requests)
    with pytest.raises((TargetCallError, EndpointError)) as info:
        target.embed_texts(["a"])
    assert len(api.requests) == before + 1 and sleeps == []
    assert info.value.code == "some_code"
    # a refusal of the input is typed; a failure of the endpoint is not (it counts as a crash)
    assert isinstance(info.value, MMChaosError) == (status < 500 and status != 408)


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"detail": "Incorrect image source. Got ."}, "Incorrect image source. Got ."),  # transformers serve 5.25
        ({"detail": [{"loc": ["body", "messages", 0, "role"], "msg": "Input should be 'user'", "type": "x"},
                     {"loc": ["body", "max_tokens"], "msg": "Input should be a valid integer"}]},
         "body.messages.0.role: Input should be 'user'; body.max_tokens: Input should be a valid integer"),
    ],
)  # fmt: skip
def test_a_fastapi_refusal_keeps_its_detail_as_the_message(body: dict[str, Any], said: str) -> None:
    """FastAPI servers (transformers serve, many gateways) answer ``{"detail": ...}``: the reason is
    the message, not the bare status phrase."""
    api = FakeAPI(script=[httpx.Response(422 if isinstance(body["detail"], list) else 400, json=body)])
    target = connect(api, model="m", capabilities=["embed_text"])
    with pytest.raises(TargetCallError) as info:
        target.embed_texts(["a"])
    assert str(info.value).endswith(said) and info.value.code.startswith("http_4")


def test_parse_retry_after() -> None:
    assert parse_retry_after("5") == 5.0
    assert parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == pytest.approx(10.0)


def test_garbage_answers_are_endpoint_errors() -> None:
    api = FakeAPI(script=[httpx.Response(200, content=b"<html>"), httpx.Response(200, json={"data": [{"x": 1}]}),
                          httpx.Response(200, json={"data": []})])  # fmt: skip
    target = connect(api, model="m", capabilities=["embed_text"])
    for _ in range(3):
        with pytest.raises(EndpointError) as info:
            target.embed_texts(["a"])
        assert info.value.code == "bad_response"


def test_transport_failures_are_endpoint_errors() -> None:
    def boom(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return FakeAPI().answer(request)
        raise httpx.ReadTimeout("slow", request=request)

    target = OpenAITarget.connect(URL, transport=httpx.MockTransport(boom), capabilities=["embed_text"])
    with pytest.raises(EndpointError) as info:
        target.embed_texts(["a"])
    assert info.value.code == "timeout"


# -- discovery, batching, concurrency ---------------------------------------------------------------


def test_capabilities_are_probed_on_a_plain_openai_server() -> None:
    api = FakeAPI()
    target = connect(api)
    assert target.model == "m"
    # it answers chat completions too (READ for everything), with and without an image
    assert target.capabilities == {Capability.EMBED_TEXT, Capability.EMBED_IMAGE, Capability.GENERATE}
    assert target.image_input == "messages"  # vLLM's chat-embedding form, one image per request
    assert target.untested_modalities() == {}
    no_images = connect(FakeAPI(image_messages_ok=False))
    # the data URLs it then embeds as text strings do not make it an image model
    assert no_images.capabilities == {Capability.EMBED_TEXT, Capability.GENERATE}
    assert set(no_images.untested_modalities()) == {"image embeddings"}
    fp = target.fingerprint()
    assert fp.versions == {"endpoint": URL, "model": "m"} and fp.config


def test_mmchaos_metadata_gives_capabilities_fingerprint_and_batching() -> None:
    meta = {"capabilities": ["embed_image", "read_text", "torch_module"], "image_input": ["input", "messages"],
            "max_items": 3, "version": "9.9", "fingerprint": {"weights": "w", "tokenizer": "t", "processor": "p",
            "config": "c", "versions": {"torch": "2"}}}  # fmt: skip
    api = FakeAPI(meta=meta)
    target = connect(api)
    assert target.capabilities == {Capability.EMBED_IMAGE, Capability.READ_TEXT}  # no white-box over HTTP
    assert len(api.requests) == 1  # no probing needed
    fp = target.fingerprint()
    assert (fp.weights, fp.tokenizer, fp.processor, fp.config) == ("w", "t", "p", "c")
    assert fp.versions == {"torch": "2", "endpoint": URL, "model": "m", "mmchaos_server": "9.9"}
    images = [np.full((8, 8, 3), i, np.uint8) for i in range(7)]
    out = target.embed_images(images)
    assert out.shape == (7, DIM)
    batches = [json.loads(r.content)["input"] for r in api.requests[1:]]
    assert [len(b) for b in batches] == [3, 3, 1]  # batched as input items, max_items each
    url = batches[0][0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert target.read_text(images[:2]) == ["READ", "READ"]


def test_declared_capabilities_and_model_choice() -> None:
    target = connect(FakeAPI(), model="m", capabilities=["read_text"])
    assert target.capabilities == {Capability.READ_TEXT}
    with pytest.raises(TargetLoadError, match="does not serve model 'other'"):
        connect(FakeAPI(), model="other")


def test_encoded_bytes_are_sent_as_given() -> None:
    api = FakeAPI()
    target = connect(api, model="m", capabilities=["embed_image"])
    blob = b"\xff\xd8\xff\xe0 not really a jpeg"
    target.embed_encoded_images([blob])
    sent = json.loads(api.requests[-1].content)["messages"][0]["content"][0]["image_url"]["url"]
    assert sent == "data:image/jpeg;base64," + base64.b64encode(blob).decode()


def test_concurrency_is_bounded() -> None:
    api = FakeAPI(delay=0.05)
    target = connect(api, model="m", capabilities=["embed_image"], max_concurrency=3)
    target.embed_images([np.zeros((8, 8, 3), np.uint8)] * 9)
    assert 2 <= api.max_inflight <= 3
    target.close()


# -- the loopback rule -------------------------------------------------------------------------------


def resolver(*addresses: str) -> Any:
    def resolve(host: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in addresses]

    return resolve


def test_loopback_only_unless_allowed() -> None:
    with pytest.raises(TargetLoadError, match="which is not a loopback address") as info:
        check_endpoint("http://api.example.com/v1", resolver=resolver("93.184.216.34"))
    assert info.value.code == "remote_not_allowed"
    with pytest.raises(TargetLoadError, match="not a loopback"):  # one remote answer is enough to refuse
        check_endpoint("http://mixed.test/v1", resolver=resolver("127.0.0.1", "10.0.0.5"))
    assert check_endpoint("http://api.example.com/v1", allow_remote=True) == ("http://api.example.com/v1", None)
    # a name is pinned to the address it resolved to; the Host header keeps the name
    assert check_endpoint("http://localhost:8000/v1/", resolver=resolver("127.0.0.1")) == (
        "http://127.0.0.1:8000/v1",
        "localhost:8000",
    )
    assert check_endpoint("http://[::1]:8000/v1")[0] == "http://[::1]:8000/v1"
    for bad in ("ftp://127.0.0.1/v1", "127.0.0.1:8000", "http:///v1", "http://user:pw@127.0.0.1/v1"):
        with pytest.raises(TargetLoadError):
            check_endpoint(bad)


def test_remote_urls_are_refused_through_load_target_before_any_request() -> None:
    # an address literal needs no DNS, and the refusal comes before any connection is opened
    with pytest.raises(TargetLoadError, match="--allow-remote"):
        load_target("openai:http://192.0.2.1:8000/v1", TargetOptions(model="m"))


# -- the API key -------------------------------------------------------------------------------------


def test_api_key_is_sent_but_never_shown(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    secret = "sk-test-DO-NOT-LEAK-1234"
    monkeypatch.setenv("MY_KEY", secret)
    caplog.set_level(logging.DEBUG)
    api = FakeAPI(script=[err(429)])
    target = connect(api, model="m", capabilities=["embed_text"], api_key_env="MY_KEY")
    target.embed_texts(["a"])
    api.script = [err(400)]
    with pytest.raises(TargetCallError) as info:
        target.embed_texts(["a"])
    assert all(r.headers["authorization"] == f"Bearer {secret}" for r in api.requests)
    shown = [repr(target), str(target.describe()), str(target.fingerprint().to_dict()), str(dict(target.load_options)),
             str(info.value), caplog.text]  # fmt: skip
    assert not any(secret in s for s in shown)
    assert "MY_KEY" in repr(target) and target.describe()["endpoint"]["api_key_set"] is True
    unset = connect(FakeAPI(), model="m", capabilities=["embed_text"], api_key_env="NOT_SET_ANYWHERE")
    assert "authorization" not in unset._client.headers


def test_a_refused_key_is_a_load_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        return err(401, "invalid_api_key")

    with pytest.raises(TargetLoadError, match="refused the API key"):
        OpenAITarget.connect(URL, transport=httpx.MockTransport(refuse), api_key_env="NOT_SET_ANYWHERE")
