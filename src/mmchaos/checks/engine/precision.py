"""Step 4: the same inputs in fp32 and in fp16/bf16: embedding drift, decisions, and NaN origins.

The target's torch module is cast in place to each low precision (the original fp32 tensors are
kept and put back bit for bit afterwards), and the target's own ``embed_*`` methods run again on
the same inputs. Reported per dtype: cosine drift, the logit deviation next to the fp32 decision
margins, top-1 agreement of zero-shot decisions (or nearest-neighbour decisions without labels)
and the task metric's change over the confident samples (a near-tie flips on rounding noise in
any precision: an untrained model is not a precision bug), each leaf module's output error against
fp32 for the worst input and the module where that error grows most (even when every value stays
finite), and -- when an output is NaN/Inf -- the first module, by qualified name, whose output
stopped being finite, and the input that makes it so (found with forward hooks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field

from mmchaos._lazy import require
from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.checks.engine.layer_drift import layer_errors, tensors_in, trace_leaf_modules
from mmchaos.checks.evidence import image_artifact, safe_name
from mmchaos.findings import Artifact, Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability, Target
from mmchaos.tasks.base import l2_normalise

__all__ = ["NonFiniteOrigin", "Precision", "cast_module", "first_nonfinite_module"]

log = logging.getLogger(__name__)

DType = Literal["float16", "bfloat16"]


@contextmanager
def cast_module(module: Any, dtype: Any) -> Iterator[None]:
    """Cast ``module``'s floating parameters and buffers to ``dtype``; restore the originals exactly.

    Restoring re-attaches the very fp32 tensors (not copies): a copy can land at another memory
    alignment and change results in the last bit, which would poison later exact comparisons.
    """
    torch = require("torch")
    params = {name: p.data for name, p in module.named_parameters()}
    buffers = {name: b for name, b in module.named_buffers()}
    try:
        module.to(dtype)
        yield
    finally:
        with torch.no_grad():
            for name, p in module.named_parameters():
                p.data = params[name]
            for name, buf in buffers.items():
                owner_name, _, attr = name.rpartition(".")
                owner = module.get_submodule(owner_name) if owner_name else module
                setattr(owner, attr, buf)


@dataclass
class NonFiniteOrigin:
    module: str
    module_type: str
    input_max_abs: float
    output_nonfinite: int
    output_numel: int


def first_nonfinite_module(module: Any, call: Callable[[], Any]) -> NonFiniteOrigin | None:
    """Run ``call`` with forward hooks on every submodule; the first (innermost, earliest) module
    whose floating output holds NaN/Inf, or None when every output stays finite."""
    torch = require("torch")
    found: list[NonFiniteOrigin] = []

    def hook(name: str) -> Callable[[Any, Any, Any], None]:
        def fn(mod: Any, inputs: Any, output: Any) -> None:
            if found:
                return
            outs = [t for t in tensors_in(output) if t.is_floating_point()]
            bad = sum(int((~torch.isfinite(t)).sum()) for t in outs)
            if bad:
                ins = [t for t in tensors_in(inputs) if t.is_floating_point()]
                peak = max((float(t.detach().abs().float().max()) for t in ins if t.numel()), default=float("nan"))
                numel = sum(int(t.numel()) for t in outs)
                found.append(NonFiniteOrigin(name or "(root)", type(mod).__name__, peak, bad, numel))

        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in module.named_modules()]
    try:
        call()
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None


class PrecisionParams(Params):
    dtypes: list[DType] = Field(default=["float16", "bfloat16"], min_length=1)
    samples: int = Field(default=64, ge=2)
    batch_size: int = Field(default=16, ge=1)


class PrecisionGate(Gate):
    min_cosine: dict[str, float] = Field(
        default_factory=lambda: {"float16": 0.999, "bfloat16": 0.99},
        description="per dtype: the smallest cosine(fp32, low precision) of any embedding",
    )
    min_top1_agreement: float = Field(
        default=0.98,
        ge=0.0,
        le=1.0,
        description="top-1 agreement over the confident samples (see min_confident_margin)",
    )
    max_metric_drop: float = Field(
        default=0.02, ge=0.0, description="task metric (fp32 - low precision) over the confident samples, absolute"
    )
    min_confident_margin: float = Field(
        default=0.01,
        ge=0.0,
        description="fp32 margin (best - second-best cosine) from which a decision counts as confident; near-ties "
        "of an untrained or off-domain model flip on rounding noise in any precision and are not gated",
    )


class Precision(Check[PrecisionParams, PrecisionGate]):
    """fp32 vs fp16/bf16 on CPU: cosine drift, top-1 agreement, metric change, first NaN/Inf module."""

    name = "precision"
    step = Step.ENGINE
    requires = (
        frozenset({Capability.TORCH_MODULE, Capability.EMBED_IMAGE}),
        frozenset({Capability.TORCH_MODULE, Capability.EMBED_TEXT}),
    )

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        torch = require("torch")
        target = ctx.target
        module = target.torch_module()
        data = ctx.dataset.sample(p.samples, ctx.seed)
        images = [s.load_image() for s in data] if data.has_images and target.has(Capability.EMBED_IMAGE) else []
        texts = [s.caption or s.text or "" for s in data] if target.has(Capability.EMBED_TEXT) else []
        texts = [t for t in texts if t]
        prompts: list[str] = []
        labels: list[int] = []
        if images and data.has_labels and data.classes and target.has(Capability.EMBED_TEXT):
            prompts = [data.prompt_template.format(c) for c in data.classes]
            labels = [data.classes.index(s.label or "") for s in data]
        reference = self._embed_all(target, images, texts, prompts, p.batch_size)
        for name in p.dtypes:
            dtype = getattr(torch, name)
            with cast_module(module, dtype):
                why_not = self._unsupported(target, images, texts, dtype)
                if why_not:
                    yield self.finding(
                        ctx,
                        Verdict.SKIPPED,
                        f"{name}: not supported by this backend on CPU",
                        message=why_not,
                        evidence={"dtype": name},
                    )
                    continue
                low = self._embed_all(target, images, texts, prompts, p.batch_size)
                finding = self._compare(ctx, name, reference, low, labels, images, texts, module)
            self._add_layer_errors(finding, target, module, dtype, {"image": images, "text": texts, "prompts": prompts})
            yield finding

    @staticmethod
    def _add_layer_errors(
        finding: Finding, target: Target, module: Any, dtype: Any, inputs: dict[str, list[Any]]
    ) -> None:
        """Trace the worst input through every leaf module in fp32 and in ``dtype``; name where error grows.

        Without a NaN the embedding's cosine says only *that* it drifted; the per-module errors say
        where (see :mod:`mmchaos.checks.engine.layer_drift`).
        """
        worst = finding.evidence.get("worst", {})
        kind, idx = worst.get("modality", ""), int(worst.get("index", -1))
        items = inputs.get(kind, [])
        if not 0 <= idx < len(items):
            return
        embed = target.embed_images if kind == "image" else target.embed_texts

        def call() -> Any:
            return embed([items[idx]])

        reference, cut = trace_leaf_modules(module, call)
        with cast_module(module, dtype):
            low, cut_low = trace_leaf_modules(module, call)
        report = layer_errors(reference, low)
        report.update(modality=kind, input_index=idx, truncated=cut or cut_low)
        finding.evidence["layer_error"] = report
        growth = report.get("growth")
        if growth and finding.verdict == Verdict.FAIL and "nonfinite_origin" not in finding.evidence:
            where = (
                f"error grows most at module '{growth['module']}' ({growth['type']}: relative error "
                f"{growth['input_error']:.2g} in, {growth['output_error']:.2g} out)"
            )
            finding.title = f"{finding.title}; {where}"
            finding.message = f"{finding.message}; {where}" if finding.message else where

    @staticmethod
    def _embed_all(
        target: Target, images: list[Any], texts: list[str], prompts: list[str], batch: int
    ) -> dict[str, np.ndarray]:
        def run(fn: Callable[[Sequence[Any]], Any], items: Sequence[Any]) -> np.ndarray:
            parts = [np.asarray(fn(items[i : i + batch]), dtype=np.float32) for i in range(0, len(items), batch)]
            return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)

        out: dict[str, np.ndarray] = {}
        if images:
            out["image"] = run(target.embed_images, images)
        if texts:
            out["text"] = run(target.embed_texts, texts)
        if prompts:
            out["prompts"] = run(target.embed_texts, prompts)
        return out

    @staticmethod
    def _unsupported(target: Target, images: list[Any], texts: list[str], dtype: Any) -> str | None:
        try:
            if images:
                target.embed_images(images[:1])
            if texts:
                target.embed_texts(texts[:1])
        except (RuntimeError, NotImplementedError, TypeError) as exc:
            return f"{type(exc).__name__}: {exc}"[:500]
        return None

    def _compare(
        self,
        ctx: CheckContext,
        name: str,
        ref: dict[str, np.ndarray],
        low: dict[str, np.ndarray],
        labels: list[int],
        images: list[Any],
        texts: list[str],
        module: Any,
    ) -> Finding:
        g = self.gate
        metrics: dict[str, float] = {}
        evidence: dict[str, Any] = {"dtype": name, "seed": ctx.seed, "samples": {k: len(v) for k, v in ref.items()}}
        artifacts: list[Artifact] = []
        nonfinite: dict[str, list[int]] = {}
        worst: tuple[float, str, int] = (2.0, "", -1)
        for kind in ref:
            a, b = ref[kind], low[kind]
            rows_bad = ~np.isfinite(b).all(axis=1)
            nonfinite[kind] = [int(i) for i in np.flatnonzero(rows_bad)]
            metrics[f"{kind}_nonfinite_rows"] = float(rows_bad.sum())
            cos = (l2_normalise(a) * l2_normalise(np.where(np.isfinite(b), b, 0.0))).sum(axis=1)
            cos = np.where(rows_bad, -1.0, cos)
            metrics[f"{kind}_min_cosine"] = float(cos.min())
            metrics[f"{kind}_mean_cosine"] = float(cos.mean())
            i = int(cos.argmin())
            if cos[i] < worst[0]:
                worst = (float(cos[i]), kind, i)
        decisions = self._decisions(ref, low, labels, g.min_confident_margin)
        metrics.update(decisions)
        min_cos = g.min_cosine.get(name, 0.99)
        failures: list[str] = []
        if any(nonfinite.values()):
            origin, kind, idx, what = self._localise(ctx, nonfinite, images, texts, module)
            if origin is not None:
                failures.append(
                    f"NaN/Inf first produced by module '{origin.module}' ({origin.module_type}, input max |x| "
                    f"{origin.input_max_abs:.4g}) for {kind} input #{idx}"
                )
                evidence["nonfinite_origin"] = {
                    "module": origin.module,
                    "module_type": origin.module_type,
                    "input_max_abs": origin.input_max_abs,
                    "nonfinite_values": origin.output_nonfinite,
                    "output_values": origin.output_numel,
                    "modality": kind,
                    "input_index": idx,
                    "input": what,
                }
            else:
                failures.append(f"NaN/Inf in {kind} outputs (no single module localised)")
            evidence["nonfinite_inputs"] = nonfinite
            if kind == "image" and idx < len(images):
                artifacts.append(image_artifact(safe_name(f"{ctx.check_id}-{name}-image-{idx}.png"), images[idx]))
                evidence["input_artifact"] = artifacts[-1].name
        if worst[0] < min_cos:
            failures.append(f"min cosine {worst[0]:.5f} < {min_cos:g} ({worst[1]} #{worst[2]})")
        agree = decisions.get("top1_agreement")
        if agree is not None and agree < g.min_top1_agreement:
            n = int(decisions["confident_samples"])
            failures.append(f"top-1 agreement {agree:.3f} < {g.min_top1_agreement:g} over {n} confident samples")
        drop = decisions.get("metric_drop")
        if drop is not None and drop > g.max_metric_drop:
            failures.append(f"zero-shot accuracy drop {drop:.3f} > {g.max_metric_drop:g}")
        evidence["worst"] = {"modality": worst[1], "index": worst[2], "cosine": worst[0]}
        if worst[1] == "text" and 0 <= worst[2] < len(texts):
            evidence["worst"]["input"] = texts[worst[2]]
        gate = (
            f"finite outputs, min cosine >= {min_cos:g}; over samples with fp32 margin >= "
            f"{g.min_confident_margin:g}: top-1 agreement >= {g.min_top1_agreement:g}, metric drop <= "
            f"{g.max_metric_drop:g}"
        )
        if failures:
            return self.finding(
                ctx,
                Verdict.FAIL,
                f"{name}: " + "; ".join(failures),
                severity=Severity.HIGH
                if any(nonfinite.values()) or (agree is not None and agree < 0.9)
                else Severity.MEDIUM,
                metrics=metrics,
                gate=gate,
                message="; ".join(failures),
                suggestion="keep the named module (or the whole model) in fp32, clamp/rescale its activations, or "
                "prefer bf16 (fp32 range) over fp16",
                evidence=evidence,
                artifacts=artifacts,
            )
        return self.finding(
            ctx,
            Verdict.PASS,
            f"{name}: min cosine {worst[0]:.5f} to fp32"
            + (
                f", top-1 agreement {agree:.3f} over {int(decisions['confident_samples'])} confident samples"
                if agree is not None
                else f", no confident decisions to compare (median fp32 margin {decisions['margin_median']:.2g}; "
                f"max logit deviation {decisions['logit_deviation_max']:.2g})"
            ),
            metrics=metrics,
            gate=gate,
            evidence=evidence,
        )

    @staticmethod
    def _decisions(
        ref: dict[str, np.ndarray], low: dict[str, np.ndarray], labels: list[int], min_margin: float
    ) -> dict[str, float]:
        """Decision agreement judged against each decision's fp32 margin.

        A near-tie (an untrained or off-domain model) flips on rounding noise in any precision, so
        top-1 agreement and the metric change are gated over *confident* samples only: those whose
        fp32 margin (best minus second-best cosine) is at least ``min_margin``. The logit
        deviation itself is reported next to the margins.
        """

        def clean(x: np.ndarray) -> np.ndarray:
            return l2_normalise(np.where(np.isfinite(x), x, 0.0).astype(np.float64))

        def scores(queries: np.ndarray, keys: np.ndarray, exclude_self: bool) -> np.ndarray:
            sims = clean(queries) @ clean(keys).T
            if exclude_self:
                sims = sims - 4.0 * np.eye(len(sims))
            broken = ~np.isfinite(queries).all(axis=1)
            if not np.isfinite(keys).all():
                broken[:] = True
            return np.where(broken[:, None], np.nan, sims)  # a NaN embedding decides nothing

        if "image" in ref and "prompts" in ref:
            pair, exclude = ("image", "prompts"), False
        elif "image" in ref and "text" in ref and len(ref["image"]) == len(ref["text"]):
            pair, exclude = ("text", "image"), False
        else:
            kind = next(iter(ref))
            pair, exclude = (kind, kind), True
        s_ref = scores(ref[pair[0]], ref[pair[1]], exclude)
        s_low = scores(low[pair[0]], low[pair[1]], exclude)
        p_ref = np.nan_to_num(s_ref, nan=-np.inf).argmax(axis=1)
        p_low = np.where(np.isnan(s_low).any(axis=1), -1, np.nan_to_num(s_low, nan=-np.inf).argmax(axis=1))
        top2 = np.sort(np.nan_to_num(s_ref, nan=-np.inf), axis=1)[:, -2:] if s_ref.shape[1] > 1 else None
        margin = (top2[:, 1] - top2[:, 0]) if top2 is not None else np.full(len(s_ref), np.inf)
        deviation = np.nanmax(np.abs(np.where(np.isnan(s_low), np.inf, s_low - s_ref)), axis=1)
        confident = margin >= min_margin
        agree = p_ref == p_low
        out: dict[str, float] = {
            "top1_agreement_all": float(agree.mean()),
            "confident_samples": float(confident.sum()),
            "margin_median": float(np.median(margin[np.isfinite(margin)])) if np.isfinite(margin).any() else 0.0,
            "logit_deviation_max": float(deviation[np.isfinite(deviation)].max())
            if np.isfinite(deviation).any()
            else 0.0,
            "flips_explained_by_margin": float(((~agree) & (2 * deviation >= margin)).sum()),
        }
        if confident.any():
            out["top1_agreement"] = float(agree[confident].mean())
        if labels and pair == ("image", "prompts") and confident.any():
            truth = np.asarray(labels)[confident]
            acc_ref = float((p_ref[confident] == truth).mean())
            acc_low = float((p_low[confident] == truth).mean())
            out.update({"accuracy_fp32": acc_ref, "accuracy_low": acc_low, "metric_drop": acc_ref - acc_low})
        return out

    @staticmethod
    def _localise(
        ctx: CheckContext,
        nonfinite: dict[str, list[int]],
        images: list[Any],
        texts: list[str],
        module: Any,
    ) -> tuple[NonFiniteOrigin | None, str, int, str]:
        """Re-run the first offending input alone under forward hooks; (origin, modality, index, text)."""
        target = ctx.target
        for kind, rows in nonfinite.items():
            if not rows:
                continue
            idx = rows[0]
            if kind == "image":

                def run_image(item: Any = images[idx]) -> Any:
                    return target.embed_images([item])

                origin = first_nonfinite_module(module, run_image)
                return origin, kind, idx, f"image #{idx}"
            if kind == "text":
                text = texts[idx]
            else:
                data = ctx.dataset
                text = data.prompt_template.format(data.classes[idx])

            def run_text(text: str = text) -> Any:
                return target.embed_texts([text])

            origin = first_nonfinite_module(module, run_text)
            return origin, kind, idx, text
        return None, "", -1, ""
