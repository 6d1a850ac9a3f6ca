"""Chat traffic of the serving experiments: streamed requests in the good mix, judged complete by how
their stream ends, and the two chat checks' defaults and metrics.

Defects reproduced here (issue 20): ``serving_faults`` and ``serving_resilience`` skipped every
generative target (they required embeddings); the good chat traffic was never streamed; both checks
wrote -1.0 for what they did not measure.
"""

from __future__ import annotations

import json
import random
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest

from mmchaos.chaos.payloads import _stream_validator, chat_mix
from mmchaos.chaos.spec import PayloadSpec
from mmchaos.checks.serving._common import measured
from mmchaos.checks.serving.faults import ServingFaults
from mmchaos.checks.serving.poison import ServingPoison
from mmchaos.checks.serving.resilience import ServingResilience
from mmchaos.data.shapes import make_shapes
from mmchaos.targets.base import Capability
from tests.fakes.generative import WordsTarget

EVENT = 'data: {"choices":[{"index":0,"delta":{"content":"%s"}%s}]}'


def _sse(*lines: str) -> httpx.Response:
    return httpx.Response(200, content="\n\n".join(lines).encode() + b"\n\n")


def test_a_stream_is_complete_at_done_or_its_finish_reason_and_cut_otherwise() -> None:
    _stream_validator(_sse(EVENT % ("red", ""), "data: [DONE]"))
    _stream_validator(_sse(EVENT % ("red", ""), EVENT % ("", ',"finish_reason":"stop"')))  # transformers serve
    with pytest.raises(ValueError, match="without a finish_reason"):
        _stream_validator(_sse(EVENT % ("red", "")))  # cut: no finish_reason, no [DONE]
    with pytest.raises(ValueError, match="malformed"):
        _stream_validator(_sse(EVENT % ("red", ""), 'data: {"choices":[{"ind'))  # cut inside an event
    with pytest.raises(ValueError, match="error in stream"):
        _stream_validator(_sse(EVENT % ("red", ""), 'data: {"error": {"message": "engine died"}}', "data: [DONE]"))


def _mix(share: float | None) -> Any:
    dep = SimpleNamespace(capabilities=frozenset({Capability.GENERATE}), prefix="/v1", model="m")
    ctx = SimpleNamespace(dataset=make_shapes(4, seed=1))
    return chat_mix(cast(Any, ctx), cast(Any, dep), PayloadSpec.model_validate({"stream_share": share}))


def test_the_chat_mix_streams_its_share_of_each_kind() -> None:
    rng = random.Random(0)
    picked = [_mix(0.5).pick(rng) for _ in range(400)]
    kinds = {r.kind for r in picked}
    assert kinds == {"chat_image", "chat_text", "chat_image_stream", "chat_text_stream"}
    streamed = [r for r in picked if r.kind.endswith("_stream")]
    assert 0.35 < len(streamed) / len(picked) < 0.65
    assert all(json.loads(r.content or b"")["stream"] is True for r in streamed)
    assert all(r.validate is _stream_validator for r in streamed)
    assert {r.kind for r in (_mix(None).pick(rng) for _ in range(50))} <= {"chat_image", "chat_text"}


def test_the_chat_checks_need_only_generate_and_stream_half_their_traffic() -> None:
    chat_only = WordsTarget()

    def share(check: Any, params: dict[str, Any]) -> float | None:
        return cast(float | None, check.Params.model_validate(params).payload.stream_share)

    for check in (ServingFaults, ServingResilience):
        assert check().missing_capabilities(chat_only) is None, check.name
        assert share(check, {}) == 0.5
        assert share(check, {"payload": {"samples": 2}}) == 0.5
        assert share(check, {"payload": {"stream_share": 0.0}}) == 0.0
    assert share(ServingPoison, {}) is None  # unchanged: not streamed


def test_a_metric_that_was_not_measured_is_absent_never_a_placeholder() -> None:
    assert measured(recovery_s=None, during_p99_ms=12.5, requests=0.0) == {"during_p99_ms": 12.5, "requests": 0.0}


def test_unknown_stream_faults_are_refused_with_the_closest_name() -> None:
    with pytest.raises(ValueError, match="did you mean stream_cut"):
        ServingFaults.Params.model_validate({"stream_faults": ["stream_cutt"]})


def test_slo_windows_are_widened_to_hold_enough_answers_at_the_clean_rate() -> None:
    """A chat target answering ~2.5 requests a second never fills a 0.25 s window with 3 answers:
    recovery could not be shown however well it did. The windows grow to hold them (x1.5)."""
    from mmchaos.chaos.spec import SLOSpec
    from mmchaos.chaos.windows import Phase
    from mmchaos.checks.serving._common import fit_windows

    journal: list[Any] = []
    ex = SimpleNamespace(slo=SLOSpec.model_validate({"window_s": 0.25, "min_window_requests": 3}),
                         activity=lambda *a, **k: journal.append(a))  # fmt: skip

    def baseline(ok: int, seconds: float) -> Phase:
        return Phase("steady_state_before", True, cast(Any, SimpleNamespace(ok=ok, duration_s=seconds)), [], {}, 0, 1)

    assert fit_windows(cast(Any, ex), baseline(200, 1.0)) is None and ex.slo.window_s == 0.25  # fast: kept
    assert fit_windows(cast(Any, ex), baseline(5, 2.0)) == pytest.approx(1.8)  # 1.5 * 3 / 2.5 per s
    assert ex.slo.window_s == pytest.approx(1.8) and journal[0][1] == "fit_slo_windows"


def test_chat_targets_get_two_requests_in_flight_unless_the_suite_says() -> None:
    from mmchaos.chaos.spec import ServingParams
    from mmchaos.checks.serving._common import chat_params

    def params(given: dict[str, Any]) -> ServingParams:
        return cast(ServingParams, ServingFaults.Params.model_validate(given))

    assert chat_params(params({}), True).concurrency == 2 and chat_params(params({}), False).concurrency == 4
    assert chat_params(params({"concurrency": 8}), True).concurrency == 8
