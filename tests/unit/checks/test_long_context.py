"""long_context_recall on deterministic readers: left truncation and restarted positions fail it."""

from __future__ import annotations

import pytest

from mmchaos.checks.engine.long_context import LongContextRecall
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Verdict
from tests.fakes.long_context import LeftTruncatingTarget, PositionRestartTarget, RecallTarget
from tests.support import run_check_class

DATA = make_shapes(4)


@pytest.mark.check_contract("long_context_recall", "clean")
def test_long_context_recall_passes_a_target_that_reads_the_whole_prompt() -> None:
    [finding] = run_check_class(LongContextRecall, RecallTarget(), {}, data=DATA)
    assert finding.verdict == Verdict.PASS, finding.title
    acc = finding.evidence["accuracy"]
    assert len(acc) == 4 and all(set(row) == {"start", "middle", "end"} for row in acc.values())
    assert max(finding.evidence["prompt_tokens"].values()) > 0.9 * 1024  # up to the limit


@pytest.mark.check_contract("long_context_recall", "broken")
def test_long_context_recall_fails_left_truncation_and_names_it() -> None:
    [finding] = run_check_class(LongContextRecall, LeftTruncatingTarget(keep=400), {}, data=DATA)
    assert finding.verdict == Verdict.FAIL, finding.title
    assert finding.evidence["diagnosis"] == "left_truncation" and finding.evidence["kept_tokens"] == 400
    assert "the fact at the start" in finding.title and "truncated on the left" in finding.title
    by_len = finding.evidence["accuracy"]
    longest = by_len[max(by_len, key=lambda k: int(k.split()[0]))]
    assert longest["start"] == 0.0 and longest["end"] == 1.0  # the end survives, the start does not


@pytest.mark.check_contract("long_context_recall", "broken")
def test_long_context_recall_fails_positions_restarted_past_a_window() -> None:
    [finding] = run_check_class(LongContextRecall, PositionRestartTarget(window=400), {}, data=DATA)
    assert finding.verdict == Verdict.FAIL, finding.title
    assert finding.evidence["diagnosis"] == "positions_not_read"
    assert "position ids restarted" in finding.title and "353-token" in finding.title


def test_long_context_recall_skips_a_target_that_states_no_limit() -> None:
    target = RecallTarget(states_limit=False)
    [finding] = run_check_class(LongContextRecall, target, {}, data=DATA)
    assert finding.verdict == Verdict.SKIPPED and "context_tokens parameter" in finding.title
    [finding] = run_check_class(LongContextRecall, target, {"context_tokens": 512}, data=DATA)
    assert finding.verdict == Verdict.PASS, finding.title


def test_long_context_recall_cannot_pass_a_target_that_never_recalls() -> None:
    class Forgetful(RecallTarget):
        def seen(self, tokens: list[str]) -> list[str]:
            return []

    [finding] = run_check_class(LongContextRecall, Forgetful(), {"lengths": [0.2, 0.9]}, data=DATA)
    assert finding.verdict == Verdict.WARN and "cannot be judged" in finding.title


def test_long_context_recall_fails_a_refusal_well_within_the_stated_limit() -> None:
    """A server whose own limit (600) is below the one it states (1024): long prompts are refused."""
    [finding] = run_check_class(LongContextRecall, RecallTarget(600), {"context_tokens": 1024}, data=DATA)
    assert finding.verdict == Verdict.FAIL and "refused" in finding.title, finding.title
    assert "context_length_exceeded" in finding.title


def test_long_context_recall_reads_the_limit_through_the_runners_timing_wrapper() -> None:
    from tests.support import run_check

    [finding] = run_check(LongContextRecall(), PositionRestartTarget(window=400), DATA)
    assert finding.verdict == Verdict.FAIL and finding.metrics["context_tokens"] == 1024
