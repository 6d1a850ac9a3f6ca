"""Pool workers forked from a server holding the run's loaded target (issue 23).

Defect reproduced: every worker of the run's pool was a fresh interpreter that imported torch and
transformers and loaded the target again (and again for each worker a hostile input killed): on
tiny-vlm ~55 s of samples in a profile of the quick suite. Now the run forks its workers from a
server that holds the target it loaded once; a crash or a hang still kills only the worker.
"""

from __future__ import annotations

import signal
import subprocess
from typing import Any

import numpy as np
import pytest

from mmchaos.executors.forkserver import ForkServer
from mmchaos.executors.jobs import WorkerSpec
from mmchaos.executors.pool import WorkerPool
from mmchaos.findings import Verdict
from tests.fakes.fork_jobs import job
from tests.support.workers import no_worker_interpreters

URI = "builtin:tiny-clip"


@pytest.mark.integration
def test_forked_workers_have_the_loaded_target_and_a_crash_or_hang_kills_only_the_worker(
    clip: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_worker_interpreters(monkeypatch)
    server = ForkServer.start(clip)
    assert server is not None
    spec = WorkerSpec(uri=URI, threads=1, memory_limit_mb=0)
    try:
        with WorkerPool(spec, job, workers=1, start_timeout=60.0, forks=server) as pool:
            first = dict(pool.map(["embed"], timeout=120.0))[0]
            bad = dict(pool.map(["segv", "hang"], timeout=3.0))  # the hang sleeps 600 s: no race with load
            after = dict(pool.map(["embed"], timeout=120.0))[0]
            replacements = pool.replacements
        assert server.forks == 3, "the first worker and one replacement per killed worker, all forked"
    finally:
        server.close()
    assert first.status == "ok" and after.status == "ok", (first, after)
    assert first.value["threads"] == 1, "one intra-op thread in a forked worker"
    assert first.value["pid"] != after.value["pid"], "the crashed worker was replaced"
    np.testing.assert_allclose(first.value["embedding"], clip.embed_texts(["a red circle"]), rtol=1e-5, atol=1e-6)
    assert bad[0].status == "crashed" and bad[0].exitcode == -signal.SIGSEGV, bad[0]
    assert "SIGSEGV" in bad[0].detail and "Extension modules" in bad[0].stderr, "faulthandler's trace in its log"
    assert bad[1].status == "hung", bad[1]
    assert replacements == 2


@pytest.mark.integration
def test_a_spec_the_server_cannot_serve_gets_spawned_workers(clip: Any) -> None:
    server = ForkServer.start(clip)
    assert server is not None
    try:
        assert server.accepts(WorkerSpec(uri=URI, threads=1))
        assert not server.accepts(WorkerSpec(uri=URI, threads=2)), "more threads: torch's OpenMP pool after fork"
        assert not server.accepts(WorkerSpec(uri=URI, options={"device": "cpu"}, threads=1)), "other load options"
        assert not server.accepts(WorkerSpec(uri="builtin:tiny-vlm", threads=1))
        assert not server.accepts(WorkerSpec(uri=URI, threads=1, fresh_process=True)), "a cross-process comparison"
    finally:
        server.close()
    assert not server.accepts(WorkerSpec(uri=URI, threads=1)), "a closed server forks nothing"


@pytest.mark.integration
def test_a_run_loads_the_target_once_and_its_pool_is_forked(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import mmchaos.runner as runner
    from mmchaos.runner import RunConfig, run_suite
    from mmchaos.store import RunStore
    from mmchaos.suites import SuiteSpec

    no_worker_interpreters(monkeypatch)
    loads: list[str] = []
    real = runner.load_target

    def counting(uri: str, *args: Any, **kwargs: Any) -> Any:
        loads.append(uri)
        return real(uri, *args, **kwargs)

    monkeypatch.setattr(runner, "load_target", counting)
    suite = SuiteSpec.model_validate(
        {
            "name": "forked",
            "checks": [
                {"check": "contract", "params": {"cases": ["zero_byte", "mode_L*", "truncated_jpeg"]}},
                {"check": "determinism", "params": {"samples": 4, "cross_process": False}},
            ],
        }
    )
    with RunStore(tmp_path / "runs.db") as store:
        result = run_suite(RunConfig(target=URI, suite=suite, data="builtin:shapes?n=8"), store)
        checks = {c.check_id: c for c in store.checks(result.run_id)}
    assert loads == [URI], "the target is loaded once per run, not per worker"
    bad = [f.title for f in result.findings if f.verdict != Verdict.PASS]
    assert not bad, bad
    assert checks["contract"].model_seconds > 0, "the forked workers' jobs are model time"


@pytest.mark.integration
def test_cross_process_determinism_still_compares_two_fresh_interpreters(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forked workers share this process's load (weights a load initialises at random, the hash
    salt): determinism's cross-process workers stay spawned, contract's are forked."""
    from mmchaos.executors.forkserver import ForkServer as Server
    from mmchaos.runner import RunConfig, run_suite
    from mmchaos.store import RunStore
    from mmchaos.suites import SuiteSpec

    spawned: list[str] = []
    forks: list[int] = []
    real_popen, real_spawn = subprocess.Popen, Server.spawn

    def popen(argv: Any, *args: Any, **kwargs: Any) -> Any:
        if "child_entry" in " ".join(map(str, argv)):
            spawned.append(str(argv))
        return real_popen(argv, *args, **kwargs)

    def spawn(self: Server, *args: Any, **kwargs: Any) -> Any:
        forks.append(1)
        return real_spawn(self, *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr(Server, "spawn", spawn)
    suite = SuiteSpec.model_validate(
        {
            "name": "both",
            "checks": [
                {"check": "contract", "params": {"cases": ["zero_byte"], "workers": 1}},
                {"check": "determinism", "params": {"samples": 2, "cross_process": True}},
            ],
        }
    )
    with RunStore(tmp_path / "runs.db") as store:
        result = run_suite(RunConfig(target=URI, suite=suite, data="builtin:shapes?n=4"), store)
    assert len(spawned) == 2 and len(forks) == 1, (spawned, forks)
    bad = [f.title for f in result.findings if f.verdict != Verdict.PASS]
    assert not bad, bad


def test_a_target_on_an_accelerator_gets_spawned_workers(clip: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forked child cannot use the parent's CUDA context: no fork server then."""
    import torch

    monkeypatch.setattr(clip, "load_options", {"device": "cuda:0"})
    assert ForkServer.start(clip) is None
    monkeypatch.setattr(clip, "load_options", {})
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert ForkServer.start(clip) is None


def test_forkserver_is_not_used_when_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from mmchaos.executors.forkserver import fork_enabled

    assert fork_enabled(URI)
    assert not fork_enabled("py:tests.fakes.targets:hash_embed"), "a py: target may hold sockets or threads"
    monkeypatch.setenv("MMCHAOS_FORK_WORKERS", "0")
    assert not fork_enabled(URI)
