"""The streaming robustness sweep: a seeded, label-stratified sample (never the first N), at most
one shard of images alive at a time, and work units committed to the run store so a resumed run
computes only the missing ones."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mmchaos.checks.base import CheckContext
from mmchaos.checks.robustness.robustness import Robustness, RobustnessParams
from mmchaos.data import load_dataset
from mmchaos.data.base import Dataset
from mmchaos.data.shapes import make_shapes
from mmchaos.errors import ConfigError
from mmchaos.executors import ExecutorSpec, LocalExecutor, StoreJournal, Worker, run_units
from mmchaos.findings import Finding
from mmchaos.store import RunStore
from tests.fakes import targets as fakes
from tests.fakes.sweep import LiveImages, counting, sorted_class_folder

SWEEP = {
    "perturbations": ["gaussian_noise", "defocus_blur", "keyboard_typo", "attribute_swap", "missing_modality"],
    "severities": [1, 3],
    "worst_cases": 4,
}


def _run(target: Any, data: Dataset, **params: Any) -> list[Finding]:
    ctx = CheckContext(target=target, dataset=data, seed=0, check_id="robustness")
    return list(Robustness(RobustnessParams(**params)).run(ctx))


class SeenColours(fakes.HashEmbedTarget):
    """The correct hash-embed target that also notes the colour of every image it is shown."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, ...]] = set()

    def embed_images(self, images: Any) -> np.ndarray:
        self.seen |= {tuple(int(v) for v in np.median(i.reshape(-1, 3), axis=0)) for i in images}
        return super().embed_images(images)


COLOURS = {"apple": (200, 30, 30), "grass": (30, 200, 30), "sky": (30, 30, 200)}


def test_a_sorted_folder_is_sampled_across_its_classes_not_the_first_n(tmp_path: Path) -> None:
    data = load_dataset(str(sorted_class_folder(tmp_path / "d", COLOURS, per_class=20)))
    assert {s.label for s in data.samples[:12]} == {"apple"}, "the first 12 of the folder are one class"
    picked = data.sample_indices(12, seed=0)
    labels = [data[i].label for i in picked]
    assert sorted(labels) == sorted(["apple"] * 4 + ["grass"] * 4 + ["sky"] * 4), "each class its share"
    assert picked == sorted(picked), "kept in dataset order"
    assert picked == data.sample_indices(12, seed=0) != data.sample_indices(12, seed=1), "seeded"
    target = SeenColours()
    _run(target, data, perturbations=["gaussian_noise"], severities=[1], samples=12)
    assert set(COLOURS.values()) <= target.seen, "the sweep scored every class"


def test_stratified_sampling_keeps_shares_and_draws_all_when_n_covers_the_set() -> None:
    data = make_shapes(96, seed=2)
    counts: dict[str, int] = {}
    for i in data.sample_indices(48, seed=5):
        counts[data[i].label or ""] = counts.get(data[i].label or "", 0) + 1
    full: dict[str, int] = {}
    for s in data:
        full[s.label or ""] = full.get(s.label or "", 0) + 1
    assert sum(counts.values()) == 48
    assert all(abs(counts.get(k, 0) - n / 2) < 1 for k, n in full.items()), "each label about half its count"
    assert data.sample_indices(500, seed=5) == list(range(96))
    assert data.sample(None, seed=1) is data


def test_the_sweep_holds_one_shard_of_images_at_a_time() -> None:
    live = LiveImages()
    data = counting(make_shapes(96, seed=3), live)
    findings = _run(fakes.HashEmbedTarget(), data, samples=96, shard_size=8, batch_size=8, **SWEEP)
    assert findings[-1].evidence["samples"] == 96
    assert live.now == 0
    # The old sweep decoded every sample before the first perturbation (96 alive at once).
    assert 0 < live.peak <= 8, f"{live.peak} decoded images were alive at once; a shard is 8"


def test_shards_do_not_change_what_the_sweep_measures_on_per_sample_tasks() -> None:
    data = make_shapes(48, seed=4)
    one = _run(fakes.HashEmbedTarget(), data, samples=48, shard_size=48, perturbations=["gaussian_noise"],
               severities=[1, 3])  # fmt: skip
    many = _run(fakes.HashEmbedTarget(), data, samples=48, shard_size=7, perturbations=["defocus_blur"],
                severities=[1, 3])  # fmt: skip
    clean = {f.metrics["clean"] for f in one + many if "clean" in f.metrics}
    assert len(clean) == 1, "the clean metric is one number, however the set is cut"


def _square(worker: Worker, shared: int, unit: int) -> dict[str, int]:
    worker.memo("calls", list).append(unit)
    return {"unit": unit, "value": unit * unit + shared}


def test_units_committed_to_the_store_are_read_back_not_recomputed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = RunStore(tmp_path / "runs.db")
    journal = StoreJournal(store, "run-1", "check")
    worker = Worker(fakes.HashEmbedTarget(), make_shapes(2))
    units = list(range(6))
    keys = [f"u{u}" for u in units]
    first = run_units(LocalExecutor(worker), _square, 1, units, keys=keys, encode=dict, decode=dict, journal=journal)
    got = [next(first) for _ in range(4)]  # the driver dies after four units
    first.close()
    assert worker.memo("calls", list) == [0, 1, 2, 3]
    assert store.unit_keys("run-1", "check") == {"u0", "u1", "u2", "u3"}
    again = Worker(fakes.HashEmbedTarget(), make_shapes(2))
    with caplog.at_level(logging.INFO, logger="mmchaos.executors.journal"):
        resumed = list(
            run_units(LocalExecutor(again), _square, 1, units, keys=keys, encode=dict, decode=dict, journal=journal)
        )
    assert again.memo("calls", list) == [4, 5], "only the missing units ran"
    assert resumed[:4] == got and [r["value"] for r in resumed] == [u * u + 1 for u in units]
    assert "4 of 6" in caplog.text
    assert json.loads(store.unit("run-1", "check", "u5")) == {"unit": 5, "value": 26}
    store.commit_check("run-1", "check", [], wall_seconds=0, model_seconds=0, model_calls=0)
    assert store.unit_keys("run-1", "check") == set(), "a committed check drops its units"
    store.close()


@pytest.mark.parametrize(
    ("spec", "code"),
    [
        ({"kind": "spark"}, "executor_unknown"),
        ({"kind": "ray", "workers": 0}, "executor_bad_option"),
        ({"kind": "local", "address": "127.0.0.1:6379"}, "executor_bad_option"),
        ({"kind": "local", "workers": 2}, "executor_bad_option"),
    ],
)
def test_bad_executor_options_are_config_errors(spec: dict[str, Any], code: str) -> None:
    with pytest.raises(ConfigError) as err:
        ExecutorSpec(**spec)
    assert err.value.code == code


def test_executor_ray_without_ray_installed_is_a_one_line_usage_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, run_cli: Any
) -> None:
    # Ray is installed here; a None entry in sys.modules makes `import ray` fail as if it were not.
    monkeypatch.setitem(__import__("sys").modules, "ray", None)
    code, _, err = run_cli("validate", "--executor", "ray", "--suite", "quick", "--out", str(tmp_path / "o"),
                           "--store", str(tmp_path / "runs.db"))  # fmt: skip
    assert code == 2
    assert "executor_ray_missing" in err and 'pip install "mmchaos[ray]"' in err
    assert "Traceback" not in err
    assert not (tmp_path / "runs.db").exists(), "refused before any run was recorded"
    code, _, err = run_cli("validate", "--ray-address", "127.0.0.1:6379", "--out", str(tmp_path / "o"))
    assert code == 2 and "executor_bad_option" in err


def test_retrieval_ranks_a_shard_against_the_whole_set_as_the_unsharded_task_does() -> None:
    from mmchaos import perturb
    from mmchaos.tasks.embedding import ImageToTextRetrieval, TextToImageRetrieval

    data = make_shapes(40, seed=6)
    target = fakes.HashEmbedTarget()
    noisy, _ = perturb.get("gaussian_noise")([s.load_image() for s in data], 5, rng=1)
    typos, _ = perturb.get("keyboard_typo")([s.caption or "" for s in data], 5, rng=1)
    for task, kw in [(ImageToTextRetrieval(batch_size=8), "images"), (TextToImageRetrieval(batch_size=8), "texts")]:
        inputs: Any = noisy if kw == "images" else typos
        whole = task.evaluate(target, data, **{kw: inputs})
        shards = [(a, min(a + 16, 40)) for a in range(0, 40, 16)]
        parts = [task.evaluate_shard(target, data, list(range(a, b)), **{kw: inputs[a:b]}) for a, b in shards]
        combined = task.combine(data, parts)
        assert np.array_equal(combined.per_sample, whole.per_sample), task.name
        assert combined.metric == pytest.approx(whole.metric) and whole.metric < 1.0
        assert combined.extra == pytest.approx(whole.extra)


def test_corpus_cer_of_shards_is_the_corpus_cer_of_the_set_not_a_mean_of_shards() -> None:
    from mmchaos.tasks.base import TaskResult
    from mmchaos.tasks.ocr import OCRTask, score_transcriptions
    from mmchaos.tasks.ocr_metrics import corpus_cer

    data = load_dataset("builtin:textlines?n=12")
    refs = [s.text or "" for s in data]
    preds = [r if i % 3 else r[: len(r) // 2] for i, r in enumerate(refs)]  # every third loses half
    parts: list[TaskResult] = [score_transcriptions(preds[a : a + 5], refs[a : a + 5]) for a in (0, 5, 10)]
    combined = OCRTask().combine(data, parts)
    assert combined.metric == corpus_cer(preds, refs) > 0
    assert combined.outputs == preds and len(combined.per_sample) == 12


def _worst_evidence(findings: list[Finding]) -> list[Any]:
    """Every worst case the sweep reported: per perturbation (params only) and the summary's."""
    per = [f.evidence["worst_samples"] for f in findings if "worst_samples" in f.evidence]
    summary = [f.evidence.get("worst_cases") for f in findings if "worst_cases" in f.evidence]
    return [json.loads(json.dumps(x, default=str)) for x in per + summary]


TRIM = {"perturbations": ["gaussian_noise", "keyboard_typo", "missing_modality"], "severities": [1, 3],
        "worst_cases": 3, "worst_per_perturbation": 2}  # fmt: skip


def test_the_driver_keeps_drawn_parameters_only_for_the_shards_largest_drops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A perturbation's shard results wait on the driver until all have arrived; their drawn parameters
    (a noise seed, a caption's typo edits) were 200-480 bytes a sample, ~9 MB for one text perturbation
    at 10,000 samples. Only the worst cases need them: each shard keeps those of its own largest
    drops, at most ``max(worst_cases, worst_per_perturbation)``."""
    from mmchaos.checks.robustness import robustness as module

    held: dict[str, list[int]] = {}
    real = module.Robustness._sweep

    def spy(self: Any, ctx: Any, sweep: Any, pert: Any, task: Any, clean: Any, arrived: list[Any]) -> Any:
        held[pert.name] = [sum(prm is not None for prm in r.params) for r in arrived]
        return real(self, ctx, sweep, pert, task, clean, arrived)

    monkeypatch.setattr(module.Robustness, "_sweep", spy)
    _run(fakes.HashEmbedTarget(), make_shapes(96, seed=5), samples=96, shard_size=16, **TRIM)
    assert set(held) == {"gaussian_noise", "keyboard_typo", "missing_modality"}
    for name, kept in held.items():
        assert len(kept) == 12 and max(kept) <= 3, f"{name}: {kept} parameters held per 16-sample shard"


def test_parameters_kept_per_shard_give_the_worst_cases_that_all_parameters_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The global worst cases are among each shard's own largest drops (larger drop first, then lower
    position, in both), so forgetting the others changes no reported case: the sweep with every
    parameter held reports the same worst cases, bit for bit."""
    from mmchaos.checks.robustness.sweep import ShardResult

    data = make_shapes(96, seed=5)
    trimmed = _worst_evidence(_run(fakes.HashEmbedTarget(), data, samples=96, shard_size=16, **TRIM))
    monkeypatch.setattr(ShardResult, "keep_params_of_largest_drops", lambda self, clean, keep_n: None)
    whole = _worst_evidence(_run(fakes.HashEmbedTarget(), data, samples=96, shard_size=16, **TRIM))
    assert trimmed == whole and any(trimmed), "the same worst cases, and there are some"


def test_a_shard_keeps_the_parameters_of_its_largest_drops_ties_by_position() -> None:
    from mmchaos.checks.robustness.sweep import ShardResult
    from mmchaos.tasks.base import TaskResult

    clean = np.array([1.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    scores = np.array([0.0, 1.0, 0.5, 0.0, 0.0, 1.0 + 1e-12])  # drops 1, 0, .5, 1, 0, ~0
    r = ShardResult(TaskResult(0.0, scores), [{"k": i} for i in range(6)])
    r.keep_params_of_largest_drops(clean, 2)
    assert r.params == [{"k": 0}, None, None, {"k": 3}, None, None], "the two drops of 1, by position"
    r = ShardResult(TaskResult(0.0, scores), [{"k": i} for i in range(6)])
    r.keep_params_of_largest_drops(clean, 0)
    assert r.params == [None] * 6
    r = ShardResult(TaskResult(0.0, clean.copy()), [{"k": i} for i in range(6)])
    r.keep_params_of_largest_drops(clean, 5)
    assert r.params == [None] * 6, "no sample dropped: none is a worst case"
