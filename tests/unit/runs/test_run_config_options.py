"""Stored runs keep resuming across the change to per-scheme target options: a record written with
the old one-bag ``options`` migrates (the values left at their old defaults were never given), and
one whose options its scheme no longer takes is refused with a one-line message, never a TypeError."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmchaos.errors import StoreError
from mmchaos.runner import RunConfig, run_suite
from mmchaos.store import RunRecord, RunStore
from mmchaos.suites import SuiteSpec
from mmchaos.targets import TargetOptions

SUITE = SuiteSpec.model_validate(
    {
        "name": "tiny",
        "seed": 3,
        "checks": [{"check": "batch_invariance", "params": {"samples": 4, "batch_sizes": [1, 3]}}],
    }
)
OLD_BAG = {
    "trust_remote_code": False,
    "use_safetensors": True,
    "device": "cpu",
    "model": None,
    "allow_remote": False,
    "allow_missing_weights": False,
    "threads": None,
}
"""``asdict(TargetOptions())`` as runs stored it before per-scheme options."""


def _old_record(target: str, options: dict[str, object]) -> dict[str, object]:
    return {
        "target": target,
        "suite": SUITE.model_dump(),
        "data": "builtin:shapes?n=6",
        "seed": None,
        "options": options,
    }


def test_an_old_record_migrates_to_the_options_it_was_given() -> None:
    config = RunConfig.from_dict(_old_record("onnx:/models/x", {**OLD_BAG, "threads": 2}))
    assert config.options == TargetOptions(threads=2)
    assert RunConfig.from_dict(_old_record("py:tests.fakes.targets:hash_embed", OLD_BAG)).options == TargetOptions()
    retired = RunConfig.from_dict(_old_record("onnx:/x", {**OLD_BAG, "retired_option": 1}))
    assert retired.options == {"retired_option": 1}  # kept, so the resume can name it when it refuses


def test_a_new_record_round_trips_its_given_options() -> None:
    config = RunConfig("openai:http://127.0.0.1:1/v1", SUITE, options=TargetOptions(timeout=2.5, model="m"))
    stored = config.to_dict()
    assert stored["target_options"] == {"timeout": 2.5, "model": "m"} and "options" not in stored
    assert RunConfig.from_dict(stored).options == config.options


def _store_old_run(store: RunStore, run_id: str, options: dict[str, object]) -> None:
    config = _old_record("py:tests.fakes.targets:hash_embed", options)
    store.create_run(
        RunRecord(run_id, 1.0, None, "running", "py:tests.fakes.targets:hash_embed", "tiny", config),
        ["batch_invariance"],
    )


def test_a_run_stored_with_the_old_options_bag_resumes(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.db") as store:
        _store_old_run(store, "20250101-000000-aaaaaa", OLD_BAG)
        result = run_suite(None, store, resume="20250101-000000-aaaaaa")
        assert {f.check for f in result.findings} == {"batch_invariance"}
        assert store.get_run(result.run_id).status == "complete"


def test_a_run_stored_with_options_its_scheme_does_not_take_is_refused_in_one_line(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.db") as store:
        _store_old_run(store, "20250101-000000-bbbbbb", {**OLD_BAG, "threads": 2})
        with pytest.raises(StoreError) as info:
            run_suite(None, store, resume="20250101-000000-bbbbbb")
    message = str(info.value)
    assert info.value.code == "store_options_outdated" and "\n" not in message
    assert "20250101-000000-bbbbbb" in message and "'threads'" in message and "start a new run" in message
