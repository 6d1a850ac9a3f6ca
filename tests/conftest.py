"""Shared fixtures and the test tiers.

Tiers are folders: ``tests/unit`` is the fast tier (``pytest tests/unit``), ``tests/integration``
holds what spawns processes, starts servers, loads real models or runs external tools. Every test
under ``tests/integration`` is marked ``integration`` here, so ``-m "not integration"`` still
selects the fast tier, and a test under ``tests/unit`` that is marked ``integration`` or requests
:func:`model_dir` (a real model) is a collection error: it belongs in the other folder.
Fakes live in :mod:`tests.fakes`, helpers that tests call directly in :mod:`tests.support`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Before anything imports torch: spinning OpenMP workers make forward passes 10-20x slower when
# a test runs a server thread and a client in one process on 2 cores (as the CLI does too).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytest_plugins = ["tests.support.cli"]  # suite_file: both halves of test_cli.py use it

REAL_MODEL_FIXTURES = frozenset({"model_dir", "tiny_vlm_dirs"})
"""Fixtures that load a real model: a test that uses one belongs in tests/integration."""


UNIT = ROOT / "tests" / "unit"
INTEGRATION = ROOT / "tests" / "integration"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m "not integration"``, do not even import the integration folder: its imports (torch,
    transformers, ONNX Runtime, FastAPI) would cost a third of the fast tier's time, for no test."""
    if str(config.getoption("markexpr", "") or "").strip() != "not integration":
        return None
    return True if collection_path == INTEGRATION or INTEGRATION in collection_path.parents else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced = []
    for item in items:
        path = Path(str(item.path))
        if INTEGRATION in path.parents:
            item.add_marker(pytest.mark.integration)
        elif UNIT in path.parents and (
            item.get_closest_marker("integration") or REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ()))
        ):
            misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError(
            "integration tests under tests/unit (move them to tests/integration): " + ", ".join(misplaced[:5])
        )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The built-in tiny-clip directory (exported in MMCHAOS_TEST_MODEL_DIR for worker processes),
    with torch on one thread for the module: 2 shared cores, and thread-count-independent numbers."""
    pytest.importorskip("transformers")
    import torch

    from tests.fakes import broken_targets as bt

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield bt.ensure_tiny_clip(tmp_path_factory.getbasetemp())
    torch.set_num_threads(threads)


@pytest.fixture()
def subprocess_env() -> dict[str, str]:
    """Environment for a child mmchaos process that can import ``tests.fakes.targets``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


@pytest.fixture()
def run_cli(capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    from mmchaos.cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            main(list(argv))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture(scope="session")
def tiny_vlm_dirs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``family -> directory`` of a tiny random VLM of that family (``mmchaos.targets.tiny_vlms``),
    built on first use and shared by every test of the session: each family is built once."""
    pytest.importorskip("transformers")
    from mmchaos.targets.tiny_vlms import build_tiny_vlm

    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = build_tiny_vlm(family, tmp_path_factory.mktemp(f"tiny-vlm-{family}"))
        return built[family]

    return get
