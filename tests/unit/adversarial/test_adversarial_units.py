"""Step 3's attack batches as work units: committed units are read back on resume, not recomputed,
and the torch work of an attack (PGD, DeepFool) counts as the target's model time.

The Ray side (the same findings on a local Ray with 2 workers) is in
tests/integration/executors/test_ray_attack_units.py.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from mmchaos.attacks.preprocess import ImagePath
from mmchaos.checks.adversarial.blackbox import BlackBox, BlackBoxParams
from mmchaos.checks.adversarial.whitebox import WhiteBox, WhiteBoxGate, WhiteBoxParams
from mmchaos.checks.base import CheckContext
from mmchaos.executors import StoreJournal
from mmchaos.runner import TimedTarget
from mmchaos.store import RunStore
from tests.fakes.adversarial import RecordingClock
from tests.fakes.colour import ColourTarget, colour_dataset

torch = pytest.importorskip("torch")

WHITEBOX = {"eps": [1.0, 2.0, 4.0], "steps": 3, "masking_queries": 30, "batch_size": 2}


class Died(BaseException):
    """The driver dying mid-check (not an Exception: nothing may catch it)."""


class CountingColour(ColourTarget):
    """The fragile colour classifier, counting the PGD steps run on its torch path (and dying at one)."""

    def __init__(self, die_at_step: int | None = None, record: list[tuple[float, float]] | None = None) -> None:
        super().__init__(gain=300.0)
        self.grad_steps = 0
        self.die_at_step = die_at_step
        self.record = record

    def image_torch_path(self) -> ImagePath:
        path = super().image_torch_path()
        inner = path.features

        def features(x: Any) -> Any:
            if x.requires_grad:
                self.grad_steps += 1
                if self.die_at_step is not None and self.grad_steps == self.die_at_step:
                    raise Died
            start = time.perf_counter()
            out = inner(x)
            if self.record is not None:
                self.record.append((start, time.perf_counter()))
            return out

        path.features = features
        return path


def _whitebox() -> WhiteBox:
    return WhiteBox(WhiteBoxParams.model_validate(WHITEBOX), WhiteBoxGate(eps=4.0))


def _dicts(findings: list[Any]) -> list[dict[str, Any]]:
    out = []
    for f in findings:
        d = f.to_dict()
        d["artifacts"] = [(a.name, a.data) for a in f.artifacts]
        out.append(d)
    return out


def test_a_resumed_whitebox_reads_its_committed_attack_batches_back(tmp_path: Path) -> None:
    data = colour_dataset(6)
    steps = WHITEBOX["steps"]
    assert isinstance(steps, int)
    fresh_target = CountingColour()
    fresh = _dicts(list(_whitebox().run(CheckContext(fresh_target, data, 0, "adversarial_whitebox"))))
    pgd_units = fresh_target.grad_steps // steps
    assert pgd_units == 9  # 3 eps x 3 batches of 2

    with RunStore(tmp_path / "runs.db") as store:
        journal = StoreJournal(store, "run-1", "adversarial_whitebox")
        dying = CountingColour(die_at_step=4 * steps + 1)  # dies in the fifth PGD batch
        with pytest.raises(Died):
            list(_whitebox().run(CheckContext(dying, data, 0, "adversarial_whitebox", journal=journal)))
        assert len(journal.keys()) == 4
        again = CountingColour()
        resumed = _dicts(list(_whitebox().run(CheckContext(again, data, 0, "adversarial_whitebox", journal=journal))))
    assert again.grad_steps == (pgd_units - 4) * steps, "only the missing attack batches ran"
    assert resumed == fresh


def test_a_resumed_blackbox_spends_no_query_twice(tmp_path: Path) -> None:
    data = colour_dataset(6)
    check = BlackBox(BlackBoxParams(eps=[2.0, 4.0], queries_per_sample=40, samples=6, batch_size=2))
    first_target = ColourTarget(gain=300.0)
    with RunStore(tmp_path / "runs.db") as store:
        journal = StoreJournal(store, "run-1", "adversarial_blackbox")
        (first,) = check.run(CheckContext(first_target, data, 0, "adversarial_blackbox", journal=journal))
        again = ColourTarget(gain=300.0)
        (resumed,) = check.run(CheckContext(again, data, 0, "adversarial_blackbox", journal=journal))
    assert again.images_seen == 6, "only the clean images were judged again; no attack query was resent"
    assert first.metrics["queries"] == first_target.images_seen + 3
    assert _dicts([resumed]) == _dicts([first])


def test_pgd_steps_count_as_model_time() -> None:
    """Before: PGD ran on the torch path outside any model call, so the report's model time left it out."""
    record: list[tuple[float, float]] = []
    clock = RecordingClock()
    target = TimedTarget(CountingColour(record=record), clock)
    params = {**WHITEBOX, "masking_check": False}
    check = WhiteBox(WhiteBoxParams.model_validate(params), WhiteBoxGate(eps=4.0))
    list(check.run(CheckContext(target, colour_dataset(6), 0, "adversarial_whitebox")))
    assert len(record) >= 27  # 9 batches x 3 steps
    assert clock.uncounted(record) == []
