"""What the checks of a run share (one worker pool, one reference server) and the true model time.

Defects reproduced here (issue 13): contract and determinism each spawned their own worker pool
(two torch imports and model loads per run); model time summed overlapping calls (thread_safety
showed more model time than wall time) and left out worker processes and the server's threads.
"""

from __future__ import annotations

from typing import Any

import pytest

from mmchaos.checks.base import CheckContext
from mmchaos.checks.contract.contract import Contract, ContractParams
from mmchaos.checks.integration.determinism import Determinism
from mmchaos.data.shapes import make_shapes
from mmchaos.executors.pool import WorkerPool
from mmchaos.executors.resources import RunResources
from mmchaos.findings import Verdict
from mmchaos.runner import TimedTarget
from tests.fakes import broken_targets as bt

DATA = make_shapes(4, seed=1)


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
    """With spawned workers (no fork server), the pool starts before the target is loaded in this
    process (a spy counts starts; the pool is real). Forked workers: test_fork_server.py."""
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
    monkeypatch.setenv("MMCHAOS_FORK_WORKERS", "0")
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
