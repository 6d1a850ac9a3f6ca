"""DriftMonitor: streaming drift detection on embeddings, one state per modality.

Per modality, the first ``reference_size`` embeddings (or :meth:`DriftMonitor.set_reference`) fix
the reference. Traffic after it is cut into tumbling windows of ``window_size`` embeddings; each
closed window runs two tests:

- ``kl``: KL divergence between the reference's and the window's L2-norm histograms (additive
  smoothing, tail bins for norms outside the reference's range) against a dynamic threshold
  ``mean + alpha * std`` of recent KL values of quiet windows (seeded by a bootstrap from the
  reference, so it works from the first window). After ``patience`` alarms in a row ``alpha`` grows
  by ``alpha_step`` (up to ``alpha_max``) to damp an alarm storm, and falls back one step per quiet
  window. This is the 002 write-up's scheme; it *lowers* alpha after repeated alarms, which raises
  the alarm rate it means to suppress, so we move alpha the other way.
- ``mmd``: a two-sample test on the embeddings themselves: random Fourier features of a Gaussian
  kernel (bandwidth by the median heuristic), whose window mean is compared to the reference mean
  with a Hotelling statistic (chi-square null): a linear-time test of the kernel MMD.

Memory per modality is fixed (histogram, feature sums, a D x D matrix, the reference norms); an
update costs O(n * d * D) for n embeddings of dimension d, with no pairwise work per request.
Non-finite embeddings are dropped and raise a ``non_finite`` alarm at once.
"""

from __future__ import annotations

import math
import threading
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field, model_validator

from mmchaos.errors import ConfigError, UsageError
from mmchaos.guard import _telemetry
from mmchaos.guard._config import build_config, load_yaml_config

__all__ = ["DriftAlarm", "DriftConfig", "DriftMonitor", "DriftWindow", "chi2_sf"]

Floats = npt.NDArray[np.float64]


class DriftConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reference_size: int = Field(1000, ge=20)
    window_size: int = Field(200, ge=10)
    #: Norm-histogram bins, two of them tails for norms outside the reference's 0.5-99.5% range.
    bins: int = Field(20, ge=4)
    smoothing: float = Field(0.5, gt=0.0)
    symmetric_kl: bool = False
    alpha: float = Field(3.0, gt=0.0)
    alpha_step: float = Field(0.5, ge=0.0)
    alpha_max: float = Field(6.0, gt=0.0)
    patience: int = Field(3, ge=1)
    #: KL values of quiet windows kept for the threshold's mean and std.
    history: int = Field(50, ge=2)
    #: Null KL values drawn from the reference to seed the history.
    bootstrap: int = Field(100, ge=2)
    #: Random Fourier features of the MMD test; 0 turns the test off.
    rff_features: int = Field(64, ge=0)
    bandwidth: float | None = Field(None, gt=0.0)
    significance: float = Field(0.01, gt=0.0, lt=1.0)
    seed: int = 0

    @model_validator(mode="after")
    def _alpha_range(self) -> DriftConfig:
        if self.alpha_max < self.alpha:
            raise ValueError("alpha_max must be >= alpha")
        return self

    @classmethod
    def from_yaml(cls, source: str | Path) -> DriftConfig:
        return load_yaml_config(cls, source, "drift monitor config")


@dataclass(frozen=True, slots=True)
class DriftAlarm:
    monitor: str
    modality: str
    #: ``kl``, ``mmd`` or ``non_finite``.
    test: str
    statistic: float
    threshold: float
    window: int
    p_value: float | None = None
    consecutive: int = 1
    alpha: float | None = None


@dataclass(frozen=True, slots=True)
class DriftWindow:
    modality: str
    window: int
    kl: float
    kl_threshold: float
    alpha: float
    mean_norm: float
    mmd2: float | None = None
    p_value: float | None = None
    alarms: tuple[DriftAlarm, ...] = field(default_factory=tuple)


def chi2_sf(x: float, k: int) -> float:
    """P(X > x) for X ~ chi-square with k degrees of freedom (regularised upper gamma)."""
    if x <= 0.0:
        return 1.0
    a, half = k / 2.0, x / 2.0
    log_front = -half + a * math.log(half) - math.lgamma(a)
    if half < a + 1.0:  # series for the lower function P(a, x)
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1.0
            term *= half / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return min(1.0, max(0.0, 1.0 - total * math.exp(log_front)))
    tiny = 1e-300  # continued fraction for Q(a, x), modified Lentz
    b = half + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return min(1.0, max(0.0, math.exp(log_front) * h))


def _smooth(counts: npt.NDArray[np.int64], s: float) -> Floats:
    out: Floats = (counts + s) / (counts.sum() + s * counts.size)
    return out


def _kl(p: Floats, q: Floats, symmetric: bool) -> float:
    forward = float(np.sum(p * np.log(p / q)))
    if not symmetric:
        return forward
    return 0.5 * (forward + float(np.sum(q * np.log(q / p))))


class _Modality:
    """The reference and the open window of one modality; guarded by its own lock."""

    def __init__(self, name: str, cfg: DriftConfig) -> None:
        self.name = name
        self.cfg = cfg
        self.lock = threading.Lock()
        self.rng = np.random.default_rng([cfg.seed, zlib.crc32(name.encode())])
        self.pending: list[Floats] = []
        self.pending_rows = 0
        self.ready = False
        self.dim = 0
        self.alpha = cfg.alpha
        self.consecutive = 0
        self.windows = 0
        self.history: deque[float] = deque(maxlen=cfg.history)
        self.edges: Floats = np.zeros(0)
        self.ref_p: Floats = np.zeros(0)
        self.freq: Floats = np.zeros((0, 0))
        self.phase: Floats = np.zeros(0)
        self.ref_mean_z: Floats = np.zeros(0)
        self.inv_cov: Floats = np.zeros((0, 0))
        self.m = 0
        self.correction = 1.0
        self.seen: Any = None  # the monitor's embeddings counter for this modality
        self._reset_window()

    def _reset_window(self) -> None:
        self.counts = np.zeros(self.cfg.bins, dtype=np.int64)
        self.z_sum = np.zeros(self.cfg.rff_features)
        self.n = 0
        self.norm_sum = 0.0

    def set_reference(self, ref: Floats) -> None:
        cfg = self.cfg
        m, d = ref.shape
        if m < 20:
            raise UsageError(f"a drift reference needs at least 20 embeddings, got {m}", code="bad_embeddings")
        self.m, self.dim = m, d
        norms = np.sqrt(np.einsum("ij,ij->i", ref, ref))
        lo, hi = (float(v) for v in np.quantile(norms, [0.005, 0.995]))
        if hi - lo <= 1e-9 * max(1.0, abs(hi)):  # constant norms (normalised embeddings)
            pad = 1e-3 * max(abs(hi), 1e-6)
            lo, hi = lo - pad, hi + pad
        self.edges = np.linspace(lo, hi, cfg.bins - 1)
        self.ref_p = _smooth(self._hist(norms), cfg.smoothing)
        # Null KL values: a bootstrap reference against a bootstrap window, both from the reference,
        # so both sources of sampling noise are in the spread.
        null = []
        for _ in range(cfg.bootstrap):
            ref_star = _smooth(self._hist(self.rng.choice(norms, m)), cfg.smoothing)
            win_star = _smooth(self._hist(self.rng.choice(norms, cfg.window_size)), cfg.smoothing)
            null.append(_kl(ref_star, win_star, cfg.symmetric_kl))
        self.history = deque(null[-cfg.history :], maxlen=cfg.history)
        features = cfg.rff_features
        if features:
            sigma = cfg.bandwidth or self._median_distance(ref)
            self.freq = self.rng.normal(0.0, 1.0 / sigma, size=(d, features))
            self.phase = self.rng.uniform(0.0, 2.0 * math.pi, size=features)
            z = self._features(ref)
            self.ref_mean_z = z.mean(axis=0)
            cov = np.cov(z, rowvar=False).reshape(features, features)
            ridge = 1e-6 * float(np.trace(cov)) / features + 1e-12
            self.inv_cov = np.asarray(np.linalg.inv(cov + ridge * np.eye(features)), dtype=np.float64)
            # E[inverse of a sample covariance] = inverse * (m - 1) / (m - D - 2): undo that bias.
            self.correction = (m - features - 2) / (m - 1) if m > features + 2 else 1.0
        self.pending, self.pending_rows = [], 0
        self.ready = True
        self.alpha, self.consecutive = cfg.alpha, 0
        self._reset_window()

    def _median_distance(self, ref: Floats) -> float:
        rows = ref[self.rng.permutation(len(ref))[:256]]
        sq = np.einsum("ij,ij->i", rows, rows)
        d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * rows @ rows.T, 0.0)
        upper = d2[np.triu_indices(len(rows), k=1)]
        med = float(np.sqrt(np.median(upper))) if upper.size else 1.0
        return med if med > 0 else 1.0

    def _hist(self, norms: Floats) -> npt.NDArray[np.int64]:
        counts: npt.NDArray[np.int64] = np.bincount(
            np.searchsorted(self.edges, norms, side="right"), minlength=self.cfg.bins
        ).astype(np.int64)
        return counts

    def _features(self, x: Floats) -> Floats:
        z: Floats = math.sqrt(2.0 / self.cfg.rff_features) * np.cos(x @ self.freq + self.phase)
        return z

    def feed(self, x: Floats, monitor: str) -> list[DriftWindow]:
        cfg = self.cfg
        if x.shape[0] and self.dim and x.shape[1] != self.dim:
            raise UsageError(
                f"{self.name} embeddings have dimension {x.shape[1]}; the reference has {self.dim}",
                code="bad_embeddings",
            )
        if not self.ready:
            need = cfg.reference_size - self.pending_rows
            if self.pending and x.shape[1] != self.pending[0].shape[1]:
                raise UsageError(
                    f"{self.name} embeddings changed dimension from {self.pending[0].shape[1]} to {x.shape[1]}",
                    code="bad_embeddings",
                )
            self.pending.append(np.array(x[:need]))
            self.pending_rows += min(need, len(x))
            x = x[need:]
            if self.pending_rows >= cfg.reference_size:
                self.set_reference(np.concatenate(self.pending))
            if not len(x):
                return []
        norms = np.sqrt(np.einsum("ij,ij->i", x, x))
        bins = np.searchsorted(self.edges, norms, side="right")
        z = self._features(x) if cfg.rff_features else None
        out = []
        pos, total = 0, len(x)
        while pos < total:
            k = min(cfg.window_size - self.n, total - pos)
            if k == 1:
                self.counts[bins[pos]] += 1
                if z is not None:
                    self.z_sum += z[pos]
            else:
                self.counts += np.bincount(bins[pos : pos + k], minlength=cfg.bins)
                if z is not None:
                    self.z_sum += z[pos : pos + k].sum(axis=0)
            self.norm_sum += float(norms[pos : pos + k].sum())
            self.n += k
            pos += k
            if self.n >= cfg.window_size:
                out.append(self._close(monitor))
        return out

    def _close(self, monitor: str) -> DriftWindow:
        cfg = self.cfg
        n = self.n
        kl = _kl(self.ref_p, _smooth(self.counts, cfg.smoothing), cfg.symmetric_kl)
        past = np.fromiter(self.history, dtype=np.float64)
        threshold = float(past.mean() + self.alpha * past.std(ddof=1))
        window = self.windows
        alarms: list[str] = []
        if kl > threshold:
            alarms.append("kl")
        mmd2 = p_value = None
        if cfg.rff_features:
            diff = self.z_sum / n - self.ref_mean_z
            mmd2 = float(diff @ diff)
            t2 = self.correction * float(diff @ self.inv_cov @ diff) / (1.0 / n + 1.0 / self.m)
            p_value = chi2_sf(t2, cfg.rff_features)
            if p_value < cfg.significance:
                alarms.append("mmd")
        alpha = self.alpha
        if alarms:
            self.consecutive += 1
            if self.consecutive % cfg.patience == 0:
                self.alpha = min(self.alpha + cfg.alpha_step, cfg.alpha_max)
        else:
            self.consecutive = 0
            self.alpha = max(cfg.alpha, self.alpha - cfg.alpha_step)
        if "kl" not in alarms:
            self.history.append(kl)
        events = tuple(
            DriftAlarm(
                monitor=monitor,
                modality=self.name,
                test=test,
                statistic=kl if test == "kl" else float(mmd2 or 0.0),
                threshold=threshold if test == "kl" else cfg.significance,
                window=window,
                p_value=None if test == "kl" else p_value,
                consecutive=self.consecutive,
                alpha=alpha if test == "kl" else None,
            )
            for test in alarms
        )
        result = DriftWindow(
            modality=self.name,
            window=window,
            kl=kl,
            kl_threshold=threshold,
            alpha=alpha,
            mean_norm=self.norm_sum / n,
            mmd2=mmd2,
            p_value=p_value,
            alarms=events,
        )
        self.windows += 1
        self._reset_window()
        return result


class DriftMonitor:
    """Watch embedding streams per modality; alarms go to ``on_alarm`` callbacks and metrics.

    ``monitor.update("image", embeddings)`` takes an ``(n, d)`` (or ``(d,)``) array of the model's
    raw, un-normalised embeddings and returns the windows it closed (usually none).
    """

    def __init__(
        self,
        config: DriftConfig | None = None,
        *,
        name: str = "drift",
        on_alarm: Callable[[DriftAlarm], object] | Sequence[Callable[[DriftAlarm], object]] = (),
        registry: CollectorRegistry | None = None,
        tracer: object = None,
        **settings: Any,
    ) -> None:
        self.config = build_config(DriftConfig, config, settings, "drift monitor config")
        self.name = name
        self._listeners: list[Callable[[DriftAlarm], object]] = [on_alarm] if callable(on_alarm) else list(on_alarm)
        self._modalities: dict[str, _Modality] = {}
        self._lock = threading.Lock()
        self.registry = _telemetry.resolve_registry(registry)
        self._tracer = _telemetry.resolve_tracer(tracer)
        reg, labels = self.registry, ("name", "modality")
        self._m_embeddings = _telemetry.family(
            reg, Counter, "mmchaos_drift_embeddings", "Embeddings seen by the drift monitor.", labels
        )
        self._m_windows = _telemetry.family(reg, Counter, "mmchaos_drift_windows", "Closed drift windows.", labels)
        self._m_alarms = _telemetry.family(
            reg, Counter, "mmchaos_drift_alarms", "Drift alarms, by test.", ("name", "modality", "test")
        )
        self._m_nonfinite = _telemetry.family(
            reg, Counter, "mmchaos_drift_nonfinite_embeddings", "Embeddings with NaN or Inf, dropped.", labels
        )
        self._m_kl = _telemetry.family(reg, Gauge, "mmchaos_drift_kl", "KL divergence of the last window.", labels)
        self._m_threshold = _telemetry.family(
            reg, Gauge, "mmchaos_drift_kl_threshold", "Dynamic KL threshold of the last window.", labels
        )
        self._m_pvalue = _telemetry.family(
            reg, Gauge, "mmchaos_drift_mmd_p_value", "p-value of the last window's MMD test.", labels
        )
        self._m_norm = _telemetry.family(
            reg, Gauge, "mmchaos_drift_mean_norm", "Mean L2 norm of the last window's embeddings.", labels
        )
        self._m_alarm = _telemetry.family(
            reg, Gauge, "mmchaos_drift_alarm", "1 when the last window of a modality alarmed.", labels
        )

    @classmethod
    def from_yaml(cls, source: str | Path, **kwargs: Any) -> DriftMonitor:
        return cls(DriftConfig.from_yaml(source), **kwargs)

    def add_listener(self, callback: Callable[[DriftAlarm], object]) -> None:
        self._listeners.append(callback)

    def _state(self, modality: str) -> _Modality:
        if not isinstance(modality, str) or not modality:
            raise ConfigError(f"modality must be a non-empty string, got {modality!r}", code="bad_modality")
        state = self._modalities.get(modality)
        if state is None:
            with self._lock:
                state = self._modalities.get(modality)
                if state is None:
                    state = _Modality(modality, self.config)
                    state.seen = self._m_embeddings.labels(self.name, modality)
                    self._modalities[modality] = state
        return state

    @staticmethod
    def _matrix(embeddings: Any) -> Floats:
        try:
            x = np.asarray(embeddings, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"embeddings must be numeric: {exc}", code="bad_embeddings") from exc
        if x.ndim == 1:
            x = x[None, :]
        if x.ndim != 2 or x.shape[1] == 0:
            raise ConfigError(f"embeddings must be (n, d) or (d,), got shape {x.shape}", code="bad_embeddings")
        return x

    def set_reference(self, modality: str, embeddings: Any) -> None:
        """Fix the reference of ``modality`` from ``embeddings`` (replacing any earlier one)."""
        x = self._matrix(embeddings)
        x = x[np.isfinite(x).all(axis=1)]
        state = self._state(modality)
        with state.lock:
            state.dim = 0
            state.set_reference(x)

    def ready(self, modality: str) -> bool:
        """Whether ``modality`` has its reference and is being monitored."""
        state = self._modalities.get(modality)
        return state is not None and state.ready

    def update(self, modality: str, embeddings: Any) -> list[DriftWindow]:
        """Feed embeddings of one modality; returns the windows this update closed."""
        x = self._matrix(embeddings)
        finite = np.isfinite(x).all(axis=1)
        bad = int(x.shape[0] - int(finite.sum()))
        state = self._state(modality)
        if bad:
            x = x[finite]
        with state.lock:
            results = state.feed(x, self.name)
            window = state.windows
        state.seen.inc(x.shape[0] + bad)
        alarms: list[DriftAlarm] = []
        if bad:
            self._m_nonfinite.labels(self.name, modality).inc(bad)
            alarms.append(DriftAlarm(self.name, modality, "non_finite", float(bad), 0.0, window))
        for res in results:
            self._m_windows.labels(self.name, modality).inc()
            self._m_kl.labels(self.name, modality).set(res.kl)
            self._m_threshold.labels(self.name, modality).set(res.kl_threshold)
            self._m_norm.labels(self.name, modality).set(res.mean_norm)
            if res.p_value is not None:
                self._m_pvalue.labels(self.name, modality).set(res.p_value)
            self._m_alarm.labels(self.name, modality).set(1.0 if res.alarms else 0.0)
            alarms.extend(res.alarms)
        for alarm in alarms:
            self._m_alarms.labels(self.name, modality, alarm.test).inc()
            if self._tracer is not None:
                _telemetry.add_event(
                    "mmchaos.drift.alarm",
                    {
                        "mmchaos.guard": self.name,
                        "modality": modality,
                        "test": alarm.test,
                        "statistic": alarm.statistic,
                    },
                )
            _telemetry.fire(self._listeners, alarm)
        return results

    def reset(self, modality: str | None = None) -> None:
        """Forget the reference (of one modality, or all): the next embeddings form a new one."""
        with self._lock:
            if modality is None:
                self._modalities.clear()
            else:
                self._modalities.pop(modality, None)
