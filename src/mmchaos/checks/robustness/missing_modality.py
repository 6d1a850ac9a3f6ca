"""Step 2: blank, uniform and empty inputs must not crash the target or come back as NaN.

Each probe is sent alone and next to a normal input of the same modality (one bad item must not
poison its batch neighbour). A reader that transcribes text from a blank image is reporting
garbage, and fails too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from pydantic import Field

from mmchaos.checks.base import ANY_MODALITY, Check, CheckContext, CheckGate, Params
from mmchaos.checks.evidence import image_artifact, safe_name
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability

__all__ = ["MissingModality"]


def blank_images(size: int) -> dict[str, np.ndarray]:
    return {
        "black_image": np.zeros((size, size, 3), np.uint8),
        "white_image": np.full((size, size, 3), 255, np.uint8),
        "gray_image": np.full((size, size, 3), 128, np.uint8),
    }


BLANK_TEXTS = {"empty_text": "", "whitespace_text": "   \t\n ", "single_space_text": " "}


class MissingModalityParams(Params):
    image_size: int = Field(224, ge=1, le=4096, description="side of the blank images")


class MissingModality(Check[MissingModalityParams, CheckGate]):
    """Blank/uniform images and empty/whitespace texts: no crash, no NaN, no invented text."""

    name = "missing_modality"
    step = Step.ROBUSTNESS
    requires = ANY_MODALITY
    Params = MissingModalityParams

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        target = ctx.target
        sample = ctx.dataset[0] if len(ctx.dataset) else None
        normal_image = sample.load_image() if sample is not None and ctx.dataset.has_images else None
        normal_text = (sample.caption or sample.text or "a photo") if sample is not None else "a photo"
        probes: list[tuple[str, Any, Callable[[Sequence[Any]], Any], Any, str]] = []
        for name, img in blank_images(p.image_size).items():
            if target.has(Capability.EMBED_IMAGE):
                probes.append((name, img, target.embed_images, normal_image, "embed"))
            if target.has(Capability.READ_TEXT):
                probes.append((name, img, target.read_text, normal_image, "read"))
        if target.has(Capability.EMBED_TEXT):
            for name, text in BLANK_TEXTS.items():
                probes.append((name, text, target.embed_texts, normal_text, "embed"))
        bar = ctx.progress.task(f"{ctx.check_id}: probes", total=len(probes))
        try:
            for name, value, fn, neighbour, kind in probes:
                yield self._probe(ctx, name, value, fn, neighbour, kind)
                bar.advance()
        finally:
            bar.close()

    def _probe(
        self, ctx: CheckContext, name: str, value: Any, fn: Callable[[Sequence[Any]], Any], neighbour: Any, kind: str
    ) -> Finding:
        label = f"{kind}:{name}"
        is_image = isinstance(value, np.ndarray)
        artifacts = [image_artifact(safe_name(f"{ctx.check_id}-{name}.png"), value)] if is_image else []
        evidence: dict[str, Any] = {"probe": name, "call": fn.__name__, "input": "" if is_image else value}
        if is_image:
            evidence["input_artifact"] = artifacts[0].name
            evidence["shape"] = list(value.shape)
        try:
            alone = fn([value])
            pair = fn([value, neighbour]) if neighbour is not None else None
        except Exception as exc:  # the point of the check: any exception is a finding
            return self.finding(
                ctx,
                Verdict.FAIL,
                f"{label}: the target raised {type(exc).__name__}",
                severity=Severity.HIGH,
                metrics={"crashed": 1.0},
                gate="no exception",
                message=f"{type(exc).__name__}: {exc}"[:500],
                suggestion="handle missing/blank inputs explicitly: reject with a typed error or embed a "
                "defined placeholder",
                evidence=evidence,
                artifacts=artifacts,
            )
        if kind == "read":
            text = str(alone[0]) if len(alone) else ""
            evidence["output"] = text
            invented = bool(text.strip())
            if invented:
                return self.finding(
                    ctx,
                    Verdict.FAIL,
                    f"{label}: the reader invents text on a blank image ({text[:40]!r})",
                    severity=Severity.MEDIUM,
                    metrics={"crashed": 0.0, "invented_chars": float(len(text.strip()))},
                    gate="no exception and no text read from a blank image",
                    suggestion="raise the recognition score threshold, or reject low-contrast inputs",
                    evidence=evidence,
                    artifacts=artifacts,
                )
            return self.finding(
                ctx,
                Verdict.PASS,
                f"{label}: no crash, no invented text",
                metrics={"crashed": 0.0},
                gate="no exception",
                evidence=evidence,
            )
        arr = np.asarray(alone, dtype=np.float64)
        nonfinite = int((~np.isfinite(arr)).sum())
        pair_nonfinite = int((~np.isfinite(np.asarray(pair, dtype=np.float64))).sum()) if pair is not None else 0
        norm = float(np.linalg.norm(arr[0])) if arr.ndim == 2 and arr.shape[0] else 0.0
        metrics = {
            "crashed": 0.0,
            "nonfinite_values": float(nonfinite),
            "nonfinite_in_batch": float(pair_nonfinite),
            "norm": norm if np.isfinite(norm) else -1.0,
        }
        bad_shape = arr.ndim != 2 or arr.shape[0] != 1
        if nonfinite or pair_nonfinite or bad_shape or norm == 0.0:
            if bad_shape:
                why = "wrong output shape"
            elif nonfinite:
                why = "NaN/Inf in the embedding"
            elif pair_nonfinite:
                why = "NaN/Inf in the batch that holds it"
            else:
                why = "an all-zero embedding"
            return self.finding(
                ctx,
                Verdict.FAIL,
                f"{label}: {why}",
                severity=Severity.HIGH,
                metrics=metrics,
                gate="finite, non-zero embedding of shape (1, D), neighbour unaffected",
                suggestion="guard normalisations against zero variance/length; reject empty inputs upstream",
                evidence=evidence,
                artifacts=artifacts,
            )
        return self.finding(
            ctx,
            Verdict.PASS,
            f"{label}: finite embedding, batch neighbour unaffected",
            metrics=metrics,
            gate="finite, non-zero embedding of shape (1, D), neighbour unaffected",
            evidence=evidence,
        )
