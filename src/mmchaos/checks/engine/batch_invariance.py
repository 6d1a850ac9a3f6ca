"""Step 4: a sample's output must not depend on what else is in its batch.

Each sample is run alone, then inside batches of other samples (different text lengths, so the
padding differs; images of other sizes, so a processor that pads to the largest shows it; batch
sizes from the parameters) at a random position, and, at the smallest batch size, inside other,
differently composed batches of that size. Embeddings are compared by cosine, transcriptions exactly; the top-1 decision
(nearest reference of the other modality, or the transcription) must agree. Targets that expose
their tokenizer are also run with the other padding side, to say whether the side they use is
the one that keeps outputs invariant.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from pydantic import Field

from mmchaos.checks.base import ANY_MODALITY, Check, CheckContext, Gate, Params
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability
from mmchaos.targets.wrappers import unwrap
from mmchaos.tasks.base import l2_normalise

__all__ = ["BatchInvariance"]


class BatchInvarianceParams(Params):
    samples: int = Field(default=32, ge=2)
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 2, 7, 32])
    long_filler_words: int = Field(
        default=24, ge=0, description="a long filler text of this many words joins every text batch"
    )
    neighbour_sizes: list[tuple[int, int]] = Field(
        default_factory=lambda: [(48, 80), (128, 96), (200, 40)],
        description="(height, width) the other images of a batch are resized to; empty keeps them as they are",
    )
    compositions: int = Field(
        default=2, ge=1, le=8, description="differently composed batches at the smallest batch size above 1"
    )
    padding_sides: bool = Field(default=True, description="also try the other tokenizer padding side, when exposed")


class BatchInvarianceGate(Gate):
    max_cosine_deviation: float = Field(default=1e-4, ge=0.0, description="max of 1 - cos(alone, batched)")
    min_top1_agreement: float = Field(default=1.0, ge=0.0, le=1.0)


class BatchInvariance(Check[BatchInvarianceParams, BatchInvarianceGate]):
    """Alone vs inside heterogeneous batches: max cosine deviation and top-1 agreement."""

    name = "batch_invariance"
    step = Step.ENGINE
    requires = ANY_MODALITY

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        data = ctx.dataset.sample(p.samples, ctx.seed)
        target = ctx.target
        images = [s.load_image() for s in data] if data.has_images else []
        texts = [s.caption for s in data if s.caption] or [s.text for s in data if s.text] or []
        texts = [t for t in texts if t]
        if p.long_filler_words and texts:
            words = " ".join(texts).split()
            filler = " ".join((words * (p.long_filler_words // max(1, len(words)) + 1))[: p.long_filler_words])
        else:
            filler = None
        probes: list[tuple[str, Capability, list[Any], Callable[[Sequence[Any]], Any], Any]] = []
        if target.has(Capability.EMBED_IMAGE) and images:
            probes.append(("image", Capability.EMBED_IMAGE, images, target.embed_images, None))
        if target.has(Capability.EMBED_TEXT) and texts:
            probes.append(("text", Capability.EMBED_TEXT, texts, target.embed_texts, filler))
        if target.has(Capability.READ_TEXT) and images:
            probes.append(("read_text", Capability.READ_TEXT, images, target.read_text, None))
        neighbours = _resized_neighbours(images, p.neighbour_sizes) if images else []
        if not probes:
            yield self.finding(
                ctx, Verdict.SKIPPED, "no inputs of a modality the target handles", message=str(data.describe())
            )
            return
        bar = ctx.progress.task(f"{ctx.check_id}: batches", total=len(probes) * len(p.batch_sizes))
        try:
            references = self._references(target, images, texts)
            padding: tuple[Finding | None, dict[str, float], dict[str, Any]] = (None, {}, {})
            if p.padding_sides and target.has(Capability.EMBED_TEXT) and texts:
                padding = self._padding_sides(ctx, texts, filler)
            for kind, _cap, items, fn, extra in probes:
                others = neighbours if kind != "text" and neighbours else None
                finding = self._probe(ctx, kind, items, fn, extra, references, bar, others)
                if kind == "text":  # the padding-side measurements travel with the text finding's evidence
                    finding.evidence.update(padding[2])
                yield finding
            if padding[0] is not None:
                yield padding[0]
        finally:
            bar.close()

    @staticmethod
    def _references(target: Any, images: list[Any], texts: list[str]) -> dict[str, np.ndarray]:
        """Reference embeddings of the other modality (computed alone) for top-1 decisions."""
        refs: dict[str, np.ndarray] = {}
        if target.has(Capability.EMBED_IMAGE, Capability.EMBED_TEXT) and images and texts:
            refs["image"] = l2_normalise(np.concatenate([target.embed_texts([t]) for t in texts]))
            refs["text"] = l2_normalise(np.concatenate([target.embed_images([i]) for i in images]))
        return refs

    def _probe(
        self,
        ctx: CheckContext,
        kind: str,
        items: list[Any],
        fn: Callable[[Sequence[Any]], Any],
        filler: Any,
        references: dict[str, np.ndarray],
        bar: Any,
        neighbours: list[Any] | None = None,
    ) -> Finding:
        p = self.params
        g = self.gate
        rng = ctx.rng(kind)
        alone = [fn([x])[0] for x in items]
        worst: dict[str, Any] = {"deviation": -1.0}
        metrics: dict[str, float] = {}
        disagreements = 0
        comparisons = 0
        composition_dev = 0.0
        for b in p.batch_sizes:
            runs = p.compositions if b == min((s for s in p.batch_sizes if s > 1), default=0) else 1
            first: list[Any] = []
            metrics[f"max_deviation_b{b}"] = 0.0
            for c in range(runs):
                outputs, batches = self._batched(items, fn, b, filler, rng, neighbours)
                devs, agree = self._compare(kind, alone, outputs, references.get(kind))
                comparisons += len(items)
                disagreements += int((~agree).sum())
                metrics[f"max_deviation_b{b}"] = max(metrics[f"max_deviation_b{b}"], float(devs.max()))
                metrics[f"top1_agreement_b{b}"] = min(metrics.get(f"top1_agreement_b{b}", 1.0), float(agree.mean()))
                i = int(devs.argmax())
                if devs[i] > worst["deviation"]:
                    worst = {
                        "deviation": float(devs[i]),
                        "batch_size": b,
                        "composition": c,
                        "sample": i,
                        "batch": batches[i],
                    }
                if c == 0:
                    first = outputs
                else:
                    cdevs, _ = self._compare(kind, first, outputs, None)
                    composition_dev = max(composition_dev, float(cdevs.max()))
            bar.advance()
        metrics["max_deviation"] = max(metrics[f"max_deviation_b{b}"] for b in p.batch_sizes)
        metrics["max_composition_deviation"] = composition_dev
        metrics["top1_agreement"] = 1.0 - disagreements / max(1, comparisons)
        unit = "1 - cosine" if kind != "read_text" else "character error rate"
        ok = metrics["max_deviation"] <= g.max_cosine_deviation and metrics["top1_agreement"] >= g.min_top1_agreement
        gate = f"max {unit} <= {g.max_cosine_deviation:g} and top-1 agreement >= {g.min_top1_agreement:g}"
        evidence = {
            "modality": kind,
            "samples": len(items),
            "batch_sizes": list(p.batch_sizes),
            "compositions": p.compositions,
            "neighbour_sizes": [list(s) for s in p.neighbour_sizes] if neighbours else [],
            "seed": ctx.seed,
            "worst": worst,
            "deviation_unit": unit,
            "filler_text": filler,
        }
        if ok:
            return self.finding(
                ctx,
                Verdict.PASS,
                f"{kind}: batched outputs match alone (max deviation {metrics['max_deviation']:.1e})",
                metrics=metrics,
                gate=gate,
                evidence=evidence,
            )
        return self.finding(
            ctx,
            Verdict.FAIL,
            f"{kind}: output depends on the batch (max deviation {metrics['max_deviation']:.2e} at batch size "
            f"{worst['batch_size']}, top-1 agreement {metrics['top1_agreement']:.3f})",
            severity=Severity.HIGH if metrics["top1_agreement"] < 1.0 else Severity.MEDIUM,
            metrics=metrics,
            gate=gate,
            message=f"sample {worst['sample']} in batch {worst['batch']} deviates by {worst['deviation']:.3g}",
            suggestion="mask padding (attention_mask) and pool only real tokens; pin batch-invariant kernels; "
            "pad on the side the model was trained with",
            evidence=evidence,
        )

    @staticmethod
    def _batched(
        items: list[Any],
        fn: Callable[[Sequence[Any]], Any],
        size: int,
        filler: Any,
        rng: np.random.Generator,
        neighbours: list[Any] | None = None,
    ) -> tuple[list[Any], list[list[int]]]:
        """Every item once inside a batch of ``size`` (others drawn at random), at a random slot.

        ``neighbours[j]`` stands in for item ``j`` when it is another item's batch mate (e.g. the
        same picture at another size). Returns each item's output and the batch it ran in, as item
        indices (-1 = filler).
        """
        n = len(items)
        outputs: list[Any] = [None] * n
        batches: list[list[int]] = [[] for _ in range(n)]
        for i in range(n):
            others = [int(j) for j in rng.permutation(n) if j != i][: max(0, size - 1)]
            if filler is not None and size > 1 and others:
                others[0] = -1
            members = list(others)
            members.insert(int(rng.integers(0, len(members) + 1)), i)
            mates = neighbours if neighbours is not None else items
            batch = [items[j] if j == i else filler if j == -1 else mates[j] for j in members]
            out = fn(batch)
            outputs[i] = out[members.index(i)]
            batches[i] = members
        return outputs, batches

    def _padding_sides(
        self, ctx: CheckContext, texts: list[str], filler: Any
    ) -> tuple[Finding | None, dict[str, float], dict[str, Any]]:
        """Alone vs padded batches under the tokenizer's padding side and under the other one.

        Returns a failing finding when the side in use breaks invariance (else None), and the
        measurements, which join the text finding either way.
        """

        g = self.gate
        inner = unwrap(ctx.target)
        tok = getattr(inner, "tokenizer", None)
        side = getattr(tok, "padding_side", None)
        if tok is None or side not in ("left", "right"):
            return None, {}, {}
        batch = [*texts[:7], filler] if filler else texts[:8]
        n = len(batch)
        other = "left" if side == "right" else "right"

        def deviation() -> float:
            alone = np.concatenate([np.asarray(ctx.target.embed_texts([t]), np.float32) for t in batch])
            together = np.asarray(ctx.target.embed_texts(batch), np.float32)
            devs, _ = self._compare("text", list(alone), list(together), None)
            return float(devs[: n - 1 if filler else n].max())

        deviations: dict[str, float] = {side: deviation()}  # the tokenizer as shipped
        # The other side is measured on a copy: the shipped tokenizer object is never changed.
        try:
            twin = copy.deepcopy(tok)
            twin.padding_side = other
        except Exception:  # a tokenizer that cannot be copied: report the shipped side only
            twin = None
        if twin is not None:
            inner.tokenizer = twin  # type: ignore[attr-defined]
            try:
                deviations[other] = deviation()
            finally:
                inner.tokenizer = tok  # type: ignore[attr-defined]
        metrics = {f"max_deviation_{s}_padding": d for s, d in deviations.items()}
        other_dev = deviations.get(other)
        if other_dev is None:
            note = f"{other} padding not measured (the tokenizer cannot be copied)"
        elif other_dev > g.max_cosine_deviation:
            note = f"{other} padding would change outputs by {other_dev:.1e}: keep {side!r}"
        else:
            note = f"{other} padding is invariant too"
        measured = {
            "padding_side": side,
            "padding_side_note": note,
            "padding_deviation": deviations,
            "other_side_measured_on": "a copy of the tokenizer (the shipped one is unchanged)",
        }
        evidence = {"modality": "text_padding_side", "padding_side": side, "batch": batch, "seed": ctx.seed}
        gate = f"with padding_side={side!r}: max 1 - cosine <= {g.max_cosine_deviation:g}"
        if deviations[side] > g.max_cosine_deviation:
            fix = (
                f"; padding_side={other!r} would keep it invariant (deviation {other_dev:.1e})"
                if other_dev is not None and other_dev <= g.max_cosine_deviation
                else ""
            )
            failure = self.finding(
                ctx,
                Verdict.FAIL,
                f"text: padding on the {side} changes outputs (max deviation {deviations[side]:.2e}){fix}",
                severity=Severity.HIGH,
                metrics=metrics,
                gate=gate,
                message=f"padding_side={side!r}: a text padded inside a batch embeds differently from alone",
                suggestion=f"pad on the side the model was trained with{fix and ' (' + other + ')'}; or pass "
                "position ids that skip the padding",
                evidence=evidence,
            )
            return failure, metrics, measured
        return None, metrics, measured

    @staticmethod
    def _compare(
        kind: str, alone: list[Any], batched: list[Any], reference: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        if kind == "read_text":
            from mmchaos.tasks.ocr_metrics import cer

            devs = np.array([cer(b, a) if a or b else 0.0 for a, b in zip(alone, batched, strict=True)])
            agree = np.array([a == b for a, b in zip(alone, batched, strict=True)])
            return devs, agree
        a = l2_normalise(np.asarray(alone, dtype=np.float32))
        b = l2_normalise(np.asarray(batched, dtype=np.float32))
        finite = np.isfinite(a).all(axis=1) & np.isfinite(b).all(axis=1)
        devs = np.where(finite, 1.0 - (a * b).sum(axis=1).astype(np.float64), np.inf)
        if reference is None:
            # No other modality to decide against: each batched output must still be nearest its
            # own alone output among all alone outputs.
            agree = (b @ a.T).argmax(axis=1) == np.arange(len(a))
        else:
            agree = (a @ reference.T).argmax(axis=1) == (b @ reference.T).argmax(axis=1)
        return np.maximum(devs, 0.0), agree & finite


def _resized_neighbours(images: list[Any], sizes: list[tuple[int, int]]) -> list[Any]:
    """Each image at another size (cycled through ``sizes``), to make batches heterogeneous."""
    if not sizes:
        return []
    from PIL import Image

    out = []
    for j, img in enumerate(images):
        h, w = sizes[j % len(sizes)]
        out.append(np.asarray(Image.fromarray(np.ascontiguousarray(img)).resize((w, h), Image.Resampling.BILINEAR)))
    return out
