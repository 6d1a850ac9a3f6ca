"""Step 3: the typographic attack -- a wrong class name written onto each image.

CLIP-style models read text in images (Goh et al. 2021), so a label on the picture can outvote
what it shows. For each image the model classifies correctly (zero-shot), up to
``words_per_image`` wrong class names are rendered onto it (the model's runner-up class first);
the attack succeeds when any of them changes the decision. Reported: attack success rate
(decision changed), targeted rate (decision became the written word: the model *read* it),
gated on the success rate. A model that never saw text may still flip because the label hides
part of the object: the targeted rate tells reading from occlusion.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import Field

from mmchaos.attacks.plan import SampledPlan, decode_image, encode_image
from mmchaos.attacks.typographic import attack_words, render
from mmchaos.checks.adversarial._common import sampled
from mmchaos.checks.base import Check, CheckContext, Gate, Params, seeded_rng
from mmchaos.checks.evidence import image_artifact, safe_name
from mmchaos.executors import Worker
from mmchaos.findings import Artifact, Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability
from mmchaos.tasks.base import embed

__all__ = ["TypographicAttack", "TypographicAttackGate", "TypographicAttackParams"]


class TypographicAttackParams(Params):
    samples: int = Field(32, ge=1, description="labelled images attacked (seeded, stratified by label)")
    severity: int = Field(3, ge=1, le=5, description="size and opacity of the written word (the typographic table)")
    words_per_image: int = Field(2, ge=1, description="wrong class names tried per image (runner-up first)")
    batch_size: int = Field(64, ge=1)
    worst_cases: int = Field(3, ge=0, description="successful attacks saved as clean/attacked images")


class TypographicAttackGate(Gate):
    max_success_rate: float = Field(0.5, ge=0.0, le=1.0, description="share of correct decisions a label may change")
    max_targeted_rate: float | None = Field(
        None, ge=0.0, le=1.0, description="share of decisions that may become the written word (None: reported)"
    )


class TypographicAttack(Check[TypographicAttackParams, TypographicAttackGate]):
    """Attack success rate of wrong class names rendered onto the images (zero-shot)."""

    name = "typographic_attack"
    step = Step.ADVERSARIAL
    requires = (frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT}),)

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p, g = self.params, self.gate
        indices, data = sampled(ctx, p.samples, cap=False)
        if not (data.has_images and data.has_labels and len(data.classes) >= 2):
            yield self.finding(
                ctx, Verdict.SKIPPED, "typographic attack: the dataset has no labelled images of two or more classes",
                message="the attack writes wrong class names onto labelled images",
            )  # fmt: skip
            return
        classes = list(data.classes)
        class_emb = embed(ctx.target, "embed_texts", [data.prompt_template.format(c) for c in classes], p.batch_size)
        truth = np.array([classes.index(s.label or "") for s in data])
        plan = _Plan(ctx.check_id, ctx.seed, indices, class_emb, tuple(int(t) for t in truth), p.severity,
                     p.words_per_image, p.batch_size, p.worst_cases)  # fmt: skip
        units = [tuple(range(s, min(s + p.batch_size, len(data)))) for s in range(0, len(data), p.batch_size)]
        correct: list[int] = []
        flipped: dict[int, _Flip] = {}
        read: set[int] = set()
        queries = 0
        bar = ctx.progress.task(f"{ctx.check_id}: images", total=len(data))
        try:
            for unit, res in zip(units, ctx.map_units(
                run_typographic_unit, plan, units, keys=[f"typographic/{u[0]}+{len(u)}" for u in units],
                encode=_encode, decode=_decode,
            ), strict=True):  # fmt: skip
                correct += res.correct
                flipped.update(res.flipped)
                read.update(res.read)
                queries += res.queries
                bar.advance(len(unit))
        finally:
            bar.close()
        n = len(correct)
        metrics = {
            "clean_accuracy": float(len(correct) / len(data)),
            "attacked": float(n),
            "attack_success_rate": len(flipped) / n if n else 0.0,
            "targeted_rate": len(read) / n if n else 0.0,
            "queries": float(queries),
        }
        worst, artifacts = self._worst(ctx, data, classes, truth, flipped)
        evidence: dict[str, Any] = {
            "attack": "typographic (Goh et al. 2021): wrong class names rendered with the typographic kernel",
            "definition": "success: the zero-shot decision of a correctly classified image changes with any of the "
            "words tried; targeted: it becomes the written word",
            "severity": p.severity,
            "words_per_image": p.words_per_image,
            "samples": len(data),
            "seed": ctx.seed,
            "perturbation": "typographic_attack",
            "metric": "cosine to the true class's prompt",
            "worst_cases": worst,
        }
        gate = f"attack success rate <= {g.max_success_rate}" + (
            f", targeted rate <= {g.max_targeted_rate}" if g.max_targeted_rate is not None else ""
        )
        if not n:
            yield self.finding(
                ctx, Verdict.SKIPPED, "typographic attack: no image is classified correctly, nothing to attack",
                metrics=metrics, evidence=evidence,
            )  # fmt: skip
            return
        asr, tr = metrics["attack_success_rate"], metrics["targeted_rate"]
        title = f"typographic attack: {asr:.0%} of correct decisions changed, {tr:.0%} became the written word"
        broken = asr > g.max_success_rate or (g.max_targeted_rate is not None and tr > g.max_targeted_rate)
        if broken:
            yield self.finding(
                ctx, Verdict.FAIL, title, severity=Severity.HIGH if tr > 0.5 else Severity.MEDIUM,
                metrics=metrics, gate=gate, evidence=evidence, artifacts=artifacts,
                message=f"a wrong class name written on the image changes {len(flipped)} of {n} correct decisions "
                f"(severity {p.severity}, up to {p.words_per_image} words per image)",
                suggestion="mask or ignore rendered text before the image encoder, or fine-tune with typographic "
                "negatives (images labelled with a wrong written word)",
            )  # fmt: skip
            return
        yield self.finding(
            ctx, Verdict.PASS, title, metrics=metrics, gate=gate, evidence=evidence, artifacts=artifacts,
            message=f"{len(flipped)} of {n} correct decisions changed by a written label",
        )  # fmt: skip

    def _worst(
        self,
        ctx: CheckContext,
        data: Any,
        classes: list[str],
        truth: npt.NDArray[Any],
        flipped: dict[int, _Flip],
    ) -> tuple[list[dict[str, Any]], list[Artifact]]:
        """The successful attacks that lowered the true class's score most, with clean/attacked images."""
        records: list[dict[str, Any]] = []
        artifacts: list[Artifact] = []
        chosen = sorted(flipped.items(), key=lambda kv: (-kv[1].drop, kv[0]))[: self.params.worst_cases]
        for rank, (i, flip) in enumerate(chosen, 1):
            assert flip.image is not None  # each batch sends the images of its worst flips, a superset of these
            clean = data[i].load_image()
            stem = safe_name(f"{ctx.check_id}-worst{rank:02d}-{data[i].id}")
            records.append({
                "rank": rank, "sample": data[i].id, "index": i, "truth": classes[int(truth[i])],
                "written": flip.word, "prediction": classes[flip.pred], "severity": self.params.severity,
                "clean_score": round(flip.clean_score, 6), "perturbed_score": round(flip.attacked_score, 6),
                "drop": round(flip.drop, 6), "params": flip.params,
                "clean_output": classes[int(truth[i])], "perturbed_output": classes[flip.pred],
                "clean_artifact": f"{stem}-clean.png", "perturbed_artifact": f"{stem}-attacked.png",
                "side_by_side_artifact": f"{stem}-side-by-side.png",
            })  # fmt: skip
            artifacts += [
                image_artifact(f"{stem}-clean.png", clean),
                image_artifact(f"{stem}-attacked.png", flip.image),
                image_artifact(f"{stem}-side-by-side.png", _pair(clean, flip.image)),
            ]
        return records, artifacts


@dataclass
class _Flip:
    """One image whose decision a written word changed (the word that lowered the truth most)."""

    word: str
    pred: int
    image: npt.NDArray[np.uint8] | None
    """The attacked image (None where the batch did not count it among its worst: not shown)."""
    params: dict[str, Any]
    clean_score: float
    attacked_score: float
    drop: float


@dataclass(frozen=True)
class _Plan(SampledPlan):
    """What every batch of the attack shares; sent once to each worker."""

    class_emb: Any
    """The class prompts' unit embeddings, computed once on the driver."""
    truth: tuple[int, ...]
    severity: int
    words_per_image: int
    batch_size: int
    worst_cases: int


@dataclass
class _Batch:
    """One batch attacked: the positions right before the attack, the flips, the reads, the queries."""

    correct: list[int]
    flipped: dict[int, _Flip]
    read: list[int]
    queries: int


def run_typographic_unit(worker: Worker, plan: _Plan, positions: tuple[int, ...]) -> _Batch:
    """Write wrong class names on one batch of images and score them through the target's public API.

    The batch draws its words and their rendering from its own seeded stream ``(run seed, check,
    severity, batch start)`` (the first batch's is the check's stream of before units, so a set that
    fits one batch is attacked as it always was): a batch's result does not depend on the others.
    """
    data = plan.data(worker)
    classes = list(data.classes)
    class_emb = np.asarray(plan.class_emb)
    images = [data[i].load_image() for i in positions]
    logits = embed(worker.target, "embed_images", images, plan.batch_size) @ class_emb.T
    correct = [i for i, row in zip(positions, logits, strict=True) if int(row.argmax()) == plan.truth[i]]
    attacked: list[tuple[int, str, npt.NDArray[np.uint8], dict[str, Any]]] = []
    stream = [positions[0]] if positions[0] else []
    rng = seeded_rng(plan.seed, plan.check_id, "typographic", plan.severity, *stream)
    for i in correct:
        j = positions.index(i)
        for word in attack_words(logits[j], plan.truth[i], classes, plan.words_per_image, rng):
            image, params = render(images[j], word, plan.severity, rng)
            attacked.append((i, word, image, params))
    rows: list[npt.NDArray[np.float32]] = []
    for start in range(0, len(attacked), plan.batch_size):
        chunk = [a[2] for a in attacked[start : start + plan.batch_size]]
        rows += list(embed(worker.target, "embed_images", chunk, plan.batch_size) @ class_emb.T)
    flipped: dict[int, _Flip] = {}
    read: set[int] = set()
    for (i, word, image, params), row in zip(attacked, rows, strict=True):
        pred, t = int(row.argmax()), plan.truth[i]
        clean_score = float(logits[positions.index(i), t])
        drop = clean_score - float(row[t])
        if pred != t and (i not in flipped or drop > flipped[i].drop):
            flipped[i] = _Flip(word, pred, image, params, clean_score, float(row[t]), drop)
        if classes[pred] == word:
            read.add(i)
    shown = {i for i, _ in sorted(flipped.items(), key=lambda kv: (-kv[1].drop, kv[0]))[: plan.worst_cases]}
    for i, flip in flipped.items():
        if i not in shown:
            flip.image = None
    return _Batch(correct, flipped, sorted(read), len(attacked))


def _encode(b: _Batch) -> dict[str, Any]:
    flips = {
        str(i): {"word": f.word, "pred": f.pred, "image": None if f.image is None else encode_image(f.image),
                 "params": f.params, "clean": f.clean_score, "attacked": f.attacked_score, "drop": f.drop}
        for i, f in b.flipped.items()
    }  # fmt: skip
    return {"correct": b.correct, "flipped": flips, "read": b.read, "queries": b.queries}


def _decode(body: dict[str, Any]) -> _Batch:
    flipped = {
        int(i): _Flip(f["word"], int(f["pred"]), None if f["image"] is None else decode_image(f["image"]),
                      dict(f["params"]), float(f["clean"]), float(f["attacked"]), float(f["drop"]))
        for i, f in body["flipped"].items()
    }  # fmt: skip
    return _Batch([int(i) for i in body["correct"]], flipped, [int(i) for i in body["read"]], int(body["queries"]))


def _pair(a: npt.NDArray[np.uint8], b: npt.NDArray[np.uint8], gap: int = 4) -> npt.NDArray[np.uint8]:
    """Clean (left) and attacked (right) on one white canvas."""
    h = max(a.shape[0], b.shape[0])
    canvas = np.full((h, a.shape[1] + gap + b.shape[1], 3), 255, np.uint8)
    canvas[: a.shape[0], : a.shape[1]] = a[..., :3]
    canvas[: b.shape[0], a.shape[1] + gap :] = b[..., :3]
    return canvas
