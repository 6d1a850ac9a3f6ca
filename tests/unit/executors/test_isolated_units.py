"""Isolated jobs (contract cases, fuzzed inputs) as journaled work units, without Ray or processes:
a job result survives the run store's JSON losslessly, keyed jobs are committed as they arrive
and read back instead of run again, and the fuzzer's batches get stable keys."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from mmchaos.checks.contract.fuzz import Rounds
from mmchaos.executors.codec import decode_job, encode_job
from mmchaos.executors.isolated import JournaledRunner
from mmchaos.executors.jobs import ErrorInfo, JobResult
from tests.fakes.journal import DictJournal


class ReversedRunner:
    """Answers every payload with its own value, last payload first (as a pool may finish them)."""

    replacements = 0
    workers = 2

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.load_seconds: list[float] = []

    def map(self, payloads: Sequence[Any], timeout: float) -> Iterator[tuple[int, JobResult]]:
        self.sent.extend(payloads)
        for i in reversed(range(len(payloads))):
            yield i, JobResult("ok", value={"echo": payloads[i], "vec": np.full((1, 3), i, dtype=np.float32)})

    def broadcast(self, payload: Any, timeout: float) -> list[JobResult]:
        """One answer per worker, each naming its worker (as two processes' outputs may differ)."""
        self.sent.append(payload)
        return [JobResult("ok", value={"echo": payload, "worker": w}) for w in range(self.workers)]


def test_a_job_result_survives_json_with_dtypes_shapes_and_errors() -> None:
    err = ErrorInfo("TargetCallError", "bad header", True, "image_undecodable", "Traceback ...")
    value = {
        "main": {
            "status": "ok",
            "output": np.array([[0.5, np.nan, np.inf, -1.0]], dtype=np.float32),
            "seconds": np.float64(0.25),
            "method": "embed_encoded_images",
        },
        "refs": {"expected": {"status": "raised", "error": err}},
        "texts": ["a", "b"],
        "ints": np.zeros((1, 0), dtype=np.uint8),
        "features": ("fmt:PNG:RGB", "size:3x3"),
        "strings": np.array(["x", "yz"]),
    }
    job = JobResult("ok", value=value, seconds=1.5, exitcode=None, detail="d", stderr="trace", busy_seconds=0.1)
    back = decode_job(json.loads(json.dumps(encode_job(job))))
    out = back.value["main"]["output"]
    assert out.dtype == np.float32 and out.shape == (1, 4)
    np.testing.assert_array_equal(out, value["main"]["output"])  # NaN and Inf too
    assert back.value["refs"]["expected"]["error"] == err
    assert back.value["ints"].dtype == np.uint8 and back.value["ints"].shape == (1, 0)
    assert back.value["texts"] == ["a", "b"] and back.value["features"] == ["fmt:PNG:RGB", "size:3x3"]
    assert back.value["strings"].tolist() == ["x", "yz"]
    assert (back.status, back.seconds, back.detail, back.stderr, back.busy_seconds) == ("ok", 1.5, "d", "trace", 0.1)
    crashed = JobResult("crashed", seconds=0.2, exitcode=-11, detail="SIGSEGV (exit -11)", stderr="Fatal Python error")
    assert decode_job(json.loads(json.dumps(encode_job(crashed)))) == crashed


def test_keyed_jobs_are_committed_as_they_arrive_and_read_back_on_resume(caplog: pytest.LogCaptureFixture) -> None:
    journal = DictJournal()
    first = ReversedRunner()
    runner = JournaledRunner(first, journal, "contract jobs")
    keys = ["case:a", "case:b", "case:c"]
    got = runner.map(["a", "b", "c"], 1.0, keys=keys)
    index, job = next(got)
    assert index == 2 and list(journal.units) == ["case:c"], "committed the moment it arrived, before the others"
    results = dict([(index, job), *got])
    assert sorted(journal.units) == sorted(keys)

    del journal.units["case:b"]  # the driver died before this one arrived
    again = ReversedRunner()
    with caplog.at_level(logging.INFO, logger="mmchaos.executors.isolated"):
        resumed = dict(JournaledRunner(again, journal, "contract jobs").map(["a", "b", "c"], 1.0, keys=keys))
    assert again.sent == ["b"], "only the missing job ran again"
    assert "resume: 2 of 3 contract jobs read back" in caplog.text
    for i in range(3):
        assert resumed[i].value["echo"] == results[i].value["echo"]
    np.testing.assert_array_equal(resumed[0].value["vec"], results[0].value["vec"])

    plain = ReversedRunner()
    assert len(list(JournaledRunner(plain, journal).map(["warmup"], 1.0))) == 1, "jobs without keys just run"
    with pytest.raises(ValueError, match="own key"):
        list(JournaledRunner(plain, journal).map(["a", "b"], 1.0, keys=["k", "k"]))


def test_a_keyed_broadcast_is_one_unit_read_back_whole_on_resume(caplog: pytest.LogCaptureFixture) -> None:
    """determinism's cross-process batches: every process's answer is committed together, and a
    resumed run compares the same two processes' answers instead of running the batch again."""
    journal = DictJournal()
    first = ReversedRunner()
    results = JournaledRunner(first, journal, "determinism jobs").broadcast("batch0", 1.0, key="cross_process/0")
    assert [r.value["worker"] for r in results] == [0, 1] and list(journal.units) == ["cross_process/0"]
    again = ReversedRunner()
    with caplog.at_level(logging.INFO, logger="mmchaos.executors.isolated"):
        resumed = JournaledRunner(again, journal, "determinism jobs")
        assert resumed.broadcast("batch0", 1.0, key="cross_process/0") == results
        assert [r.value["echo"] for r in resumed.broadcast("batch1", 1.0, key="cross_process/1")] == ["batch1"] * 2
    assert again.sent == ["batch1"], "only the batch that was not committed ran"
    assert "determinism jobs cross_process/0 read back" in caplog.text
    unkeyed = ReversedRunner()
    assert len(JournaledRunner(unkeyed, journal).broadcast("warm", 1.0)) == 2 and "warm" not in journal.units


def test_in_process_jobs_are_journaled_like_isolated_ones() -> None:
    """Before: contract and contract_fuzz with ``isolation: inprocess`` ran their jobs unjournaled."""
    from mmchaos.executors.isolated import open_isolated
    from mmchaos.executors.jobs import WorkerSpec

    journal = DictJournal()
    spec = WorkerSpec(uri="inprocess")
    with open_isolated(spec, _echo_job, workers=2, start_timeout=1.0, journal=journal, in_process=object(),
                       overlay={"context": {"tag": "x"}}) as runner:  # fmt: skip
        got = dict(runner.map(["a", "b"], 5.0, keys=["k:a", "k:b"]))
    assert sorted(journal.units) == ["k:a", "k:b"] and runner.workers == 1
    assert got[1].status == "ok" and got[1].value == ["b", "x"], "the overlay reached the job's spec"


def _echo_job(target: Any, spec: Any, payload: str) -> list[str]:
    return [payload, spec.context["tag"]]


def test_fuzz_batches_get_keys_by_batch_place_and_content() -> None:
    journal = DictJournal()
    rounds = Rounds(JournaledRunner(ReversedRunner(), journal))
    batch = [("image_bytes", b"\x89PNG"), ("text_bytes", b"hi")]
    list(rounds.map(batch, 1.0))
    list(rounds.map(batch[:1], 1.0))
    keys = sorted(journal.units)
    assert [k.split(".")[:2] for k in keys] == [["b0", "0"], ["b0", "1"], ["b1", "0"]]
    assert keys[0].split(".")[2] == keys[2].split(".")[2], "the same input has the same digest"
    replay = ReversedRunner()
    resumed = Rounds(JournaledRunner(replay, journal))
    list(resumed.map(batch, 1.0))
    list(resumed.map([("text_bytes", b"other")], 1.0))
    assert replay.sent == [("text_bytes", b"other")], "a batch that took another path runs what was not seen"


def test_a_run_on_ray_starts_no_local_worker_pool_for_contract_or_fuzzing() -> None:
    """Before: prepare() of contract and contract_fuzz prefetched the run's local pool (two processes
    loading the model) on a Ray run too, where their jobs go to the actors and the pool sat idle."""
    from mmchaos.checks.contract.contract import Contract
    from mmchaos.checks.contract.fuzz import ContractFuzz
    from mmchaos.data.shapes import make_shapes
    from mmchaos.executors import LazyExecutor
    from mmchaos.executors.resources import RunResources
    from mmchaos.runner import _prepare
    from tests.fakes.broken_targets import ContractSafeTarget

    never_opened = LazyExecutor("ray", lambda: None)
    resources = RunResources()
    try:
        checks: list[Any] = [("contract", Contract()), ("contract_fuzz", ContractFuzz())]
        _prepare(checks, ContractSafeTarget(), make_shapes(2), 0, resources, never_opened)
        assert resources.wanted == set()
        assert not never_opened.opened, "preparing does not start Ray either"
    finally:
        resources.close()
