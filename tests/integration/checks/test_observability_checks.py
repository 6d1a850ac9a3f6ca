"""Step 7: the drift monitor's power on a target's embeddings, and the metrics a server exports.

Each check passes a correct target and fails a deliberately broken one: a target whose state leaks
between calls (its embeddings drift on clean traffic), a monitor tuned blind, a server whose guards
are off (its guard metrics never move).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from mmchaos.checks.observability.drift_detection import DriftDetection
from mmchaos.checks.observability.metrics_exposure import MetricsExposure
from mmchaos.findings import Verdict
from tests.fakes.targets import HashEmbedTarget
from tests.support.observability_checks import SMALL, run


class LeakyStateTarget(HashEmbedTarget):
    """Broken: a buffer that is never reset scales each call's image embeddings a little more."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        self.calls += 1
        return super().embed_images(images) * np.float32(1.0 + 0.004 * self.calls)


@pytest.mark.check_contract("drift_detection", "clean")
@pytest.mark.integration
def test_drift_detection_passes_a_correct_target_with_real_clean_traffic() -> None:
    findings = run(
        DriftDetection,
        HashEmbedTarget(),
        {**SMALL, "perturbations": ["keyboard_typo", "gaussian_noise"], "clean_stream": "embed"},
    )
    assert all(f.verdict == Verdict.PASS for f in findings), [f.title for f in findings if f.verdict != Verdict.PASS]
    far = {f.evidence["modality"]: f for f in findings if "false_alarm_rate" in f.metrics}
    assert set(far) == {"image", "text"}
    assert (
        far["image"].evidence["clean_stream"] == "embed"
        and "real target calls" in far["image"].evidence["stream_source"]
    )
    assert far["text"].metrics["clean_requests"] == 1000
    typo = next(f for f in findings if f.evidence.get("perturbation") == "keyboard_typo")
    assert 0 < typo.metrics["delay_s5"] <= 1000 and typo.metrics["shift_s5"] > 0.05
    row = dict(zip(typo.evidence["table"]["columns"], typo.evidence["table"]["rows"][0], strict=True))
    assert row["material"] and row["detected"] and row["delay_requests"] % 200 == 0


@pytest.mark.check_contract("drift_detection", "broken")
@pytest.mark.integration
def test_drift_detection_flags_false_alarms_on_a_target_whose_state_leaks() -> None:
    findings = run(
        DriftDetection,
        LeakyStateTarget(),
        {**SMALL, "perturbations": ["gaussian_noise"], "clean_stream": "embed", "batch_size": 8},
    )
    image = next(f for f in findings if f.evidence.get("modality") == "image" and "false_alarm_rate" in f.metrics)
    assert image.verdict == Verdict.FAIL and image.metrics["false_alarm_rate"] > 0.5
    assert "not stationary" in image.suggestion
    text = next(f for f in findings if f.evidence.get("modality") == "text" and "false_alarm_rate" in f.metrics)
    assert text.verdict == Verdict.PASS  # only the image path leaks


@pytest.mark.check_contract("metrics_exposure", "clean")
@pytest.mark.integration
def test_metrics_exposure_passes_the_guarded_server_and_fails_one_with_guards_off() -> None:
    good = run(MetricsExposure, HashEmbedTarget(), {"requests_per_modality": 2})
    assert {f.title.split(" ")[0] for f in good} == {"latency", "traffic", "errors", "guards"}
    assert all(f.verdict == Verdict.PASS for f in good), [f.title for f in good if f.verdict != Verdict.PASS]
    errors = next(f for f in good if f.title.startswith("errors"))
    assert errors.evidence["answers"]["malformed:400"] == 2
    assert errors.evidence["budget"]["respected"] and errors.evidence["teardown"]["clean"]
    assert errors.evidence["conventions"] == ["mmchaos"]  # the reference server: judged by its own names
    bad = run(MetricsExposure, HashEmbedTarget(), {"requests_per_modality": 2, "server": {"guards": False}})
    guards = next(f for f in bad if f.title.startswith("guards"))
    assert guards.verdict == Verdict.FAIL
    static = {r["series"].split("{")[0] for r in guards.evidence["series"] if r["problem"]}
    assert {
        "mmchaos_preflight_inputs_total",
        "mmchaos_drift_embeddings_total",
        "mmchaos_slo_requests_total",
        "mmchaos_breaker_calls_total",
    } <= static
    assert next(f for f in bad if f.title.startswith("latency")).verdict == Verdict.PASS


@pytest.mark.check_contract("metrics_exposure", "broken")
@pytest.mark.integration
def test_metrics_exposure_fails_an_endpoint_without_metrics() -> None:
    from mmchaos.server import ServerConfig, ServerThread
    from mmchaos.targets.openai_http import OpenAITarget

    with ServerThread(HashEmbedTarget(), ServerConfig()) as srv:
        target = OpenAITarget.connect(srv.base_url)
        try:
            [f] = run(MetricsExposure, target, {"metrics_path": "/no-metrics-here"})
        finally:
            target.close()
    assert f.verdict == Verdict.FAIL and f.evidence["status"] == 404
