"""The local executor runs a prefetching unit function's prepared work one unit ahead, on a helper
thread, while the unit before it runs: results, their order and where an error is raised stay those
of calling the function unit by unit, and the robustness sweep's findings do not change."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from mmchaos.checks.base import CheckContext
from mmchaos.checks.robustness.robustness import Robustness, RobustnessParams
from mmchaos.data.shapes import make_shapes
from mmchaos.executors import Executor, LocalExecutor, PrefetchingUnitFn, UnitFn, Worker
from tests.fakes import targets as fakes

WAIT_S = 20.0
"""How long a unit waits for the next one's prepared work: it starts at once when prefetched, and
never (the wait times out) when not, so the verdict does not hang on the machine's speed."""


class Probe(PrefetchingUnitFn[None, int, tuple[int, bool, str]]):
    """Unit ``k`` waits for unit ``k + 1``'s prepared work to have started; ``fail`` names units
    whose work raises, ``refuse`` those whose prepare raises on the caller's thread."""

    def __init__(self, n: int, fail: frozenset[int] = frozenset(), refuse: frozenset[int] = frozenset()) -> None:
        self.started = [threading.Event() for _ in range(n + 1)]
        self.fail, self.refuse = fail, refuse

    def prepare(self, worker: Worker, shared: None, unit: int) -> Callable[[], Any] | None:
        if unit in self.refuse:
            raise KeyError(f"prepare {unit}")

        def work() -> str:
            self.started[unit].set()
            if unit in self.fail:
                raise ValueError(f"work {unit}")
            return threading.current_thread().name

        return work

    def run(self, worker: Worker, shared: None, unit: int, ready: Any) -> tuple[int, bool, str]:
        last = unit == len(self.started) - 2
        ahead = last or self.started[unit + 1].wait(WAIT_S)
        return unit, ahead, str(ready)


class OneByOne(Executor):
    """Calls the unit function unit by unit, as a remote worker does: the order of the work without
    prefetching, for comparison."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def map(self, fn: UnitFn[Any, Any, Any], shared: Any, units: Sequence[Any], *, clock: Any = None) -> Iterator[Any]:
        for unit in units:
            yield fn(self.worker, shared, unit)


def _worker() -> Worker:
    return Worker(fakes.HashEmbedTarget(), make_shapes(8, seed=0))


def test_the_next_units_work_runs_on_a_helper_thread_while_this_unit_runs() -> None:
    probe = Probe(5)
    results = list(LocalExecutor(_worker()).map(probe, None, range(5)))
    assert [r[0] for r in results] == [0, 1, 2, 3, 4], "results in the units' order"
    assert all(ahead for _, ahead, _ in results), "each unit found the next one's work started"
    assert all(name.startswith("mmchaos-prefetch") for _, _, name in results), "the work ran on the helper"


def test_called_unit_by_unit_the_same_function_prepares_nothing_ahead() -> None:
    """The probe can fail: called as a whole (a remote worker's way), unit k never sees k + 1 start."""
    probe = Probe(2)
    probe.started[1].set()  # unit 0 would wait WAIT_S for unit 1 otherwise: say it started
    results = list(OneByOne(_worker()).map(probe, None, range(2)))
    assert [name for _, _, name in results] == ["MainThread", "MainThread"], "no helper thread"


@pytest.mark.parametrize("probe", [Probe(4, fail=frozenset({2})), Probe(4, refuse=frozenset({2}))])
def test_an_error_of_prepared_work_is_raised_at_its_units_place(probe: Probe) -> None:
    results = LocalExecutor(_worker()).map(probe, None, range(4))
    probe.started[2].set()  # unit 1 waits for unit 2's work, which a refused prepare never starts
    assert [next(results)[0], next(results)[0]] == [0, 1], "the units before it are answered"
    with pytest.raises((ValueError, KeyError)):
        next(results)


def test_closing_the_results_early_leaves_no_helper_thread_running() -> None:
    results = LocalExecutor(_worker()).map(Probe(6), None, range(6))
    assert next(results)[0] == 0
    results.close()  # type: ignore[attr-defined]
    assert not [t for t in threading.enumerate() if t.name.startswith("mmchaos-prefetch")]


def test_the_sweep_finds_the_same_with_and_without_the_perturbations_run_ahead() -> None:
    data = make_shapes(24, seed=5)
    params = RobustnessParams(
        samples=24, shard_size=8, batch_size=8, severities=[1, 3], worst_cases=3,
        perturbations=["gaussian_noise", "defocus_blur", "jpeg_compression", "keyboard_typo", "saliency_occlusion"],
    )  # fmt: skip

    def sweep(executor: Callable[[Worker], Executor]) -> list[tuple[str, dict[str, float], Any]]:
        target = fakes.HashEmbedTarget()
        ctx = CheckContext(target=target, dataset=data, seed=0, check_id="robustness",
                           executor=executor(Worker(target, data)))  # fmt: skip
        found = list(Robustness(params).run(ctx))
        return [(f.title, f.metrics, f.evidence.get("worst_samples")) for f in found]

    ahead, one_by_one = sweep(LocalExecutor), sweep(OneByOne)
    assert len(ahead) >= 5, "every perturbation measured"
    assert ahead == one_by_one
