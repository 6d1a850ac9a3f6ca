"""``generation_drift`` passes a target whose answers change only when its inputs do (and whose
monitor sees it), and fails a target whose answers drift on clean traffic (state leaking between
calls) and a monitor tuned blind. The statistics themselves are checked against known values."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from mmchaos.checks import REGISTRY
from mmchaos.checks.observability.generation_drift import (
    GenerationDrift,
    GenerationDriftMonitor,
    js_divergence,
    ks_2samp,
)
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Finding, Verdict
from mmchaos.targets.base import Target
from mmchaos.targets.generation import GenerationParams, GenerationResult, as_messages
from tests.fakes.generative import WordsTarget
from tests.fakes.targets import HashEmbedTarget
from tests.support import run_check_class

DATA = make_shapes(48, seed=3)
SMALL: dict[str, Any] = {"samples": 48, "max_tokens": 16, "perturbations": ["low_light"]}


class DarkRefusesTarget(WordsTarget):
    """Honest: describes what it sees, and says it cannot see when the picture is dark."""

    def generate(self, prompt: Any, images: Sequence[Any] = (), params: GenerationParams | None = None) -> Any:
        messages = as_messages(prompt, images)
        pictures = [i for m in messages for i in m.images()]
        if pictures and float(np.mean(pictures[0])) < 60:
            result = super().generate(prompt, images, params)
            dark = result.completions[0].__class__("I cannot see the image, it is too dark.", "stop")
            return GenerationResult((dark,), result.prompt_tokens)
        return super().generate(prompt, images, params)


class VerboseOverTimeTarget(WordsTarget):
    """Broken: each call answers a little longer than the last (state that is never reset)."""

    def generate(self, prompt: Any, images: Sequence[Any] = (), params: GenerationParams | None = None) -> Any:
        result = super().generate(prompt, images, params)
        extra = " and more" * (self.calls // 4)
        first = result.completions[0]
        longer = first.__class__(first.text + extra, first.finish_reason)
        return GenerationResult((longer,), result.prompt_tokens)


def run(target: Target, params: dict[str, Any] | None = None) -> list[Finding]:
    return run_check_class(GenerationDrift, target, {**SMALL, **(params or {})}, data=DATA)


def test_registered_and_needs_generate() -> None:
    assert REGISTRY.get("generation_drift") is GenerationDrift
    assert GenerationDrift().missing_capabilities(HashEmbedTarget()) is not None


def test_statistics() -> None:
    assert ks_2samp([1, 2, 3, 4], [1, 2, 3, 4]) == (0.0, 1.0)
    d, p = ks_2samp(list(range(50)), list(range(100, 150)))
    assert d == 1.0 and p < 1e-10
    assert js_divergence(Counter("aab"), Counter("aab")) == 0.0
    assert js_divergence(Counter({"x": 100}), Counter({"y": 100}), smoothing=1e-9) == pytest.approx(1.0, abs=1e-6)
    monitor = GenerationDriftMonitor(["a red square"] * 10 + ["a blue circle"] * 10, rng=np.random.default_rng(0))
    assert monitor.score(["a red square", "a blue circle"] * 5).alarms == ()
    refusing = monitor.score(["I'm sorry, I cannot see it"] * 10)
    assert set(refusing.alarms) == {"refusal_rate", "token_distribution", "length"}


@pytest.mark.check_contract("generation_drift", "clean")
def test_an_honest_target_is_quiet_on_clean_traffic_and_its_shift_is_detected() -> None:
    clean, shifted = run(DarkRefusesTarget())
    assert clean.verdict == Verdict.PASS and clean.metrics["false_alarms"] == 0, clean.evidence
    assert shifted.verdict == Verdict.PASS and shifted.metrics["detected"] == 1, shifted.evidence
    row = shifted.evidence["rows"][0]
    assert row["material"] and "refusal_rate" in row["alarms"] and row["refusal_rate"] > 0.5


@pytest.mark.check_contract("generation_drift", "broken")
def test_answers_that_drift_on_clean_traffic_fail() -> None:
    clean = run(VerboseOverTimeTarget(), {"perturbations": []})[0]
    assert clean.verdict == Verdict.FAIL and "length" in clean.title, clean.evidence


def test_a_blind_monitor_misses_a_material_shift() -> None:
    blind = {"alpha": 1e-300, "min_refusal_delta": 1.0, "js_margin": 1000.0}
    shifted = run(DarkRefusesTarget(), blind)[1]
    assert shifted.verdict == Verdict.FAIL and shifted.metrics["missed"] == 1, shifted.evidence
    assert "low_light" in shifted.title
