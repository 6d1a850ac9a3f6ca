"""What the checks of a run share (one worker pool, one reference server) and the true model time.

Defects reproduced here (issue 13): contract and determinism each spawned their own worker pool
(two torch imports and model loads per run); model time summed overlapping calls (thread_safety
showed more model time than wall time) and left out worker processes and the server's threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from mmchaos.checks.base import CheckContext
from mmchaos.checks.contract.contract import Contract, ContractParams
from mmchaos.checks.integration.determinism import Determinism
from mmchaos.data.shapes import make_shapes
from mmchaos.executors.pool import WorkerPool
from mmchaos.executors.resources import RunResources, shared
from mmchaos.findings import Verdict
from mmchaos.runner import TimedTarget
from mmchaos.timing import ModelClock, union_seconds
from tests import broken_targets as bt

DATA = make_shapes(4, seed=1)


# -- run resources ---------------------------------------------------------------------------------


def test_a_resource_is_started_once_and_closed_at_run_end() -> None:
    started: list[int] = []
    closed: list[int] = []

    def factory() -> int:
        started.append(1)
        return len(started)

    res = RunResources()
    res.prefetch("k", factory, closed.append)
    assert res.get("k", factory, closed.append) == 1
    assert res.get("k", factory, closed.append) == 1
    assert res.get("other", factory, closed.append) == 2, "a different key gets its own"
    assert closed == []
    res.close()
    assert sorted(closed) == [1, 2] and len(started) == 2


def test_a_failed_start_raises_to_the_caller_and_a_later_call_retries() -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("no")
        return "ok"

    res = RunResources()
    res.prefetch("k", flaky, lambda _: None)
    with pytest.raises(RuntimeError):
        res.get("k", flaky, lambda _: None)
    assert res.get("k", flaky, lambda _: None) == "ok"
    res.close()


def test_discard_closes_and_the_next_get_starts_fresh() -> None:
    closed: list[object] = []
    res = RunResources()
    first = res.get("k", object, closed.append)
    res.discard("k")
    assert closed == [first]
    assert res.get("k", object, closed.append) is not first
    res.close()


def test_shared_without_run_resources_starts_and_closes_its_own() -> None:
    closed: list[str] = []
    with shared(None, "k", lambda: "mine", closed.append) as (value, is_shared):
        assert value == "mine" and not is_shared and closed == []
    assert closed == ["mine"]


# -- model time ------------------------------------------------------------------------------------


def test_overlapping_intervals_count_once() -> None:
    assert union_seconds([(0.0, 1.0), (0.5, 1.5), (3.0, 4.0), (3.2, 3.4)]) == pytest.approx(2.5)
    clock = ModelClock()
    clock.add(10.0, 11.0)
    clock.add(10.0, 11.0)
    assert clock.seconds == pytest.approx(1.0) and clock.calls == 2


class _SlowTarget(bt.ContractSafeTarget):
    """Every call waits until two calls are inside the model at once, then works for 50 ms."""

    def __init__(self) -> None:
        super().__init__()
        self.barrier = threading.Barrier(2, timeout=10)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        self.barrier.wait()
        time.sleep(0.05)
        return super().embed_texts(texts)


def test_concurrent_calls_are_not_double_counted() -> None:
    timed = TimedTarget(_SlowTarget())
    start = time.perf_counter()
    threads = [threading.Thread(target=timed.embed_texts, args=(["a photo"],)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    assert timed.calls == 2
    # Two calls overlapped for >= 50 ms: a sum would exceed the wall time; the union cannot.
    assert 0 < timed.seconds <= wall


# -- one worker pool per run -----------------------------------------------------------------------


def _ctx(target: Any, check_id: str, res: RunResources | None) -> CheckContext:
    return CheckContext(target=TimedTarget(target), dataset=DATA, seed=0, check_id=check_id, resources=res)


@pytest.mark.integration
def test_contract_and_determinism_share_one_pool_and_count_its_model_time() -> None:
    res = RunResources()
    contract = Contract(ContractParams(cases=["exif", "mode_L", "zero_byte"], timeout_s=20.0))
    determinism = Determinism()
    try:
        cctx = _ctx(bt.ContractSafeTarget(), "contract", res)
        dctx = _ctx(bt.ContractSafeTarget(), "determinism", res)
        contract.prepare(cctx)
        determinism.prepare(dctx)
        c_findings = list(contract.run(cctx))
        d_findings = list(determinism.run(dctx))
        pools = [e.value for e in res._entries.values() if isinstance(e.value, WorkerPool)]
        assert len(pools) == 1, "one pool for both checks"
        assert len(pools[0].load_seconds) == 2, "two workers loaded the target, once each"
    finally:
        res.close()
    assert all(f.verdict == Verdict.PASS for f in c_findings), [f.title for f in c_findings]
    assert [f.verdict for f in d_findings] == [Verdict.PASS, Verdict.PASS]
    assert cctx.target.calls > 0 and cctx.target.seconds > 0, "the workers' model calls are model time"  # type: ignore[attr-defined]


@pytest.mark.integration
def test_the_shared_pool_still_fails_a_process_salted_target() -> None:
    res = RunResources()
    try:
        ctx = _ctx(bt.ProcessSaltedTarget(), "determinism", res)
        findings = list(Determinism().run(ctx))
    finally:
        res.close()
    assert [f.verdict for f in findings] == [Verdict.PASS, Verdict.FAIL]


@pytest.mark.integration
def test_a_run_starts_one_pool_early_and_contract_determinism_and_fuzz_use_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool starts before the target is loaded in this process (a spy counts starts; the pool is real)."""
    import mmchaos.executors.pool as isolation
    from mmchaos.runner import RunConfig, run_suite
    from mmchaos.store import RunStore
    from mmchaos.suites import SuiteSpec

    starts: list[str] = []
    real = isolation.WorkerPool.__init__

    def counting(self: WorkerPool, spec: Any, *args: Any, **kw: Any) -> None:
        # Every pool, however a check imported start_pool, is a WorkerPool.
        starts.append(spec.uri)
        real(self, spec, *args, **kw)

    monkeypatch.setattr(isolation.WorkerPool, "__init__", counting)
    suite = SuiteSpec.model_validate(
        {
            "name": "pool",
            "checks": [
                {"check": "contract", "params": {"cases": ["zero_byte", "mode_L*"]}},
                {"check": "determinism", "params": {"samples": 4}},
                {"check": "contract_fuzz", "params": {"max_cases": 40, "max_seconds": 5, "kinds": ["image_bytes"]}},
            ],
        }
    )
    with RunStore(tmp_path / "runs.db") as store:
        result = run_suite(RunConfig(target="builtin:tiny-clip", suite=suite, data="builtin:shapes?n=8"), store)
        checks = {c.check_id: c for c in store.checks(result.run_id)}
    assert starts == ["builtin:tiny-clip"], "one pool for the run"
    bad = [f.title for f in result.findings if f.verdict != Verdict.PASS]
    assert not bad, bad
    assert checks["contract"].model_seconds > 0, "the workers' jobs are model time"
