"""One reference server per run, reused baselines, sequential phases, and chat traffic for VLMs.

Defects reproduced here (issues 13 and 10): every serving check started its own server, warm-up and
baseline; traffic phases always ran their full length; the server's model calls were not model
time; serving_overload and serving_poison skipped generative targets (no chat traffic).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from mmchaos.checks.base import Check, CheckContext
from mmchaos.data.shapes import make_shapes
from mmchaos.executors.resources import RunResources
from mmchaos.findings import Finding, Verdict
from mmchaos.runner import TimedTarget
from mmchaos.targets.generation import GenerationParams, GenerationResult, Message, as_messages
from tests.fakes.generative import WordsTarget
from tests.fakes.targets import HashEmbedTarget
from tests.support.serving import FAST

DATA = make_shapes(16, seed=3)


def _run(
    check_cls: type[Check[Any, Any]],
    target: Any,
    params: dict[str, Any],
    gate: dict[str, Any] | None = None,
    *,
    resources: RunResources | None = None,
    check_id: str | None = None,
) -> tuple[list[Finding], TimedTarget]:
    check = check_cls(check_cls.Params.model_validate(params), check_cls.Gate.model_validate(gate or {}))
    timed = TimedTarget(target)
    ctx = CheckContext(target=timed, dataset=DATA, seed=0, check_id=check_id or check_cls.name, resources=resources)
    return list(check.run(ctx)), timed


def _journal(findings: list[Finding]) -> dict[str, Any]:
    [f] = [f for f in findings if "journal" in f.evidence]
    return dict(f.evidence["journal"])


def _actions(journal: dict[str, Any]) -> list[str]:
    return [a["activity"]["name"] for a in journal["run"]]


@pytest.mark.integration
def test_serving_checks_of_a_run_share_one_server_and_reuse_the_last_baseline() -> None:
    from mmchaos.checks.serving.overload import ServingOverload
    from mmchaos.checks.serving.poison import ServingPoison

    params = {**FAST, "poisons": ["invalid_json", "garbage_image"], "poison_s": 0.6}
    res = RunResources()
    target = HashEmbedTarget()  # the run's one target
    try:
        first, timed = _run(ServingPoison, target, params, resources=res, check_id="poison_a")
        second, _ = _run(ServingPoison, target, params, resources=res, check_id="poison_b")
        ramp = {**FAST, "concurrency_steps": [1, 2], "step_s": 0.6}
        third, timed3 = _run(ServingOverload, target, ramp, resources=res)
    finally:
        res.close()
    for findings in (first, second, third):
        assert all(f.verdict == Verdict.PASS for f in findings), [f.title for f in findings if f.verdict != "pass"]
    j1, j2, j3 = _journal(first), _journal(second), _journal(third)
    assert "start_server" in _actions(j1)
    assert "use_shared_server" in _actions(j2) and "use_shared_server" in _actions(j3)
    assert j1["experiment"]["deployment"]["service"] == j2["experiment"]["deployment"]["service"]
    assert j2["steady_states"]["before"]["reused"]["reused_from"] == "poison_a"
    assert j2["teardown"]["clean"] and "shared by the run" in j2["teardown"]["server"]
    assert timed.seconds > 0 and timed.calls > 0, "the server's model calls are model time"
    assert timed3.calls > 0


class _DiesOnLargeImages(HashEmbedTarget):
    def __init__(self) -> None:
        super().__init__()
        self.dead = False

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        if self.dead or any(max(i.shape[:2]) > 1024 for i in images):
            self.dead = True
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().embed_images(images)


@pytest.mark.integration
def test_a_server_left_unhealthy_is_not_handed_to_the_next_check() -> None:
    from mmchaos.chaos.deployment import port_open
    from mmchaos.checks.serving.poison import ServingPoison

    params = {**FAST, "poisons": ["huge_image", "invalid_json"], "huge_side": 1536, "poison_s": 1.0}
    res = RunResources()
    target = _DiesOnLargeImages()
    try:
        broken, _ = _run(ServingPoison, target, params, resources=res, check_id="poison_a")
        j1 = _journal(broken)
        service = j1["experiment"]["deployment"]["service"]
        assert any(f.verdict == Verdict.FAIL for f in broken)
        assert j1["teardown"].get("server_stopped") is True
        host, port = service.rsplit("//", 1)[1].split(":")
        assert not port_open(host, int(port)), "the unhealthy server was stopped"
        target.dead = False  # the engine restarted with its new server
        fresh, _ = _run(ServingPoison, target, {**params, "poisons": ["invalid_json"]}, resources=res)
    finally:
        res.close()
    j2 = _journal(fresh)
    assert "start_server" in _actions(j2) and j2["experiment"]["deployment"]["service"] != service


class _SlowWords(WordsTarget):
    """Correct answers from one engine, 0.4 s a generation: requests queue, the SLO breaks at 4."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = threading.Lock()

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[Any] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        with self.engine:
            time.sleep(0.4)
        return super().generate(prompt, images, params)


class _EngineDiesOnLargeImage(WordsTarget):
    """One large image corrupts the engine: every later generation fails too."""

    def __init__(self) -> None:
        super().__init__()
        self.dead = threading.Event()

    def generate(
        self, prompt: str | Sequence[Message], images: Sequence[Any] = (), params: GenerationParams | None = None
    ) -> GenerationResult:
        seen = [i for m in as_messages(prompt, images) for i in m.images()]
        if self.dead.is_set() or any(max(np.asarray(i).shape[:2]) > 1024 for i in seen):
            self.dead.set()
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().generate(prompt, images, params)


@pytest.mark.integration
def test_overload_ramps_chat_requests_on_a_generative_target() -> None:
    from mmchaos.checks.serving.overload import ServingOverload

    params = {
        **FAST,
        "concurrency_steps": [1, 4],
        "step_s": 2.5,
        "request_timeout_s": 4.0,
        "slo": {**FAST["slo"], "p99_ms": 1000},
        "budget": {**FAST["budget"], "max_rate": 1000},
    }
    good, timed = _run(ServingOverload, WordsTarget(), params, {"min_knee_concurrency": 4})
    [knee] = [f for f in good if f.title.startswith("knee")]
    assert knee.verdict == Verdict.PASS, knee.title
    assert timed.calls > 0, "chat requests reached the model"
    kinds = _journal(good)["run"]
    assert any(a["activity"]["name"] == "load:concurrency=4" for a in kinds)
    slow, _ = _run(ServingOverload, _SlowWords(), params, {"min_knee_concurrency": 4})
    [knee] = [f for f in slow if f.title.startswith("knee")]
    assert knee.verdict == Verdict.FAIL and knee.metrics["knee_concurrency"] == 1, knee.title


@pytest.mark.integration
def test_poison_isolation_on_chat_requests() -> None:
    from mmchaos.checks.serving.poison import ServingPoison

    params = {**FAST, "poisons": ["huge_image", "invalid_json", "garbage_image"], "huge_side": 1536, "poison_s": 1.0}
    good, _ = _run(ServingPoison, WordsTarget(), params)
    assert all(f.verdict == Verdict.PASS for f in good), [f.title for f in good if f.verdict != Verdict.PASS]
    assert {f.evidence.get("poison") for f in good} >= {"huge_image", "invalid_json", "garbage_image"}
    broken, _ = _run(ServingPoison, _EngineDiesOnLargeImage(), params)
    [iso] = [f for f in broken if f.title.startswith("isolation")]
    assert iso.verdict == Verdict.FAIL and iso.metrics["good_success_rate"] < 1.0, iso.title
