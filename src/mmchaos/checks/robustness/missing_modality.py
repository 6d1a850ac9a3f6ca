"""Step 2: blank, uniform and empty inputs must not crash the target or come back as NaN.

Each probe is sent alone and next to a normal input of the same modality (one bad item must not
poison its batch neighbour). A reader that transcribes text from a blank image is reporting
garbage, and fails too. A generative target (VLM) is asked about blank and absent images and must
abstain rather than describe what is not there (see :mod:`.missing_vlm`); an image-only request
must not crash it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from pydantic import Field

from mmchaos.checks.base import ANY_MODALITY, Check, CheckContext, Gate, Params
from mmchaos.checks.evidence import image_artifact, safe_name
from mmchaos.checks.robustness.missing_vlm import Answer, VLMProbe, ask_one, probe_questions, vlm_probes
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
    questions: int = Field(4, ge=1, le=32, description="generative targets: questions asked about each blank image")
    max_new_tokens: int = Field(24, ge=1, le=512, description="generative targets: answer length limit")


class MissingModalityGate(Gate):
    max_hallucination_rate: float = Field(
        0.25, ge=0.0, le=1.0, description="share of questions about a blank/absent image answered as if it held content"
    )
    confident_at: float = Field(
        0.5, gt=0.0, le=1.0, description="mean token probability from which a hallucination counts as confident"
    )


class MissingModality(Check[MissingModalityParams, MissingModalityGate]):
    """Blank/uniform images and empty/whitespace texts: no crash, no NaN, no invented text or answer."""

    name = "missing_modality"
    step = Step.ROBUSTNESS
    requires = (*ANY_MODALITY, frozenset({Capability.GENERATE}))

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
        generative: list[VLMProbe] = []
        if target.has(Capability.GENERATE):
            generative = list(vlm_probes(blank_images(p.image_size), probe_questions(ctx.dataset, p.questions)))
        bar = ctx.progress.task(f"{ctx.check_id}: probes", total=len(probes) + len(generative) + bool(generative))
        try:
            for name, value, fn, neighbour, kind in probes:
                yield self._probe(ctx, name, value, fn, neighbour, kind)
                bar.advance()
            for probe in generative:
                yield self._ask(ctx, probe)
                bar.advance()
            if generative:
                yield self._image_only(
                    ctx, normal_image if normal_image is not None else blank_images(32)["gray_image"]
                )
                bar.advance()
        finally:
            bar.close()

    def _ask(self, ctx: CheckContext, probe: VLMProbe) -> Finding:
        """Questions about a blank or absent image: abstain, do not describe what is not there."""
        p, g = self.params, self.gate
        label = f"generate:{probe.name}"
        content_of = (lambda q: (probe.image, q)) if probe.image is not None else (lambda q: (q,))
        answers = [ask_one(ctx.target, content_of(q), q, p.max_new_tokens) for q in probe.questions]
        artifacts = [] if probe.image is None else [image_artifact(safe_name(f"{ctx.check_id}-{probe.name}.png"),
                                                                   probe.image)]  # fmt: skip
        evidence: dict[str, Any] = {"probe": probe.name, "call": "generate", "answers": [a.record() for a in answers]}
        if artifacts:
            evidence["input_artifact"] = artifacts[0].name
        crashed = [a for a in answers if a.crashed]
        if crashed:
            return self.finding(
                ctx, Verdict.FAIL, f"{label}: the target raised {type(crashed[0].error).__name__}",
                severity=Severity.HIGH, metrics={"crashed": float(len(crashed))}, gate="no exception",
                message=f"{type(crashed[0].error).__name__}: {crashed[0].error}"[:500],
                suggestion="handle a missing or blank image explicitly: answer that there is nothing to see, or "
                "reject with a typed error", evidence=evidence, artifacts=artifacts,
            )  # fmt: skip
        metrics = _hallucination_metrics(answers, g.confident_at)
        answered = sum(a.error is None for a in answers)
        if answered and "confident_hallucination_rate" not in metrics:
            evidence["logprobs"] = {"asked": answered, "given": 0, "note": "the server gave no logprobs for "
                                    "these answers: how confident a hallucination was is not measured"}  # fmt: skip
        gate = f"hallucination rate <= {g.max_hallucination_rate} (answers that are not abstentions)"
        what = "a blank image" if probe.image is not None else "no image"
        if metrics["hallucination_rate"] > g.max_hallucination_rate:
            worst = next(a for a in answers if a.hallucinated)
            return self.finding(
                ctx, Verdict.FAIL,
                f"{label}: {metrics['hallucination_rate']:.0%} of questions about {what} answered as if it held "
                f"content (e.g. {worst.question!r} -> {worst.text[:40]!r})",
                severity=Severity.MEDIUM, metrics=metrics, gate=gate,
                suggestion="train or prompt the model to say when the image holds nothing (none-class answers), "
                "or detect blank/missing images before the model", evidence=evidence, artifacts=artifacts,
            )  # fmt: skip
        rate = metrics["hallucination_rate"]
        return self.finding(
            ctx, Verdict.PASS, f"{label}: abstains about {what} (hallucination rate {rate:.0%})",
            metrics=metrics, gate=gate, evidence=evidence,
        )  # fmt: skip

    def _image_only(self, ctx: CheckContext, image: np.ndarray) -> Finding:
        """A request with an image and no text: an answer or a typed refusal, never a crash."""
        answer: Answer = ask_one(ctx.target, (image,), "", self.params.max_new_tokens)
        evidence: dict[str, Any] = {"probe": "image_only", "call": "generate", **answer.record()}
        evidence.pop("question")
        if answer.crashed:
            return self.finding(
                ctx, Verdict.FAIL, f"generate:image_only: the target raised {type(answer.error).__name__}",
                severity=Severity.HIGH, metrics={"crashed": 1.0}, gate="an answer or a typed refusal",
                message=f"{type(answer.error).__name__}: {answer.error}"[:500],
                suggestion="accept a user turn that holds only an image (the chat template and processor must "
                "not assume a text part), or reject it with a typed error", evidence=evidence,
            )  # fmt: skip
        how = f"refused cleanly ({getattr(answer.error, 'code', '')})" if answer.refused else "answered"
        return self.finding(
            ctx, Verdict.PASS, f"generate:image_only: {how}, no crash", metrics={"crashed": 0.0},
            gate="an answer or a typed refusal", evidence=evidence,
        )  # fmt: skip

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


def _hallucination_metrics(answers: list[Answer], confident_at: float) -> dict[str, float]:
    """Rates over the questions asked: hallucinated (not an abstention), confident ones, refusals."""
    n = max(1, len(answers))
    hallucinated = [a for a in answers if a.hallucinated]
    confident = [a for a in hallucinated if a.confidence is not None and a.confidence >= confident_at]
    metrics = {
        "crashed": 0.0,
        "questions": float(len(answers)),
        "hallucination_rate": len(hallucinated) / n,
        "refusal_rate": sum(a.refused for a in answers) / n,
        "abstention_rate": sum(a.error is None and not a.hallucinated for a in answers) / n,
    }
    if any(a.confidence is not None for a in answers):
        metrics["confident_hallucination_rate"] = len(confident) / n
    return metrics
