"""``generation_drift``: would you notice when a VLM's answers change? Drift statistics on generated text.

Embedding drift monitors see nothing of a generative model's output. This check watches what a
deployment can watch cheaply on every answer: its **length** (words; a two-sample Kolmogorov-Smirnov
test), its **refusal rate** (answers matching refusal patterns; a two-proportion z-test) and its
**token distribution** (word unigrams; Jensen-Shannon divergence against a threshold bootstrapped
from the reference, so it adapts to how varied the model's clean answers are).

The reference is the target's greedy answers on one half of the dataset; clean traffic is the other
half, which must not alarm (a target whose answers drift between calls fails here). Then the same
clean half is perturbed (image or prompt perturbations from the registry, at ``severity``): where
most answers changed (``material_change``), the statistics must alarm, else the monitor is blind.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability
from mmchaos.targets.generation import GenerationParams

__all__ = ["DEFAULT_REFUSALS", "GenerationDrift", "GenerationDriftMonitor", "js_divergence", "ks_2samp"]

DEFAULT_REFUSALS = (
    r"\bi(?:'m| am) (?:sorry|unable|not able)\b",
    r"\bi (?:can(?:no|')t|cannot|won't)\b",
    r"\bunable to (?:see|view|determine|identify|answer|help)\b",
    r"\bas an ai\b",
    r"\bno image\b",
)


def _kolmogorov_sf(x: float) -> float:
    """P(K > x) of the Kolmogorov distribution (the KS test's asymptotic p-value)."""
    if x <= 0.0:
        return 1.0
    total = sum((-1) ** (k - 1) * math.exp(-2.0 * k * k * x * x) for k in range(1, 101))
    return float(min(1.0, max(0.0, 2.0 * total)))


def ks_2samp(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Two-sample Kolmogorov-Smirnov: (D, asymptotic p-value) with Stephens' small-sample correction."""
    x, y = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    if not len(x) or not len(y):
        return 0.0, 1.0
    grid = np.concatenate([x, y])
    d = float(np.max(np.abs(np.searchsorted(x, grid, "right") / len(x) - np.searchsorted(y, grid, "right") / len(y))))
    en = math.sqrt(len(x) * len(y) / (len(x) + len(y)))
    return d, _kolmogorov_sf((en + 0.12 + 0.11 / en) * d)


def js_divergence(a: Counter[str], b: Counter[str], smoothing: float = 0.5) -> float:
    """Jensen-Shannon divergence (bits, 0..1) of two word-count distributions, add-``smoothing``."""
    vocab = sorted(set(a) | set(b))
    if not vocab:
        return 0.0
    p = np.array([a[w] for w in vocab], float) + smoothing
    q = np.array([b[w] for w in vocab], float) + smoothing
    p, q = p / p.sum(), q / q.sum()
    m = 0.5 * (p + q)
    return float(0.5 * np.sum(p * np.log2(p / m)) + 0.5 * np.sum(q * np.log2(q / m)))


def _two_proportion_p(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p-value that two rates are equal (pooled z-test)."""
    if not n1 or not n2:
        return 1.0
    pooled = (k1 + k2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    if se == 0.0:
        return 1.0 if k1 / n1 == k2 / n2 else 0.0
    z = abs(k1 / n1 - k2 / n2) / se
    return math.erfc(z / math.sqrt(2))


def _words(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text.lower())


@dataclass(frozen=True)
class DriftScore:
    """One window against the reference: each statistic, its threshold, and which ones alarmed."""

    length_d: float
    length_p: float
    refusal_rate: float
    refusal_p: float
    token_js: float
    token_js_threshold: float
    alarms: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"length_ks_d": round(self.length_d, 4), "length_ks_p": round(self.length_p, 6),
                "refusal_rate": round(self.refusal_rate, 4), "refusal_p": round(self.refusal_p, 6),
                "token_js": round(self.token_js, 5), "token_js_threshold": round(self.token_js_threshold, 5),
                "alarms": list(self.alarms)}  # fmt: skip


class GenerationDriftMonitor:
    """Length, refusal-rate and token-distribution drift of generated answers against a reference."""

    def __init__(
        self,
        reference: Sequence[str],
        *,
        rng: np.random.Generator,
        refusals: Sequence[str] = DEFAULT_REFUSALS,
        alpha: float = 0.01,
        min_refusal_delta: float = 0.1,
        js_quantile: float = 0.99,
        js_margin: float = 1.0,
        bootstrap: int = 200,
    ) -> None:
        if len(reference) < 4:
            raise ValueError(f"a generation drift reference needs at least 4 answers, got {len(reference)}")
        self.patterns = [re.compile(r, re.IGNORECASE) for r in refusals]
        self.reference = list(reference)
        self.alpha, self.min_refusal_delta = alpha, min_refusal_delta
        self.rng, self.js_quantile, self.js_margin, self.bootstrap = rng, js_quantile, js_margin, bootstrap
        self._lengths = [len(_words(t)) for t in self.reference]
        self._refusals = sum(self.refused(t) for t in self.reference)
        self._counts = Counter(w for t in self.reference for w in _words(t))
        self._thresholds: dict[int, float] = {}

    @property
    def reference_refusal_rate(self) -> float:
        return self._refusals / len(self.reference)

    def refused(self, text: str) -> bool:
        return any(p.search(text) for p in self.patterns)

    def _js_threshold(self, n: int) -> float:
        """The ``js_quantile`` of JS divergence between the reference and ``n`` answers resampled from it."""
        if n not in self._thresholds:
            values = []
            for _ in range(self.bootstrap):
                idx = self.rng.integers(0, len(self.reference), size=n)
                sample = Counter(w for i in idx for w in _words(self.reference[int(i)]))
                values.append(js_divergence(self._counts, sample))
            self._thresholds[n] = float(np.quantile(values, self.js_quantile))
        return self._thresholds[n]

    def score(self, window: Sequence[str]) -> DriftScore:
        lengths = [len(_words(t)) for t in window]
        d, p_len = ks_2samp(self._lengths, lengths)
        refusals = sum(self.refused(t) for t in window)
        rate = refusals / len(window) if window else 0.0
        p_ref = _two_proportion_p(self._refusals, len(self.reference), refusals, len(window))
        js = js_divergence(self._counts, Counter(w for t in window for w in _words(t)))
        threshold = self._js_threshold(len(window)) * self.js_margin
        alarms = []
        if p_len < self.alpha:
            alarms.append("length")
        if p_ref < self.alpha and abs(rate - self._refusals / len(self.reference)) >= self.min_refusal_delta:
            alarms.append("refusal_rate")
        if js > threshold:
            alarms.append("token_distribution")
        return DriftScore(d, p_len, rate, p_ref, js, threshold, tuple(alarms))


class GenerationDriftParams(Params):
    prompt: str = Field("Describe the image in a few words.", min_length=1)
    samples: int = Field(64, ge=8, le=10_000, description="dataset samples: half reference, half clean traffic")
    max_tokens: int = Field(24, ge=1, le=4096)
    perturbations: list[str] = Field(default_factory=lambda: ["low_light", "gaussian_noise"])
    severity: int = Field(5, ge=1, le=5)
    refusal_patterns: list[str] = Field(default_factory=lambda: list(DEFAULT_REFUSALS))
    alpha: float = Field(0.01, gt=0.0, lt=1.0, description="significance of the length and refusal tests")
    min_refusal_delta: float = Field(0.1, ge=0.0, le=1.0, description="smallest refusal-rate change that alarms")
    js_quantile: float = Field(0.99, gt=0.0, le=1.0, description="bootstrap quantile of the token JS threshold")
    js_margin: float = Field(1.0, ge=1.0, le=1000.0, description="multiplies the JS threshold")

    @field_validator("perturbations")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        from mmchaos import perturb

        for name in value:
            modality = perturb.REGISTRY.get(name).modality.value  # raises with the closest names
            if modality not in ("image", "text"):
                raise ValueError(f"{name} perturbs {modality} samples; generation_drift takes image or text ones")
        return value

    @field_validator("refusal_patterns")
    @classmethod
    def _compiles(cls, value: list[str]) -> list[str]:
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"refusal pattern {pattern!r} is not a regular expression: {exc}") from None
        return value


class GenerationDriftGate(Gate):
    max_false_alarms: int = Field(0, ge=0, description="statistics alarming on clean traffic")
    material_change: float = Field(
        0.5, gt=0.0, le=1.0, description="share of answers a perturbation changed that must be detected"
    )


class GenerationDrift(Check[GenerationDriftParams, GenerationDriftGate]):
    """Length, refusal-rate and token drift of generated answers: quiet on clean traffic, alarming on shifted."""

    name = "generation_drift"
    step = Step.OBSERVABILITY
    requires = (frozenset({Capability.GENERATE}),)

    def _answers(self, ctx: CheckContext, images: Sequence[Any], prompts: Sequence[str], bar: Any) -> list[str]:
        params = GenerationParams(max_new_tokens=self.params.max_tokens, logprobs=False)
        out = []
        for i, prompt in enumerate(prompts):
            out.append(ctx.target.generate(prompt, [images[i]] if images else [], params).text)
            bar.advance()
        return out

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        from mmchaos import perturb
        from mmchaos.perturb.base import BindContext

        p, g = self.params, self.gate
        data = ctx.dataset.sample(p.samples, ctx.seed)
        images = [s.load_image() for s in data] if data.has_images else []
        n = len(images) if images else p.samples
        if n < 8:
            yield self.finding(ctx, Verdict.SKIPPED, f"generation drift needs at least 8 samples, the data has {n}")
            return
        half = n // 2
        prompts = [p.prompt] * n
        plan = [(name, perturb.REGISTRY.get(name).modality.value) for name in p.perturbations]
        plan = [(name, m) for name, m in plan if m == "text" or images]
        bar = ctx.progress.task(f"{ctx.check_id}: answers", total=n + len(plan) * (n - half))
        try:
            answers = self._answers(ctx, images, prompts, bar)
            monitor = GenerationDriftMonitor(
                answers[:half], rng=ctx.rng("bootstrap"), refusals=p.refusal_patterns, alpha=p.alpha,
                min_refusal_delta=p.min_refusal_delta, js_quantile=p.js_quantile, js_margin=p.js_margin,
            )  # fmt: skip
            clean = answers[half:]
            clean_score = monitor.score(clean)
            yield self._clean_finding(ctx, clean_score, monitor, half)
            rows = []
            for name, modality in plan:
                pert = perturb.get(name).bind(
                    BindContext(target=ctx.target, labels=tuple(data.classes), prompt_template=data.prompt_template)
                )
                rng = ctx.rng("perturb", name, p.severity)
                if modality == "image":
                    shifted_images, _ = pert(images[half:], severity=p.severity, rng=rng)
                    shifted = self._answers(ctx, shifted_images, prompts[half:], bar)
                else:
                    shifted_prompts, _ = pert(prompts[half:], severity=p.severity, rng=rng)
                    shifted = self._answers(ctx, images[half:], [str(t) for t in shifted_prompts], bar)
                changed = sum(a != b for a, b in zip(clean, shifted, strict=True)) / len(clean)
                score = monitor.score(shifted)
                rows.append({"perturbation": name, "severity": p.severity, "changed": round(changed, 4),
                             "material": changed >= g.material_change, "detected": bool(score.alarms),
                             **score.to_dict()})  # fmt: skip
            if rows:
                yield self._shift_finding(ctx, rows)
        finally:
            bar.close()

    def _clean_finding(
        self, ctx: CheckContext, score: DriftScore, monitor: GenerationDriftMonitor, half: int
    ) -> Finding:
        g = self.gate
        failed = len(score.alarms) > g.max_false_alarms
        ref_rate = monitor.reference_refusal_rate
        return self.finding(
            ctx,
            Verdict.FAIL if failed else Verdict.PASS,
            "generated answers on clean traffic: "
            + (f"false alarm ({', '.join(score.alarms)})" if score.alarms else "no drift alarm"),
            severity=Severity.MEDIUM if failed else Severity.INFO,
            metrics={
                "false_alarms": float(len(score.alarms)),
                "length_ks_p": score.length_p,
                "token_js": score.token_js,
                "token_js_threshold": score.token_js_threshold,
                "refusal_rate_reference": ref_rate,
                "refusal_rate_clean": score.refusal_rate,
            },
            gate=f"at most {g.max_false_alarms} statistics alarm on clean answers ({half} reference, {half} clean)",
            message=f"clean answers differ from the reference: {', '.join(score.alarms)}" if failed else "",
            suggestion="the same kind of input gets different answers over time: look for state that leaks between "
            "requests (a cache, a counter, a sampler that is not reset), or give the monitor more reference"
            if failed
            else "",
            evidence={"clean": score.to_dict()},
        )

    def _shift_finding(self, ctx: CheckContext, rows: list[dict[str, Any]]) -> Finding:
        missed = [r for r in rows if r["material"] and not r["detected"]]
        detected = [r["perturbation"] for r in rows if r["detected"]]
        material = [r for r in rows if r["material"]]
        if missed:
            title = "drift on shifted traffic: missed " + ", ".join(
                f"{r['perturbation']} ({r['changed']:.0%} of answers changed)" for r in missed
            )
        elif detected:
            title = f"drift on shifted traffic: detected {', '.join(detected)}"
        else:
            title = "drift on shifted traffic: nothing to detect (no perturbation changed most answers)"
        return self.finding(
            ctx,
            Verdict.FAIL if missed else Verdict.PASS,
            title,
            severity=Severity.MEDIUM if missed else Severity.INFO,
            metrics={
                "perturbations": float(len(rows)),
                "material": float(len(material)),
                "detected": float(len(detected)),
                "missed": float(len(missed)),
            },
            gate=f"every perturbation that changes >= {self.gate.material_change:.0%} of the answers alarms "
            "(length, refusal rate or token distribution)",
            message="; ".join(f"{r['perturbation']}: no statistic alarmed" for r in missed),
            suggestion="the monitor is blind to answers that changed: lower alpha or js_margin, or add the "
            "refusal phrases this model uses"
            if missed
            else "",
            evidence={"rows": rows},
        )
