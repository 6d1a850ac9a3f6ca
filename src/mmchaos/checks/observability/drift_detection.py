"""``drift_detection``: would you notice? The drift monitor's power on the target's own embeddings.

A :class:`~mmchaos.guard.DriftMonitor` (the server's configuration by default) watches a stream of
the target's embeddings: clean traffic for the false-alarm rate, then traffic perturbed by the
perturbation registry for the detection delay, per perturbation and severity. A shift that moves
the embeddings materially must be seen within a bounded number of requests.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, field_validator

from mmchaos.chaos.experiment import jsonable
from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.guard.drift import DriftConfig, DriftMonitor
from mmchaos.targets.base import Capability, Target

__all__ = ["DriftDetection"]

Floats = npt.NDArray[np.float64]
_MODALITY_CAP = {"image": Capability.EMBED_IMAGE, "text": Capability.EMBED_TEXT}


class DriftDetectionParams(Params):
    perturbations: list[str] = Field(
        default_factory=lambda: [
            "gaussian_noise",
            "gaussian_blur",
            "low_light",
            "jpeg_compression",
            "keyboard_typo",
            "word_shuffle",
        ]
    )
    severities: list[int] = Field(default_factory=lambda: [1, 3, 5], min_length=1)
    samples: int = Field(128, ge=16, le=100_000, description="distinct inputs embedded per pool")
    clean_requests: int = Field(10_000, ge=1000, le=10_000_000, description="clean traffic after the reference")
    clean_stream: Literal["auto", "embed", "resample"] = Field(
        "auto",
        description="embed: every clean request is a real target call (images with +/-1 LSB jitter); resample: "
        "draws from the embedded pool plus tiny noise; auto: embed when it fits max_embed_seconds",
    )
    max_embed_seconds: float = Field(20.0, gt=0.0)
    noise: float = Field(0.01, ge=0.0, le=1.0, description="resampling noise, relative to the pool's per-dim std")
    lead_in_requests: int = Field(400, ge=0, description="clean requests before the perturbed ones")
    max_delay_requests: int = Field(3000, ge=10, description="perturbed requests streamed at most")
    batch_size: int = Field(64, ge=1, le=4096)
    drift: DriftConfig = Field(
        default_factory=lambda: DriftConfig.model_validate({}), description="the monitor (the server's default)"
    )

    @field_validator("perturbations")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        from mmchaos import perturb

        for name in value:
            modality = perturb.REGISTRY.get(name).modality  # raises with the closest names
            if modality.value not in _MODALITY_CAP:
                raise ValueError(f"{name} perturbs {modality.value} samples; drift_detection takes image or text ones")
        if not value:
            raise ValueError("give at least one perturbation")
        return value

    @field_validator("severities")
    @classmethod
    def _levels(cls, value: list[int]) -> list[int]:
        if any(not 1 <= s <= 5 for s in value):
            raise ValueError("severities are 1-5")
        return sorted(set(value))


class DriftDetectionGate(Gate):
    max_false_alarm_rate: float = Field(0.1, ge=0.0, le=1.0, description="alarmed clean windows / clean windows")
    max_detection_delay: int = Field(1000, ge=1, description="requests until a material shift alarms")
    material_shift: float = Field(
        0.05, gt=0.0, le=1.0, description="1 - mean paired cosine (or |norm ratio - 1|) that must be detected"
    )


def _embed(target: Target, modality: str, items: Sequence[Any], batch: int) -> Floats:
    fn = target.embed_images if modality == "image" else target.embed_texts
    parts = [np.asarray(fn(list(items[i : i + batch])), dtype=np.float64) for i in range(0, len(items), batch)]
    return np.concatenate(parts, axis=0)


def _resample(pool: Floats, n: int, rng: np.random.Generator, sigma: Floats) -> Floats:
    idx = rng.integers(0, len(pool), size=n)
    out: Floats = pool[idx] + rng.normal(0.0, 1.0, size=(n, pool.shape[1])) * sigma
    return out


class _Stream:
    """Feeds one modality of a monitor and remembers where each window closed (in requests)."""

    def __init__(self, monitor: DriftMonitor, modality: str) -> None:
        self.monitor = monitor
        self.modality = modality
        self.fed = 0
        self.windows: list[tuple[int, bool, tuple[str, ...]]] = []  # (closing position, alarmed, tests)

    def feed(self, x: Floats, chunk: int) -> None:
        for i in range(0, len(x), chunk):
            part = x[i : i + chunk]
            closed = self.monitor.update(self.modality, part)
            self.fed += len(part)
            for w in closed:
                self.windows.append((self.fed, bool(w.alarms), tuple(a.test for a in w.alarms)))


class DriftDetection(Check[DriftDetectionParams, DriftDetectionGate]):
    """Drift monitor on the target's embeddings: false alarms on clean traffic, delay on perturbed traffic."""

    name = "drift_detection"
    step = Step.OBSERVABILITY
    requires = (frozenset({Capability.EMBED_IMAGE}), frozenset({Capability.EMBED_TEXT}))

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        from mmchaos import perturb

        p = self.params
        data = ctx.dataset.sample(p.samples, ctx.seed)
        inputs: dict[str, list[Any]] = {}
        if ctx.target.has(Capability.EMBED_IMAGE) and data.has_images and len(data):
            inputs["image"] = [s.load_image() for s in data]
        texts = [t for t in (s.caption or s.text or s.label for s in data) if t]
        if ctx.target.has(Capability.EMBED_TEXT) and texts:
            inputs["text"] = texts
        plan = [(name, mod) for name in p.perturbations if (mod := perturb.REGISTRY.get(name).modality.value) in inputs]
        if not inputs:
            yield self.finding(ctx, Verdict.SKIPPED, "no images or texts in the data for this target to embed")
            return
        bar = ctx.progress.task(f"{ctx.check_id}: drift", total=len(inputs) + len(plan) * len(p.severities))
        try:
            clean: dict[str, dict[str, Any]] = {}
            for modality, items in inputs.items():
                clean[modality] = self._clean(ctx, modality, items)
                yield self._far_finding(ctx, modality, clean[modality])
                bar.advance()
            for name, modality in plan:
                rows = []
                for severity in p.severities:
                    rows.append(self._detect(ctx, name, modality, severity, inputs[modality], clean[modality]))
                    bar.advance()
                yield self._detection_finding(ctx, name, modality, rows, clean[modality])
        finally:
            bar.close()

    # clean traffic: the reference, the false-alarm rate

    def _clean(self, ctx: CheckContext, modality: str, items: list[Any]) -> dict[str, Any]:
        p = self.params
        cfg = p.drift
        started = time.perf_counter()
        pool = _embed(ctx.target, modality, items, p.batch_size)
        rate = len(items) / max(time.perf_counter() - started, 1e-6)
        sigma = p.noise * pool.std(axis=0)
        total = cfg.reference_size + p.clean_requests
        mode = p.clean_stream
        if mode == "auto":
            mode = "embed" if total / rate <= p.max_embed_seconds else "resample"
        rng = ctx.rng("clean", modality)
        if mode == "embed":
            idx = rng.integers(0, len(items), size=total)
            if modality == "image":

                def jitter(k: int) -> Any:
                    img = items[k].astype(np.int16) + rng.integers(-1, 2, size=items[k].shape, dtype=np.int16)
                    return np.clip(img, 0, 255).astype(np.uint8)

                stream = np.concatenate(
                    [
                        _embed(ctx.target, modality, [jitter(int(k)) for k in idx[i : i + 512]], p.batch_size)
                        for i in range(0, total, 512)
                    ]
                )
            else:
                stream = _embed(ctx.target, modality, [items[int(k)] for k in idx], p.batch_size)
            source = f"{total} real target calls on {len(items)} distinct inputs" + (
                " (each image with +/-1 LSB pixel jitter)" if modality == "image" else " (texts repeat)"
            )
        else:
            stream = _resample(pool, total, rng, sigma)
            source = (
                f"resampled from {len(items)} real embeddings with Gaussian noise of {p.noise:g} x the pool's "
                f"per-dimension std (computing {total} real embeddings would take about {total / rate:.0f} s)"
            )
        monitor = DriftMonitor(cfg, name="clean")
        feed = _Stream(monitor, modality)
        feed.feed(stream, cfg.window_size)
        windows = len(feed.windows)
        alarmed = [w for w in feed.windows if w[1]]
        tests: dict[str, int] = {}
        for w in alarmed:
            for t in w[2]:
                tests[t] = tests.get(t, 0) + 1
        return {
            "pool": pool,
            "sigma": sigma,
            "mode": mode,
            "source": source,
            "windows": windows,
            "alarmed": len(alarmed),
            "tests": tests,
            "first_alarm_at": alarmed[0][0] - cfg.reference_size if alarmed else None,
            "embed_rate": rate,
        }

    def _far_finding(self, ctx: CheckContext, modality: str, c: dict[str, Any]) -> Finding:
        p = self.params
        g = self.gate
        far = c["alarmed"] / c["windows"] if c["windows"] else 0.0
        ok = far <= g.max_false_alarm_rate
        return self.finding(
            ctx,
            Verdict.PASS if ok else Verdict.FAIL,
            f"{modality}: {c['alarmed']} false alarms in {c['windows']} clean windows "
            f"({far:.1%} over {p.clean_requests} clean requests)",
            severity=Severity.INFO if ok else Severity.MEDIUM,
            metrics={
                "false_alarm_rate": far,
                "false_alarms_per_10k_requests": c["alarmed"] * 10_000 / p.clean_requests,
                "clean_windows": float(c["windows"]),
                "clean_requests": float(p.clean_requests),
            },
            gate=f"false-alarm rate <= {g.max_false_alarm_rate:.1%} of clean windows",
            message="" if ok else f"alarms by test: {c['tests']}; the first after {c['first_alarm_at']} requests",
            suggestion=""
            if ok
            else (
                "the monitor alarms on clean traffic: the embeddings are not stationary (state leaking between "
                "calls, a warm-up effect), or alpha/significance are too tight for this traffic"
            ),
            evidence=jsonable(
                {
                    "modality": modality,
                    "clean_stream": c["mode"],
                    "stream_source": c["source"],
                    "alarms_by_test": c["tests"],
                    "first_alarm_after_requests": c["first_alarm_at"],
                    "reference_size": p.drift.reference_size,
                    "window_size": p.drift.window_size,
                    "drift_config": p.drift.model_dump(),
                    "embed_rate_per_s": round(c["embed_rate"], 1),
                }
            ),
        )

    # perturbed traffic: the detection delay

    def _detect(
        self, ctx: CheckContext, name: str, modality: str, severity: int, items: list[Any], c: dict[str, Any]
    ) -> dict[str, Any]:
        from mmchaos import perturb
        from mmchaos.perturb.base import BindContext

        p = self.params
        g = self.gate
        cfg = p.drift
        data = ctx.dataset
        pert = perturb.get(name).bind(
            BindContext(target=ctx.target, labels=tuple(data.classes), prompt_template=data.prompt_template)
        )
        changed, _ = pert(items, severity=severity, rng=ctx.rng("perturb", name, severity))
        pool_p = _embed(ctx.target, modality, changed, p.batch_size)
        pool_c: Floats = c["pool"]
        norms_c = np.linalg.norm(pool_c, axis=1)
        norms_p = np.linalg.norm(pool_p, axis=1)
        cos = np.sum(pool_c * pool_p, axis=1) / np.maximum(norms_c * norms_p, 1e-12)
        shift = float(1.0 - np.mean(cos))
        ratio = float(np.mean(norms_p) / max(float(np.mean(norms_c)), 1e-12))
        material = shift >= g.material_shift or abs(ratio - 1.0) >= g.material_shift
        # Reference, lead-in and perturbed traffic are all drawn the same way (the pool resampled with
        # the same noise), so an alarm is the perturbation's doing, not a difference in how streams are made.
        monitor = DriftMonitor(cfg, name="perturbed")
        rng = ctx.rng("stream", name, severity)
        monitor.set_reference(modality, _resample(pool_c, cfg.reference_size, rng, c["sigma"]))
        feed = _Stream(monitor, modality)
        lead = -(-p.lead_in_requests // cfg.window_size) * cfg.window_size  # whole windows, so none is mixed
        feed.feed(_resample(pool_c, lead, rng, c["sigma"]), cfg.window_size)
        lead_alarms = sum(1 for w in feed.windows if w[1])
        delay: int | None = None
        tests: tuple[str, ...] = ()
        sent = 0
        while sent < p.max_delay_requests and delay is None:
            n = min(cfg.window_size, p.max_delay_requests - sent)
            feed.feed(_resample(pool_p, n, rng, c["sigma"]), cfg.window_size)
            sent += n
            for pos, alarmed, which in feed.windows:
                if alarmed and pos > lead:
                    delay, tests = pos - lead, which
                    break
        return {
            "severity": severity,
            "shift": round(shift, 5),
            "norm_ratio": round(ratio, 5),
            "material": material,
            "detected": delay is not None,
            "delay_requests": delay,
            "alarm_tests": list(tests),
            "lead_in_false_alarms": lead_alarms,
            "perturbed_requests": sent,
        }

    def _detection_finding(
        self, ctx: CheckContext, name: str, modality: str, rows: list[dict[str, Any]], c: dict[str, Any]
    ) -> Finding:
        p = self.params
        g = self.gate
        missed = [
            r
            for r in rows
            if r["material"] and (r["delay_requests"] is None or r["delay_requests"] > g.max_detection_delay)
        ]
        metrics: dict[str, float] = {}
        for r in rows:
            s = r["severity"]
            metrics[f"delay_s{s}"] = float(r["delay_requests"] if r["delay_requests"] is not None else -1)
            metrics[f"shift_s{s}"] = float(r["shift"])
        detected = [r["severity"] for r in rows if r["detected"]]
        max_shift = max(max(r["shift"], abs(r["norm_ratio"] - 1.0)) for r in rows)
        if missed:
            title = f"{name}: material shifts missed at severity " + ", ".join(
                f"{r['severity']} (shift {r['shift']:.3f}, "
                + ("not detected" if r["delay_requests"] is None else f"{r['delay_requests']} requests")
                + ")"
                for r in missed
            )
        elif detected:
            first = min(detected)
            row = next(r for r in rows if r["severity"] == first)
            title = f"{name}: detected from severity {first} (after {row['delay_requests']} requests)"
            if not any(r["material"] for r in rows):
                title += f", though no severity moves the embeddings materially (max shift {max_shift:.3f})"
        else:
            title = f"{name}: not detected, and no severity shifts the embeddings materially"
        return self.finding(
            ctx,
            Verdict.FAIL if missed else Verdict.PASS,
            title,
            severity=Severity.MEDIUM if missed else Severity.INFO,
            metrics=metrics,
            gate=(
                f"a shift of >= {g.material_shift:g} (1 - mean paired cosine, or |norm ratio - 1|) alarms within "
                f"{g.max_detection_delay} requests"
            ),
            message="" if not missed else f"{len(missed)} material shift(s) went unseen",
            suggestion=(
                "the monitor is blind to this shift: add the MMD test (rff_features), shorten the window, or "
                "lower alpha/raise significance"
                if missed
                else ""
            ),
            evidence=jsonable(
                {
                    "perturbation": name,
                    "modality": modality,
                    "table": {
                        "columns": list(rows[0]),
                        "rows": [list(r.values()) for r in rows],
                    },
                    "pools": f"{len(c['pool'])} real clean and perturbed embeddings per severity, streamed by "
                    f"resampling with noise {p.noise:g} x per-dim std",
                    "window_size": p.drift.window_size,
                }
            ),
        )
