"""DriftMonitor: quiet on clean streams (false-alarm rate measured), alarms on norm and direction
shifts and on NaN, adapts alpha under a sustained alarm, deterministic by seed, fixed memory."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from mmchaos.errors import ConfigError, UsageError
from mmchaos.guard import DriftAlarm, DriftConfig, DriftMonitor, DriftWindow
from mmchaos.guard.drift import chi2_sf

DIM = 16
SETTINGS: dict[str, Any] = {"reference_size": 500, "window_size": 100, "rff_features": 32}


class Stream:
    """Embeddings of a fixed distribution: mean vector plus isotropic noise (002's N(0, 0.8))."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.mean = np.random.default_rng(99).normal(size=DIM)

    def clean(self, n: int) -> np.ndarray:
        return self.mean + self.rng.normal(scale=0.8, size=(n, DIM))


def monitor(**kw: Any) -> DriftMonitor:
    return DriftMonitor(registry=CollectorRegistry(), tracer=False, **{**SETTINGS, **kw})


def feed(mon: DriftMonitor, batches: list[np.ndarray], modality: str = "image") -> list[DriftWindow]:
    out: list[DriftWindow] = []
    for batch in batches:
        out.extend(mon.update(modality, batch))
    return out


def test_chi2_survival_function() -> None:
    # Reference values from scipy.stats.chi2.sf.
    assert chi2_sf(100.0, 64) == pytest.approx(0.0026862828946550184, rel=1e-9)
    assert chi2_sf(64.0, 64) == pytest.approx(0.4764883054762586, rel=1e-9)
    assert chi2_sf(10.0, 3) == pytest.approx(0.01856613546304325, rel=1e-9)
    assert chi2_sf(0.001, 1) == pytest.approx(0.9747728793699604, rel=1e-9)
    assert chi2_sf(0.0, 5) == 1.0 and chi2_sf(1e4, 8) == 0.0
    scipy_stats = pytest.importorskip("scipy.stats")
    for x in (0.5, 3.0, 20.0, 63.0, 90.0, 150.0):
        for k in (1, 2, 7, 32, 64):
            assert chi2_sf(x, k) == pytest.approx(float(scipy_stats.chi2.sf(x, k)), rel=1e-7, abs=1e-300)


def test_quiet_on_clean_traffic_with_a_measured_false_alarm_rate() -> None:
    stream = Stream(1)
    mon = monitor()
    windows = feed(mon, [stream.clean(500)] + [stream.clean(100) for _ in range(120)])
    assert len(windows) == 120
    kl_rate = sum(any(a.test == "kl" for a in w.alarms) for w in windows) / len(windows)
    mmd_rate = sum(any(a.test == "mmd" for a in w.alarms) for w in windows) / len(windows)
    # Expected about 1% (KL, alpha=3 on a right-skewed statistic) and 1% (MMD at significance 0.01).
    assert kl_rate <= 0.05 and mmd_rate <= 0.05, (kl_rate, mmd_rate)


def test_alarms_when_the_norm_distribution_shifts() -> None:
    stream = Stream(2)
    alarms: list[DriftAlarm] = []
    mon = monitor(on_alarm=alarms.append)
    feed(mon, [stream.clean(500)] + [stream.clean(100) for _ in range(5)])
    alarms.clear()
    shifted = feed(mon, [stream.clean(100) * 1.5 for _ in range(3)])  # norms jump, as in the 002 write-up
    assert all({"kl", "mmd"} <= {a.test for a in w.alarms} for w in shifted)
    assert shifted[0].mean_norm > 1.4 * np.linalg.norm(stream.mean)
    assert {a.test for a in alarms} == {"kl", "mmd"} and all(a.modality == "image" for a in alarms)
    reg = mon.registry
    assert reg.get_sample_value("mmchaos_drift_alarms_total", {"name": "drift", "modality": "image", "test": "kl"}) == 3
    assert reg.get_sample_value("mmchaos_drift_alarm", {"name": "drift", "modality": "image"}) == 1.0


def test_the_embedding_test_catches_a_shift_that_keeps_the_norms() -> None:
    stream = Stream(3)
    mon = monitor()
    feed(mon, [stream.clean(500)])
    q, _ = np.linalg.qr(np.random.default_rng(7).normal(size=(DIM, DIM)))
    rotated = feed(mon, [stream.clean(100) @ q for _ in range(4)])  # same norms, other directions
    assert all(any(a.test == "mmd" for a in w.alarms) for w in rotated)
    assert all(w.p_value is not None and w.p_value < 1e-6 for w in rotated)


def test_non_finite_embeddings_alarm_at_once_and_are_dropped() -> None:
    stream = Stream(4)
    alarms: list[DriftAlarm] = []
    mon = monitor(on_alarm=alarms.append)
    feed(mon, [stream.clean(500)])
    batch = stream.clean(10)
    batch[3, 5] = np.nan
    batch[7, 0] = np.inf
    assert mon.update("text", batch) == []
    assert [(a.test, a.statistic, a.modality) for a in alarms] == [("non_finite", 2.0, "text")]
    get = mon.registry.get_sample_value
    assert get("mmchaos_drift_nonfinite_embeddings_total", {"name": "drift", "modality": "text"}) == 2
    assert get("mmchaos_drift_embeddings_total", {"name": "drift", "modality": "text"}) == 10


def test_alpha_grows_under_a_sustained_alarm_and_falls_back_after() -> None:
    stream = Stream(5)
    mon = monitor(rff_features=0, patience=2, alpha_step=1.0, alpha_max=5.0)
    feed(mon, [stream.clean(500)])
    drifted = feed(mon, [stream.clean(100) * 1.3 for _ in range(6)])
    assert [w.alpha for w in drifted] == [3.0, 3.0, 4.0, 4.0, 5.0, 5.0]
    assert [w.alarms[0].consecutive for w in drifted] == [1, 2, 3, 4, 5, 6]
    calm = feed(mon, [stream.clean(100) for _ in range(4)])
    assert [w.alpha for w in calm] == [5.0, 4.0, 3.0, 3.0]
    assert not calm[-1].alarms


def test_modalities_are_independent_and_deterministic_by_seed() -> None:
    def run(seed: int) -> list[tuple[float, float | None]]:
        stream = Stream(6)
        mon = monitor(seed=seed)
        image = feed(mon, [stream.clean(600), stream.clean(300)], "image")
        text = feed(mon, [stream.clean(600) * 2.0], "text")
        assert len(image) == 4 and len(text) == 1 and mon.ready("image") and mon.ready("text")
        return [(w.kl, w.p_value) for w in image + text]

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_memory_is_fixed_after_the_reference() -> None:
    stream = Stream(7)
    mon = monitor()
    feed(mon, [stream.clean(500)])
    state = mon._modalities["image"]
    sizes = (state.counts.size, state.z_sum.size, state.inv_cov.size, len(state.history), len(state.pending))
    feed(mon, [stream.clean(100) for _ in range(30)])
    assert (state.counts.size, state.z_sum.size, state.inv_cov.size, len(state.history), len(state.pending)) == sizes
    assert len(state.pending) == 0 and state.n == 0


def test_explicit_reference_and_input_validation() -> None:
    stream = Stream(8)
    mon = monitor()
    mon.set_reference("image", stream.clean(300))
    assert mon.ready("image")
    assert len(mon.update("image", stream.clean(100))) == 1
    with pytest.raises(UsageError) as info:
        mon.update("image", np.zeros((3, DIM + 1)))
    assert info.value.code == "bad_embeddings"
    with pytest.raises(UsageError):
        mon.update("image", np.zeros((2, 2, 2)))
    with pytest.raises(UsageError):
        mon.update("image", [["not", "numbers"]])
    mon.update("audio", stream.clean(10))
    with pytest.raises(UsageError):
        mon.update("audio", np.zeros((3, 5)))
    mon.reset("image")
    assert not mon.ready("image")
    one = mon.update("image", stream.clean(1)[0])  # a single (d,) vector is accepted
    assert one == []


def test_normalised_embeddings_still_get_a_usable_histogram() -> None:
    stream = Stream(9)
    mon = monitor(rff_features=0)

    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    quiet = feed(mon, [unit(stream.clean(500))] + [unit(stream.clean(100)) for _ in range(5)])
    assert not any(w.alarms for w in quiet)
    loud = feed(mon, [unit(stream.clean(100)) * 1.01 for _ in range(2)])
    assert all(w.alarms for w in loud), "constant norms: any change of norm is drift"


def test_config_validation() -> None:
    with pytest.raises(ConfigError):
        DriftMonitor(alpha=4.0, alpha_max=3.0)
    with pytest.raises(ConfigError):
        DriftMonitor(window_size=0)
    cfg = DriftConfig.from_yaml("window_size: 50\nseed: 3\n")
    assert cfg.window_size == 50 and cfg.seed == 3


@pytest.mark.parametrize("modality", [None, 3, ""])
def test_a_modality_that_is_not_a_name_is_a_typed_error(modality: Any) -> None:
    """``update(None, ...)`` raised a bare AttributeError from the metrics labels."""
    mon = monitor()
    with pytest.raises(ConfigError) as caught:
        mon.update(modality, np.zeros((2, DIM)))
    assert caught.value.code == "bad_modality"
    assert mon.update("image", np.zeros((2, DIM))) == []


@pytest.mark.parametrize("embeddings", [None, "abc", [[]]])
def test_embeddings_that_are_not_a_matrix_are_a_typed_error(embeddings: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        monitor().update("image", embeddings)
    assert caught.value.code == "bad_embeddings"
