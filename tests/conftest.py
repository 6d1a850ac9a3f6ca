"""Shared fixtures and the test tiers.

Tiers: ``pytest -m "not integration"`` is the fast tier (under a minute on 2 cores); the
``integration`` marker holds what spawns processes, starts servers, loads real models or runs
external tools. A test that requests :func:`model_dir` (directly or through another fixture) loads
a real model, so it is marked ``integration`` here, without a marker of its own.
Plain helpers that tests call directly (``aio``, ``run_check``) live in :mod:`tests.support`.
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Before anything imports torch: spinning OpenMP workers make forward passes 10-20x slower when
# a test runs a server thread and a client in one process on 2 cores (as the CLI does too).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

REAL_MODEL_FIXTURES = frozenset({"model_dir"})
"""Fixtures that load a real model: every test that uses one belongs to the integration tier."""


def marked_integration_as_a_whole(path: Path) -> bool:
    """True when the module assigns ``pytestmark = pytest.mark.integration`` at top level (read, not imported)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return "mark.integration" in ast.unparse(node.value)
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """In the fast tier, do not even import a module that is integration as a whole: its imports
    (torch, transformers, ONNX Runtime, FastAPI) cost a third of the tier's time, for no test."""
    if str(config.getoption("markexpr", "") or "").strip() != "not integration":
        return None
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    return True if marked_integration_as_a_whole(collection_path) else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The built-in tiny-clip directory (exported in MMCHAOS_TEST_MODEL_DIR for worker processes),
    with torch on one thread for the module: 2 shared cores, and thread-count-independent numbers."""
    pytest.importorskip("transformers")
    import torch

    from tests import broken_targets as bt

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield bt.ensure_tiny_clip(tmp_path_factory.getbasetemp())
    torch.set_num_threads(threads)


@pytest.fixture()
def subprocess_env() -> dict[str, str]:
    """Environment for a child mmchaos process that can import ``tests.fakes``."""
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
