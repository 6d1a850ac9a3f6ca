"""``TargetOptions.threads``: torch's intra-op threads for the process that loads a target.

The built-in tiny models default to one thread (their operations are too small to split, and a
thread waiting for a busy core stalls each of them); ``--threads`` overrides it; ``hf:`` models keep
torch's default unless told. Speed itself is measured in ``benchmarks/validate_overhead.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mmchaos.targets.threads import apply_threads


@pytest.fixture()
def torch_threads() -> Iterator[Any]:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    yield torch
    torch.set_num_threads(before)


@pytest.mark.integration  # imports torch: kept out of the fast tier
def test_no_threads_and_no_default_leave_torch_alone(torch_threads: Any) -> None:
    torch = torch_threads
    torch.set_num_threads(2)
    assert apply_threads(None) is None
    assert torch.get_num_threads() == 2
    assert apply_threads(None, 1) == 1 and torch.get_num_threads() == 1
    assert apply_threads(3, 1) == 3 and torch.get_num_threads() == 3


@pytest.mark.integration
def test_the_builtin_tiny_clip_runs_on_one_thread_unless_told_otherwise(torch_threads: Any) -> None:
    pytest.importorskip("transformers")
    from mmchaos.targets import TargetOptions, load_target

    torch = torch_threads
    torch.set_num_threads(2)
    clip = load_target("builtin:tiny-clip")
    assert torch.get_num_threads() == 1
    assert "threads" not in clip.load_options  # not given: workers and resumed runs reload with the same default
    clip.close()
    clip = load_target("builtin:tiny-clip", TargetOptions(threads=2))
    assert torch.get_num_threads() == 2
    assert clip.load_options["threads"] == 2
    clip.close()
