"""generation_semantics on word-generating fakes: each broken parameter fails its part, the honest
target passes every part."""

from __future__ import annotations

import pytest

from mmchaos.checks.integration.generation_semantics import GenerationSemantics, completion_tokens, stop_probe
from mmchaos.data import load_dataset
from mmchaos.findings import Finding, Verdict
from mmchaos.targets.base import Target
from mmchaos.targets.generation import Completion, GenerationResult
from tests.fakes import semantics_targets as st
from tests.fakes.generative import WordsTarget
from tests.support import run_check

DATA = load_dataset("builtin:vqa?n=6&seed=0")


def _parts(target: Target) -> dict[str, Finding]:
    return {f.evidence["part"]: f for f in run_check(GenerationSemantics(), target, DATA)}


def _verdicts(target: Target) -> dict[str, Verdict]:
    return {part: f.verdict for part, f in _parts(target).items()}


@pytest.mark.check_contract("generation_semantics", "clean")
def test_an_honest_target_passes_every_part() -> None:
    parts = _parts(WordsTarget())
    assert {p: f.verdict for p, f in parts.items()} == dict.fromkeys(
        ["max_tokens", "stop", "n", "finish"], Verdict.PASS
    )
    assert parts["max_tokens"].metrics["cases"] == 9 and parts["stop"].metrics["cases"] == 3


@pytest.mark.check_contract("generation_semantics", "broken")
def test_a_target_that_ignores_max_tokens_fails() -> None:
    finding = _parts(st.IgnoresMaxTokensTarget())["max_tokens"]
    assert finding.verdict is Verdict.FAIL
    assert "12 tokens for max_tokens 1: more tokens than max_tokens" in finding.title


def test_a_cut_answer_that_says_stop_fails() -> None:
    finding = _parts(st.CutSaysStopTarget())["max_tokens"]
    assert finding.verdict is Verdict.FAIL and "finish_reason is not 'length'" in finding.title


def test_a_stop_string_left_in_the_text_fails() -> None:
    verdicts = _verdicts(st.StopLeftInTarget())
    assert verdicts["stop"] is Verdict.FAIL and verdicts["max_tokens"] is Verdict.PASS


def test_n_answered_with_one_choice_fails() -> None:
    assert _verdicts(st.OneChoiceTarget())["n"] is Verdict.FAIL


def test_answers_that_all_run_to_the_limit_fail_the_finish_part() -> None:
    finding = _parts(st.RunOnTarget())["finish"]
    assert finding.verdict is Verdict.FAIL and finding.metrics["length_share"] == 1.0
    assert "eos_token_id" in (finding.suggestion or "")


def test_stop_probe_takes_a_sequence_past_the_answers_start() -> None:
    assert stop_probe(" orange") == ("nge", " ora")
    assert stop_probe("ab") is None and stop_probe("   ") is None


def test_tokens_are_counted_from_ids_then_logprobs_then_usage() -> None:
    ids = Completion("a b", "stop", token_ids=(1, 2))
    lps = Completion("a b", "stop", logprobs=(-0.1, -0.2, -0.3))
    bare = Completion("a b", "stop")
    assert completion_tokens(GenerationResult((ids,)), ids) == 2
    assert completion_tokens(GenerationResult((lps,)), lps) == 3
    assert completion_tokens(GenerationResult((bare,), extra={"completion_tokens": 5}), bare) == 5
    assert completion_tokens(GenerationResult((bare, bare), extra={"completion_tokens": 5}), bare) is None
