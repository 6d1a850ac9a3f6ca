"""Continuous batching in ``mmchaos serve`` (:mod:`mmchaos.server.continuous`) over a real loopback
server and builtin:tiny-vlm: requests join the running rows between decoding steps and leave after
their last token, and each gets the answer it gets alone on a server that never batches (greedy
tokens, text, finish reason and usage identical; a stream's deltas concatenate to that text).

The model calls are lined up deterministically behind a gate
(:class:`~tests.fakes.server_targets.GatedTarget`): each prefill and each step is one gated call,
so a test holds the engine at an exact step while requests arrive or leave. Nothing here asserts
on time: only on answers, counts and the engine's recorded joins and rows per step.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
import pytest

from mmchaos.server import ServerConfig, ServerThread
from mmchaos.server.continuous import ContinuousEngine, sample_token, top_p_filter
from mmchaos.targets.base import Target
from mmchaos.targets.generation import GenerationParams
from mmchaos.targets.wrappers import DelegatingTarget
from tests.fakes.server_targets import GatedTarget
from tests.fakes.step_batches import ColumnPositions
from tests.integration.server.test_server_batching import _answer, _chat, _gone, _post, _raw_chat, wait_until

pytestmark = pytest.mark.integration

R = TypeVar("R")
PATH = "/v1/chat/completions"
CONTINUOUS = ServerConfig(model_name="m", max_concurrency=8)


def _alone(target: Target, bodies: Sequence[dict[str, Any]]) -> list[Any]:
    """The reference: each request alone, on a server that never batches."""
    with ServerThread(target, ServerConfig(model_name="m", batching=False)) as srv:
        assert srv.state.continuous is None
        post = _post(srv.url, PATH)
        return [_answer(PATH, post(b)) for b in bodies]


@pytest.fixture(scope="module")
def reference(vlm: GatedTarget) -> list[Any]:
    return _alone(vlm, [_chat(i, 12) for i in range(8)])


def _engine(srv: ServerThread) -> ContinuousEngine:
    engine = srv.state.continuous
    assert engine is not None, "builtin:tiny-vlm decodes step by step: the server should batch it so"
    return engine


def _held_first(srv: ServerThread, vlm: GatedTarget, pool: ThreadPoolExecutor, body: dict[str, Any]) -> Any:
    """Send ``body`` and hold its prefill in the model."""
    vlm.hold()
    first = pool.submit(_post(srv.url, PATH), body)
    assert vlm.entered.acquire(timeout=60.0)
    return first


# -- joining -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("broken", [False, True], ids=["own-positions", "column-positions"])
def test_requests_lined_up_behind_a_prefill_join_as_one_and_get_their_answers_alone(
    broken: bool, vlm: GatedTarget, reference: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seven requests arrive while the first one's prefill runs: they join in one prefill (left
    padded: other images, other questions, one without an image) and decode with it as eight rows.
    The broken twin numbers positions by column and changes answers, so the comparison can fail."""
    if broken:
        inner = vlm.inner
        monkeypatch.setattr(inner, "step_batch", lambda: ColumnPositions(inner.model, inner.torch))
    bodies = [_chat(i, 12) for i in range(8)]
    with ServerThread(vlm, CONTINUOUS) as srv, ThreadPoolExecutor(8) as pool:
        engine = _engine(srv)
        first = _held_first(srv, vlm, pool, bodies[0])
        rest = [pool.submit(_post(srv.url, PATH), b) for b in bodies[1:]]
        wait_until(lambda: engine.waiting == 7)
        vlm.open()
        got = [_answer(PATH, f.result(120)) for f in (first, *rest)]
        assert engine.joins == [1, 7] and max(engine.sizes) == 8
        assert srv.state.registry.get_sample_value("mmchaos_server_batch_size_sum", {"kind": "chat"}) == 8.0
    if broken:
        assert got != reference
    else:
        assert got == reference
        assert 7 in vlm.batch_sizes and 8 in vlm.batch_sizes  # a prefill of seven, steps of eight


def test_a_request_that_arrives_mid_decode_joins_at_the_next_step(vlm: GatedTarget, reference: list[Any]) -> None:
    """The first request is decoding (held at its first step) when the second arrives: the second
    joins before the next step, the two decode as two rows, and each ends as it ends alone."""
    bodies = [_chat(0, 12), _chat(3, 12)]
    with ServerThread(vlm, CONTINUOUS) as srv, ThreadPoolExecutor(2) as pool:
        engine = _engine(srv)
        first = _held_first(srv, vlm, pool, bodies[0])
        vlm.let_through(1)  # its prefill
        assert vlm.entered.acquire(timeout=60.0)  # its first step, held
        second = pool.submit(_post(srv.url, PATH), bodies[1])
        wait_until(lambda: engine.waiting == 1)
        vlm.open()
        got = [_answer(PATH, f.result(120)) for f in (first, second)]
        assert engine.joins == [1, 1] and engine.sizes[:2] == [1, 2]
    assert got == [reference[0], reference[3]]


def test_seeded_and_multi_sampled_requests_run_around_the_engine(vlm: GatedTarget) -> None:
    """A seed promises the request's answer alone (drawn from the process RNG as ``generate``
    draws it): seeded and n>1 sampling go to ``generate``; unseeded sampling and greedy decode
    step by step."""
    sampled = {**_chat(1, 6), "temperature": 0.9, "top_p": 0.8}
    with ServerThread(vlm, CONTINUOUS) as srv:
        engine, post = _engine(srv), _post(srv.url, PATH)
        seeded = [post({**sampled, "seed": 7}).json()["choices"][0]["message"]["content"] for _ in range(2)]
        assert seeded[0] == seeded[1] and engine.joins == []
        assert len(post({**sampled, "n": 2}).json()["choices"]) == 2 and engine.joins == []
        r = post(sampled)
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
        assert engine.joins == [1]
        greedy = post({**_chat(1, 6), "n": 3}).json()["choices"]
        assert len(greedy) == 3 and len({c["message"]["content"] for c in greedy}) == 1 and engine.joins == [1, 1]


# -- streaming -----------------------------------------------------------------------------------------


def _stream(url: str, body: dict[str, Any]) -> tuple[list[str], str | None, dict[str, Any]]:
    """A streamed request's content deltas, finish reason and usage."""
    deltas: list[str] = []
    finish = None
    usage: dict[str, Any] = {}
    with httpx.Client(base_url=url, timeout=120.0) as c, c.stream("POST", PATH, json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk["choices"]:
                if choice["delta"].get("content"):
                    deltas.append(choice["delta"]["content"])
                finish = choice["finish_reason"] or finish
    return deltas, finish, usage


def test_streams_decoded_together_concatenate_to_their_answers_alone(vlm: GatedTarget, reference: list[Any]) -> None:
    """Four streams, two with a stop string taken from the middle of their answer alone: each
    stream's deltas concatenate to the non-streamed answer alone (stop strings cut as there),
    with its finish reason and usage, and a long answer comes in more than one delta."""
    bodies = []
    for i in range(4):
        body = {**_chat(i, 12), "stream": True, "stream_options": {"include_usage": True}}
        text = reference[i][0]
        if i % 2 and len(text) > 6:
            body["stop"] = [text[4:6]]
        bodies.append(body)
    want = _alone(vlm, [{**b, "stream": False, "stream_options": None} for b in bodies])
    with ServerThread(vlm, CONTINUOUS) as srv, ThreadPoolExecutor(4) as pool:
        engine = _engine(srv)
        vlm.hold()
        streams = [pool.submit(_stream, srv.url, bodies[0])]
        assert vlm.entered.acquire(timeout=60.0)
        streams += [pool.submit(_stream, srv.url, b) for b in bodies[1:]]
        wait_until(lambda: engine.waiting == 3)
        vlm.open()
        got = [f.result(120) for f in streams]
        assert engine.joins == [1, 3]
    for (deltas, finish, usage), (text, _, want_finish, want_usage), body in zip(got, want, bodies, strict=True):
        assert "".join(deltas) == text
        assert finish == want_finish and usage == want_usage
        if "stop" in body:
            assert want_finish == "stop" and body["stop"][0] not in text
        if len(text) > 8:
            assert len(deltas) > 1


# -- leaving ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("when", ["waiting", "running"])
def test_a_request_whose_client_leaves_leaves_the_batch_and_the_others_get_their_answers(
    when: str, vlm: GatedTarget, reference: list[Any]
) -> None:
    """One of four requests loses its client: while it waits to join (it leaves the queue; three
    join), or while its row decodes (answered 499 at once; its row leaves at the next step and
    its slot is given back then, not at the end of the others' decoding)."""
    with ServerThread(vlm, CONTINUOUS) as srv, ThreadPoolExecutor(3) as pool:
        engine = _engine(srv)
        first = _held_first(srv, vlm, pool, _chat(0, 12))
        others = [pool.submit(_post(srv.url, PATH), _chat(i, 12)) for i in (1, 2)]
        leaving = _raw_chat(srv.port, _chat(4, 12))
        wait_until(lambda: engine.waiting == 3)
        if when == "waiting":
            leaving.close()
            wait_until(lambda: engine.waiting == 2 and _gone(srv) == 1)
            vlm.open()
        else:
            for _ in range(3):  # the first's prefill, its first step, the three's prefill
                vlm.let_through(1)
                assert vlm.entered.acquire(timeout=60.0)
            assert vlm.batch_sizes[-3:] == [1, 3, 4]  # now the first step of four rows is held
            leaving.close()
            wait_until(lambda: _gone(srv) == 1)
            vlm.let_through(1)
            assert vlm.entered.acquire(timeout=60.0)  # the next step: three rows
            assert vlm.batch_sizes[-1] == 3
            wait_until(lambda: srv.state.admission.active == 3)  # its slot is back
            vlm.open()
        answers = [_answer(PATH, f.result(120)) for f in (first, *others)]
        assert answers == reference[:3]
        assert engine.joins == ([1, 2] if when == "waiting" else [1, 3])
        wait_until(lambda: srv.state.admission.active == 0)
        assert _answer(PATH, _post(srv.url, PATH)(_chat(3, 12))) == reference[3]  # and the server goes on


# -- failing -----------------------------------------------------------------------------------------------


class FailingPasses(DelegatingTarget):
    """The model crashes in a prefill whose joiners include a poison request (its question names
    the poison word), or in one chosen decoding step."""

    def __init__(self, inner: Target, poison_ids: set[int]) -> None:
        super().__init__(inner)
        self.poison_ids = poison_ids
        self.fail_step: int | None = None
        self.nan_step: int | None = None  # this step's first row gets NaN logits
        self.steps = 0
        self.lock = threading.Lock()

    def call(self, fn: Callable[..., R], *args: Any) -> R:
        if fn.__name__ == "_join":
            ids = args[1]["input_ids"]
            if any(set(row.tolist()) >= self.poison_ids for row in ids):
                raise RuntimeError("poisoned prefill")
        if fn.__name__ == "_step":
            self.steps += 1
            if self.steps == self.fail_step:
                raise RuntimeError("crashed step")
            if self.steps == self.nan_step:
                logits = super().call(fn, *args).clone()  # an inference tensor: not written in place
                logits[0, 3] = float("nan")
                return logits
        return super().call(fn, *args)


def _poisoned(vlm: GatedTarget) -> tuple[FailingPasses, dict[str, Any]]:
    word = " zebra quartz"
    ids = set(vlm.inner.tokenizer.encode(word, add_special_tokens=False))
    body = _chat(1, 12)
    body["messages"][0]["content"][-1]["text"] += word
    return FailingPasses(vlm, ids), body


def test_a_poison_request_fails_its_prefill_alone(vlm: GatedTarget, reference: list[Any]) -> None:
    """Four requests join in one prefill and one of them makes the model crash: the prefill runs
    again one joiner at a time, the poison request alone fails (500), the others get their
    answers, and the breaker counts the one failure, not the batch's."""
    failing, poison = _poisoned(vlm)
    bodies = [_chat(0, 12), _chat(2, 12), poison, _chat(3, 12), _chat(4, 12)]
    with ServerThread(failing, CONTINUOUS) as srv, ThreadPoolExecutor(5) as pool:
        engine = _engine(srv)
        first = _held_first(srv, vlm, pool, bodies[0])
        rest = [pool.submit(_post(srv.url, PATH), b) for b in bodies[1:]]
        wait_until(lambda: engine.waiting == 4)
        vlm.open()
        statuses = [f.result(120).status_code for f in (first, *rest)]
        assert statuses == [200, 200, 500, 200, 200]
        got = [_answer(PATH, f.result(120)) for i, f in enumerate((first, *rest)) if i != 2]
        assert engine.joins == [1, 1, 1, 1]  # the first alone, then the three good ones one by one
        assert srv.state.breaker._n_failed == 1
    assert got == [reference[i] for i in (0, 2, 3, 4)]


@pytest.mark.parametrize("fault", ["crashed step", "nan row"])
def test_a_failing_step_fails_what_it_broke_and_the_server_goes_on(
    fault: str, vlm: GatedTarget, reference: list[Any]
) -> None:
    """Two rows decode. The model crashes in their third step: both fail (500; their cache is one
    tensor) and the next request decodes in a new batch and gets its answer alone. Or the model
    gives the first row NaN logits in the second step: that request fails (500, the model's fault,
    named in the message) and leaves, and the other row decodes on to its answer alone."""
    failing, _ = _poisoned(vlm)
    if fault == "crashed step":
        failing.fail_step = 3
    else:
        failing.nan_step = 2
    with ServerThread(failing, CONTINUOUS) as srv, ThreadPoolExecutor(2) as pool:
        engine = _engine(srv)
        first = _held_first(srv, vlm, pool, _chat(0, 12))
        second = pool.submit(_post(srv.url, PATH), _chat(2, 12))
        wait_until(lambda: engine.waiting == 1)
        vlm.open()
        bad = first.result(120)
        assert bad.status_code == 500
        if fault == "crashed step":
            assert "crashed step" in bad.json()["error"]["message"] and second.result(120).status_code == 500
            assert engine.running == 0
            assert _answer(PATH, _post(srv.url, PATH)(_chat(3, 12))) == reference[3]
        else:
            assert "NaN or +inf logits" in bad.json()["error"]["message"]
            assert _answer(PATH, second.result(120)) == reference[2]


# -- sampling as transformers samples -------------------------------------------------------------------


def test_top_p_drops_the_tail_transformers_drops() -> None:
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import TopPLogitsWarper

    gen = torch.Generator().manual_seed(3)
    for top_p in (0.1, 0.5, 0.9, 0.999):
        scores = torch.randn(500, generator=gen) * 3
        want = TopPLogitsWarper(top_p)(torch.zeros((1, 1), dtype=torch.long), scores[None].clone())[0]
        got = top_p_filter(torch, scores, top_p)
        assert torch.equal(torch.isfinite(got), torch.isfinite(want)), top_p
    greedy = GenerationParams(temperature=0.0)
    assert sample_token(torch, scores, greedy, None) == int(scores.argmax())
    draws = {sample_token(torch, scores, GenerationParams(temperature=1.0, top_p=0.1), gen) for _ in range(50)}
    assert draws <= set(torch.isfinite(top_p_filter(torch, scores, 0.1)).nonzero()[:, 0].tolist())
