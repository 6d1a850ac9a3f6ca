"""`--executor ray` for step 3: the attack batches of the white-box, black-box and transfer checks
run on a local Ray with 2 workers and give the findings of a local run of the same seed, on a
fragile target (the checks fail) and a robust one (they pass); the text and typographic attacks'
batches too. Skipped where Ray is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from mmchaos.executors import ExecutorSpec
from mmchaos.runner import RunConfig, run_suite
from mmchaos.store import RunStore
from mmchaos.suites import SuiteSpec
from tests.fakes.colour import colour_dataset

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

pytestmark = pytest.mark.integration

SUITE = {
    "name": "attacks",
    "seed": 5,
    "checks": [
        {"check": "adversarial_whitebox", "gate": {"eps": 4},
         "params": {"eps": [1, 2, 4], "steps": 3, "masking_queries": 30, "samples": 9, "batch_size": 3}},
        {"check": "adversarial_blackbox",
         "params": {"eps": [4], "queries_per_sample": 60, "max_queries": 2000, "samples": 9, "batch_size": 3}},
        {"check": "adversarial_transfer", "gate": {"eps": 8},
         "params": {"surrogate": "py:tests.fakes.colour:fragile", "eps": [8], "steps": 3, "samples": 9,
                    "batch_size": 3}},
        {"check": "text_attack", "params": {"samples": 9, "batch_size": 4, "query_budget": 20}},
        {"check": "typographic_attack", "params": {"samples": 9, "batch_size": 4}},
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One local Ray of 2 CPUs for the module (starting one takes seconds)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def colour_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The colour squares as a folder of class subfolders (a dataset every Ray actor can load)."""
    root = tmp_path_factory.mktemp("colours")
    for sample in colour_dataset(12):
        folder = root / (sample.label or "")
        folder.mkdir(exist_ok=True)
        Image.fromarray(sample.load_image()).save(folder / f"{sample.id}.png")
    return root


def _run(tmp_path: Path, name: str, target: str, data: Path, executor: ExecutorSpec | None) -> list[dict[str, Any]]:
    with RunStore(tmp_path / f"{name}.db") as store:
        config = RunConfig(target=target, suite=SuiteSpec.model_validate(SUITE), data=str(data))
        result = run_suite(config, store, executor=executor)
        artifacts = {a.name: a.data for a in store.artifacts(result.run_id)}
        out = []
        for f in store.findings(result.run_id):
            d = f.to_dict()
            d["artifact_bytes"] = [artifacts[a] for a in sorted(artifacts) if a.startswith(f.check)]
            out.append(d)
        return out


@pytest.mark.parametrize(("target", "verdict"), [("fragile", "fail"), ("robust", "pass")])
def test_attack_batches_on_ray_give_the_local_findings(
    tmp_path: Path, local_ray: None, colour_folder: Path, target: str, verdict: str
) -> None:
    uri = f"py:tests.fakes.colour:{target}"
    local = _run(tmp_path, "local", uri, colour_folder, None)
    on_ray = _run(tmp_path, "ray", uri, colour_folder, ExecutorSpec("ray", workers=2))
    image = ("adversarial_whitebox", "adversarial_blackbox", "adversarial_transfer")
    by_check = {f["check"]: f for f in local if f["check"] in image and "masking" not in f["title"]}
    assert set(by_check) == set(image)
    assert {f["check"] for f in local} >= {"text_attack", "typographic_attack"}
    assert all(f["verdict"] != "error" for f in local), [f["title"] for f in local]
    assert all(f["verdict"] == verdict for f in by_check.values()), [(f["check"], f["title"]) for f in local]
    if verdict == "fail":
        assert any(f["artifact_bytes"] for f in local), "flipped samples are saved as images"
        assert np.isfinite(by_check["adversarial_whitebox"]["metrics"]["median_flip_eps"])
    assert on_ray == local
