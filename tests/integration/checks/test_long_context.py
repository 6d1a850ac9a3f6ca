"""long_context_recall over openai: (a fake vLLM on loopback) and on the real tiny-vlm in-process
(its position ids read from its rotary embedding, and made to restart by a hook)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mmchaos.checks.engine.long_context import LongContextRecall
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Verdict
from mmchaos.targets import load_target
from tests.fakes.long_context import PositionRestartTarget, RecallTarget, restart_positions
from tests.fakes.target_chat_server import target_chat_server
from tests.support import run_check_class

DATA = make_shapes(4)


@pytest.mark.check_contract("long_context_recall", "clean")
def test_long_context_recall_reads_max_model_len_over_openai() -> None:
    with target_chat_server(RecallTarget(), max_model_len=1024) as url:
        target = load_target(f"openai:{url}")
        try:
            [finding] = run_check_class(LongContextRecall, target, {}, data=DATA)
        finally:
            target.close()
    assert finding.verdict == Verdict.PASS, finding.title
    assert finding.metrics["context_tokens"] == 1024


@pytest.mark.check_contract("long_context_recall", "broken")
def test_long_context_recall_fails_restarted_positions_over_openai() -> None:
    with target_chat_server(PositionRestartTarget(window=400), max_model_len=1024) as url:
        target = load_target(f"openai:{url}")
        try:
            [finding] = run_check_class(LongContextRecall, target, {}, data=DATA)
        finally:
            target.close()
    assert finding.verdict == Verdict.FAIL and finding.evidence["diagnosis"] == "positions_not_read"


def test_long_context_recall_skips_an_endpoint_without_max_model_len() -> None:
    with target_chat_server(RecallTarget(), max_model_len=None) as url:
        target = load_target(f"openai:{url}")
        try:
            [finding] = run_check_class(LongContextRecall, target, {}, data=DATA)
        finally:
            target.close()
    assert finding.verdict == Verdict.SKIPPED and "max_model_len" in finding.title


@pytest.fixture(scope="module")
def vlm() -> Iterator[Any]:
    pytest.importorskip("transformers")
    target = load_target("builtin:tiny-vlm")
    yield target
    target.close()


SHORT = {"trials": 1, "lengths": [0.3, 0.9], "max_new_tokens": 6}


@pytest.mark.check_contract("long_context_recall", "clean")
def test_long_context_recall_on_tiny_vlm_reads_its_positions_and_cannot_judge_its_recall(vlm: Any) -> None:
    """The built-in tiny-vlm answers questions about shapes, not about text it was told: it states
    its limit (256 positions) and the check runs to it, but a model that recalls nothing gets a
    warning, never a pass. Its rotary embedding gets position ids 0..n-1: that part passes."""
    recall, positions = run_check_class(LongContextRecall, vlm, SHORT, data=DATA)
    assert recall.metrics["context_tokens"] == 256
    assert recall.verdict == Verdict.WARN, recall.title
    assert positions.evidence["part"] == "positions" and positions.verdict == Verdict.PASS, positions.title
    assert positions.metrics["position_probe_tokens"] > 0.8 * 256


@pytest.mark.check_contract("long_context_recall", "broken")
def test_long_context_recall_fails_a_real_vlm_whose_position_ids_restart(vlm: Any) -> None:
    handles = restart_positions(vlm.torch_module(), window=100)
    try:
        _, positions = run_check_class(LongContextRecall, vlm, SHORT, data=DATA)
    finally:
        for h in handles:
            h.remove()
    assert positions.verdict == Verdict.FAIL, positions.title
    assert "position ids restart at 0 at token 100" in positions.title
