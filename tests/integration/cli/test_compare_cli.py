"""``mmchaos compare`` on stored runs of the real builtin:tiny-clip and of a degraded copy of it.

The degraded copy is tiny-clip behind a wrapper that adds seeded noise to its image embeddings
(:func:`tests.fakes.degraded.tiny_clip_noisy`), as a lossy quantisation would. The runs are
made once for the module, in-process, with a small robustness sweep (24 samples, three
perturbations, severities 1, 3, 5).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

NOISY = "py:tests.fakes.degraded:tiny_clip_noisy"
SUITE = """
name: compare-tiny-clip
seed: 0
checks:
  - check: robustness
    params:
      samples: 24
      severities: [1, 3, 5]
      perturbations: [gaussian_noise, defocus_blur, jpeg_compression]
      worst_cases: 0
"""


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The store, the suite file and the ids of: tiny-clip, tiny-clip again, the noisy copy."""
    pytest.importorskip("transformers")
    from mmchaos.runner import RunConfig, run_suite
    from mmchaos.store import RunStore
    from mmchaos.suites import load_suite

    root = tmp_path_factory.mktemp("compare-tiny-clip")
    suite_file = root / "suite.yaml"
    suite_file.write_text(SUITE)
    suite = load_suite(str(suite_file))
    ids = {}
    with RunStore(root / "runs.db") as store:
        for name, target in (("clip", "builtin:tiny-clip"), ("twin", "builtin:tiny-clip"), ("noisy", NOISY)):
            ids[name] = run_suite(RunConfig(target=target, suite=suite), store).run_id
    return {"store": root / "runs.db", "suite": suite_file, "ids": ids}


def test_a_degraded_copy_of_tiny_clip_exits_1_and_names_what_regressed(
    stored: dict[str, Any], subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    ids = stored["ids"]
    proc = subprocess.run(
        [sys.executable, "-m", "mmchaos", "compare", ids["clip"], ids["noisy"], "--store", str(stored["store"]),
         "--out", str(tmp_path / "cmp")],
        env=subprocess_env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    regressed = doc["summary"]["regressed"]
    perturbed = set(regressed) - {"clean"}
    assert perturbed and perturbed <= {"gaussian_noise", "defocus_blur", "jpeg_compression"}, regressed
    text = " ".join(proc.stdout.split())
    assert f"REGRESSED {', '.join(regressed)}" in text
    for name in perturbed:
        assert f"REGRESSED {name} severity" in text
    assert doc["a"]["target"] == "builtin:tiny-clip" and doc["b"]["target"] == NOISY
    assert (tmp_path / "cmp" / "compare.html").read_text().count("<polyline") == 2 * 3  # A and B per perturbation


def test_two_runs_of_tiny_clip_exit_0(stored: dict[str, Any], run_cli: Any, tmp_path: Path) -> None:
    ids = stored["ids"]
    code, out, err = run_cli("compare", ids["clip"], ids["twin"], "--store", str(stored["store"]),
                             "--out", str(tmp_path / "cmp"))  # fmt: skip
    assert code == 0 and "NO REGRESSION" in out, out + err
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert doc["summary"]["compared_points"] == 3 * 3 + 1 and not doc["not_compared"]


def test_validate_baseline_fails_the_noisy_copy_against_the_stored_tiny_clip_run(
    stored: dict[str, Any], run_cli: Any, tmp_path: Path
) -> None:
    code, out, err = run_cli(
        "validate", "--target", NOISY, "--suite", str(stored["suite"]), "--store", str(stored["store"]),
        "--out", str(tmp_path / "out"), "--baseline", stored["ids"]["clip"],
    )  # fmt: skip
    assert code == 1, out + err
    doc = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert doc["summary"]["regressed"] and doc["a"]["run_id"] == stored["ids"]["clip"]
