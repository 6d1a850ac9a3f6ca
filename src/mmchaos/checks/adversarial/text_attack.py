"""Step 3: greedy word/character substitutions that change the answer while the meaning is kept.

For each sample the model gets right, :func:`mmchaos.attacks.text.greedy_attack` edits the text
side -- the class prompt of the true class (zero-shot) or the caption used as a query
(text-to-image retrieval) -- with synonyms, homoglyphs and keyboard typos, within a per-sample
query budget, until the image no longer picks the true class (zero-shot) or the caption no
longer retrieves its own image first (retrieval). Reported: attack success rate, mean
substitutions and queries per success, and examples with their substitution sequences (replay
with :func:`mmchaos.attacks.text.replay`). Which meaning constraint ran is in the evidence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, field_validator

from mmchaos.attacks.plan import SampledPlan
from mmchaos.attacks.text import EDIT_KINDS, AttackRecord, MeaningConstraint, greedy_attack
from mmchaos.checks.adversarial._common import sampled
from mmchaos.checks.base import Check, CheckContext, Gate, Params, seeded_rng
from mmchaos.data.base import Dataset
from mmchaos.errors import TargetCallError
from mmchaos.executors import Worker
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import GenerationParams, Message
from mmchaos.tasks.answers import normalised_match
from mmchaos.tasks.base import embed, l2_normalise

__all__ = ["TextAttack", "TextAttackGate", "TextAttackParams"]

TaskName = Literal["auto", "zero_shot", "retrieval_t2i", "vqa"]


class TextAttackParams(Params):
    task: TaskName = Field(
        "auto", description="zero_shot (attack the true class's prompt), retrieval_t2i (attack the caption query) or "
        "vqa (attack a generative VLM's question); auto: zero_shot on labelled images, else retrieval_t2i on "
        "captioned ones, else vqa"
    )  # fmt: skip
    samples: int = Field(32, ge=1, description="samples attacked (seeded, stratified by label)")
    kinds: list[str] = Field(
        default_factory=lambda: list(EDIT_KINDS), description="edit kinds: synonym, homoglyph, typo"
    )
    per_word: int = Field(4, ge=1, description="candidate edits drawn per word at each greedy step")
    max_substitutions: int = Field(2, ge=1, description="words the attack may change (MaxWordsPerturbed)")
    query_budget: int = Field(60, ge=2, description="target queries (texts scored) per sample")
    min_similarity: float = Field(0.9, ge=0.0, le=1.0, description="all-MiniLM similarity the edited text must keep")
    batch_size: int = Field(64, ge=1)
    worst_cases: int = Field(
        5, ge=0, description="successful attacks (most decisive first) recorded with their substitution sequences"
    )

    @field_validator("kinds")
    @classmethod
    def _kinds(cls, v: list[str]) -> list[str]:
        unknown = sorted(set(v) - set(EDIT_KINDS))
        if not v or unknown:
            raise ValueError(f"kinds must be a non-empty subset of {list(EDIT_KINDS)}; unknown: {unknown}")
        return list(dict.fromkeys(v))


class TextAttackGate(Gate):
    max_success_rate: float = Field(0.5, ge=0.0, le=1.0, description="share of correct answers the attack may change")


class _TextScorer:
    """Unit text embeddings through the target, cached by text; a refused text scores +inf (no success)."""

    def __init__(self, target: Target, batch_size: int) -> None:
        self.target = target
        self.batch_size = batch_size
        self.cache: dict[str, npt.NDArray[np.float32] | None] = {}
        self.refused = 0

    def embed(self, texts: Sequence[str]) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
        todo = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if todo:
            try:
                vecs = embed(self.target, "embed_texts", todo, self.batch_size)
                self.cache.update(zip(todo, vecs, strict=True))
            except TargetCallError:  # one refused text must not sink the batch: go one by one
                for t in todo:
                    try:
                        self.cache[t] = l2_normalise(np.asarray(self.target.embed_texts([t]), dtype=np.float32))[0]
                    except TargetCallError:
                        self.cache[t] = None
                        self.refused += 1
        dim = next((v.shape[0] for v in self.cache.values() if v is not None), 1)
        ok = np.array([self.cache[t] is not None for t in texts])
        out = np.stack([v if (v := self.cache[t]) is not None else np.zeros(dim, np.float32) for t in texts])
        return out, ok


class _Answerer:
    """Greedy answers of a generative target to (image, question), cached by (sample, question)."""

    MAX_NEW_TOKENS = 16

    def __init__(self, target: Target, batch_size: int) -> None:
        self.target = target
        self.batch_size = batch_size
        self.answers: dict[tuple[int, str], str] = {}
        self.refused = 0

    def scorer(
        self, image: npt.NDArray[np.uint8], references: list[str], key: int | None = None
    ) -> Callable[[Sequence[str]], npt.NDArray[np.float64]]:
        """Per question: mean token probability of the answer while it is right (>= 0), -1 once it is wrong.

        Without log-probabilities every right answer scores 1: the greedy search then walks by seeded ties.
        """
        sample = id(image) if key is None else key
        params = GenerationParams(max_new_tokens=self.MAX_NEW_TOKENS, logprobs=True)

        def score(questions: Sequence[str]) -> npt.NDArray[np.float64]:
            out = np.empty(len(questions))
            for j in range(0, len(questions), self.batch_size):
                part = list(questions[j : j + self.batch_size])
                requests = [[Message("user", (image, q))] for q in part]
                try:
                    results = self.target.generate_batch(requests, params)
                except TargetCallError:
                    self.refused += len(part)
                    out[j : j + len(part)] = np.inf
                    continue
                for k, (q, r) in enumerate(zip(part, results, strict=True)):
                    self.answers[(sample, q)] = r.text
                    lp = r.logprobs
                    confidence = float(np.exp(np.mean(lp))) if lp else 1.0
                    out[j + k] = confidence if normalised_match(r.text, references) else -1.0
            return out

        return score


class TextAttack(Check[TextAttackParams, TextAttackGate]):
    """Greedy synonym/homoglyph/typo substitutions that change the answer under a meaning-kept constraint."""

    name = "text_attack"
    step = Step.ADVERSARIAL
    requires = (frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT}), frozenset({Capability.GENERATE}))

    def __init__(self, params: TextAttackParams | None = None, gate: TextAttackGate | None = None) -> None:
        super().__init__(params, gate)
        self.constraint = MeaningConstraint(self.params.min_similarity)
        """Replaceable before :meth:`run` (tests inject a sentence embedder here)."""

    def _task(self, data: Dataset, target: Target) -> str | None:
        both = target.has(Capability.EMBED_IMAGE, Capability.EMBED_TEXT)
        fits = {
            "zero_shot": both and data.has_images and data.has_labels and len(data.classes) >= 2,
            "retrieval_t2i": both and data.has_images and data.has_captions and len(data) >= 2,
            "vqa": target.has(Capability.GENERATE) and data.has_images and data.has_questions,
        }
        if self.params.task == "auto":
            return next((name for name, ok in fits.items() if ok), None)
        return self.params.task if fits[self.params.task] else None

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        indices, data = sampled(ctx, p.samples, cap=False)
        task = self._task(data, ctx.target)
        if task is None:
            yield self.finding(
                ctx, Verdict.SKIPPED, f"text attack: the target and dataset do not support task {p.task}",
                message="zero_shot needs labelled images of two or more classes, retrieval_t2i captioned images "
                "(both: a target that embeds images and texts); vqa a generative target and questions about images",
            )  # fmt: skip
            return
        images = None
        if task != "vqa":
            images = embed(ctx.target, "embed_images", [s.load_image() for s in data], p.batch_size)
        plan = _Plan(ctx.check_id, ctx.seed, indices, task, images, self.constraint, tuple(p.kinds), p.per_word,
                     p.max_substitutions, p.query_budget, p.batch_size)  # fmt: skip
        units = [tuple(range(s, min(s + p.batch_size, len(data)))) for s in range(0, len(data), p.batch_size)]
        records: list[tuple[int, AttackRecord]] = []
        answers: dict[tuple[int, str], str] = {}
        refused = 0
        bar = ctx.progress.task(f"{ctx.check_id}: samples", total=len(data))
        try:
            for unit, res in zip(units, ctx.map_units(
                run_text_unit, plan, units, keys=[f"text/{u[0]}+{len(u)}" for u in units], encode=_encode,
                decode=_decode,
            ), strict=True):  # fmt: skip
                records += res.records
                answers.update(res.answers)
                refused += res.refused
                bar.advance(len(unit))
        finally:
            bar.close()
        yield self._finding(ctx, task, data, records, refused, answers)

    def _finding(
        self,
        ctx: CheckContext,
        task: str,
        data: Dataset,
        records: list[tuple[int, AttackRecord]],
        refused: int,
        answers: dict[tuple[int, str], str],
    ) -> Finding:
        p, g = self.params, self.gate
        n = len(records)
        wins = [r for _, r in records if r.success]
        metrics: dict[str, float] = {
            "attacked": float(n),
            "clean_correct_rate": n / len(data) if len(data) else 0.0,
            "attack_success_rate": len(wins) / n if n else 0.0,
            "mean_substitutions_per_success": float(np.mean([len(r.substitutions) for r in wins])) if wins else 0.0,
            "mean_queries_per_success": float(np.mean([r.queries for r in wins])) if wins else 0.0,
            "mean_queries": float(np.mean([r.queries for _, r in records])) if records else 0.0,
            "rejected_by_meaning": float(sum(r.rejected_by_meaning for _, r in records)),
            "refused_texts": float(refused),
        }
        if wins and self.constraint.active:
            metrics["mean_similarity_of_success"] = float(np.mean([r.similarity for r in wins]))
        kinds: dict[str, int] = {}
        for r in wins:
            for sub in r.substitutions:
                kinds[sub.kind] = kinds.get(sub.kind, 0) + 1
        metrics.update({f"edits_{k}": float(v) for k, v in sorted(kinds.items())})
        wins_first = sorted((kv for kv in records if kv[1].success), key=lambda kv: (kv[1].margin, kv[0]))
        examples = [
            {"rank": rank, "sample": data[i].id, "index": i, **r.to_dict(), "severity": len(r.substitutions),
             "clean_text": r.original, "perturbed_text": r.adversarial, "clean_score": round(r.clean_margin, 6),
             "perturbed_score": round(r.margin, 6), "params": [sub.to_dict() for sub in r.substitutions],
             "truth": data[i].label if task == "zero_shot" else data[i].caption if task == "retrieval_t2i"
             else data[i].answer}
            for rank, (i, r) in enumerate(wins_first[: p.worst_cases], 1)
        ]  # fmt: skip
        for example in examples:
            if task == "vqa":
                example["clean_answer"] = answers.get((example["index"], example["original"]), "")
                example["adversarial_answer"] = answers.get((example["index"], example["adversarial"]), "")
        evidence: dict[str, Any] = {
            "attack": "greedy word/character substitution (TextFooler-style, Jin et al. 2020) under a query budget",
            "task": task,
            "text_attacked": {
                "zero_shot": "the true class's prompt",
                "retrieval_t2i": "the caption used as the query",
                "vqa": "the question",
            }[task],
            "success": "zero-shot: the image no longer picks its class; retrieval_t2i: the caption no longer "
            "retrieves its own image first; vqa: the answer is no longer right (normalised match)",
            "meaning_constraint": self.constraint.describe(),
            "kinds": list(p.kinds),
            "max_substitutions": p.max_substitutions,
            "query_budget": p.query_budget,
            "seed": ctx.seed,
            "samples": len(data),
            "replay": "mmchaos.attacks.text.replay(original, substitutions)",
            "perturbation": "text_attack",
            "metric": "margin of the right answer (< 0: changed)",
            "worst_cases": examples,
        }
        gate = f"attack success rate <= {g.max_success_rate}"
        if not n:
            return self.finding(
                ctx, Verdict.SKIPPED, "text attack: no sample is answered correctly, nothing to attack",
                metrics=metrics, evidence=evidence,
            )  # fmt: skip
        asr = metrics["attack_success_rate"]
        title = (
            f"text attack ({task}): {asr:.0%} of {n} correct answers changed, "
            f"{metrics['mean_substitutions_per_success']:.2g} substitutions per success"
        )
        if asr > g.max_success_rate:
            return self.finding(
                ctx, Verdict.FAIL, title, severity=Severity.MEDIUM, metrics=metrics, gate=gate, evidence=evidence,
                message=f"{len(wins)} of {n} answers change under at most {p.max_substitutions} meaning-kept word "
                f"edits ({', '.join(p.kinds)}), within {p.query_budget} queries each",
                suggestion="normalise text before tokenising (NFKC, confusables, spelling correction against the "
                "vocabulary) and train with typo/synonym augmentation",
            )  # fmt: skip
        return self.finding(
            ctx, Verdict.PASS, title, metrics=metrics, gate=gate, evidence=evidence,
            message=f"{len(wins)} of {n} answers changed",
        )  # fmt: skip


def _margin(
    scorer: _TextScorer, image: npt.NDArray[np.float32], rival: float
) -> Callable[[Sequence[str]], npt.NDArray[np.float64]]:
    """Zero-shot: similarity of the image to the edited true prompt minus its best other class."""

    def score(texts: Sequence[str]) -> npt.NDArray[np.float64]:
        emb, ok = scorer.embed(texts)
        return np.where(ok, emb @ image - rival, np.inf).astype(np.float64)

    return score


def _retrieval_margin(
    scorer: _TextScorer, image: npt.NDArray[np.float32], others: npt.NDArray[np.float32]
) -> Callable[[Sequence[str]], npt.NDArray[np.float64]]:
    """Text-to-image: similarity of the edited caption to its image minus its best other image."""

    def score(texts: Sequence[str]) -> npt.NDArray[np.float64]:
        emb, ok = scorer.embed(texts)
        return np.where(ok, emb @ image - (emb @ others.T).max(axis=1), np.inf).astype(np.float64)

    return score


Job = tuple[int, str, Callable[[Sequence[str]], npt.NDArray[np.float64]], float]
"""(position, text attacked, scorer of edited texts, clean margin)."""


@dataclass(frozen=True)
class _Plan(SampledPlan):
    """What every batch of samples shares; sent once to each worker."""

    task: str
    images: npt.NDArray[np.float32] | None
    """Unit image embeddings of the whole sampled set (retrieval ranks against all of them); None for vqa."""
    constraint: MeaningConstraint
    kinds: tuple[str, ...]
    per_word: int
    max_substitutions: int
    query_budget: int
    batch_size: int


@dataclass
class _Batch:
    """The attacks of one batch of samples (those right before the attack), the answers a VQA
    example shows, and the texts the target refused."""

    records: list[tuple[int, AttackRecord]]
    answers: dict[tuple[int, str], str]
    refused: int


def run_text_unit(worker: Worker, plan: _Plan, positions: tuple[int, ...]) -> _Batch:
    """Attack the texts of one batch of samples, each from its own seeded stream ``(run seed, check, sample)``."""
    data = plan.data(worker)
    # One text cache per worker and set: the units of one worker share what they embedded.
    scorer = worker.memo(f"text/{plan.key}/scorer", lambda: _TextScorer(worker.target, plan.batch_size))
    answerer = _Answerer(worker.target, plan.batch_size)
    refused_before = scorer.refused
    if plan.task == "vqa":
        jobs = _vqa_jobs(data, answerer, positions)
    else:
        assert plan.images is not None
        jobs = _jobs(plan.task, data, plan.images, scorer, positions)
    records: list[tuple[int, AttackRecord]] = []
    for i, text, score, clean_margin in jobs:
        if clean_margin < 0:
            continue  # wrong before any attack: nothing to change
        record = greedy_attack(
            text, score, seeded_rng(plan.seed, plan.check_id, "text_attack", i), constraint=plan.constraint,
            kinds=plan.kinds, per_word=plan.per_word, max_substitutions=plan.max_substitutions,
            query_budget=plan.query_budget, clean_margin=clean_margin,
        )  # fmt: skip
        records.append((i, record))
    answers: dict[tuple[int, str], str] = {}
    for i, r in records:
        if r.success:
            for q in (r.original, r.adversarial):
                if (i, q) in answerer.answers:
                    answers[(i, q)] = answerer.answers[(i, q)]
    return _Batch(records, answers, scorer.refused - refused_before + answerer.refused)


def _jobs(
    task: str, data: Dataset, images: npt.NDArray[np.float32], scorer: _TextScorer, positions: Sequence[int]
) -> list[Job]:
    """Per sample of ``positions``: (index, text attacked, scorer of edited texts, clean margin)."""
    jobs: list[Job] = []
    if task == "zero_shot":
        prompts = [data.prompt_template.format(c) for c in data.classes]
        class_emb, _ = scorer.embed(prompts)
        logits = (images @ class_emb.T)[list(positions)]  # the whole product: the same bits on any split
        for row, i in zip(logits, positions, strict=True):
            y = data.classes.index(data[i].label or "")
            rival = float(np.delete(row, y).max())
            jobs.append((i, prompts[y], _margin(scorer, images[i], rival), float(row[y]) - rival))
        return jobs
    captions = [s.caption or "" for s in data]
    cap_emb, _ = scorer.embed(captions)
    sims = cap_emb @ images.T
    for i in positions:
        others = np.delete(images, i, axis=0)
        jobs.append((i, captions[i], _retrieval_margin(scorer, images[i], others),
                     float(sims[i, i] - np.delete(sims[i], i).max())))  # fmt: skip
    return jobs


def _vqa_jobs(data: Dataset, answerer: _Answerer, positions: Sequence[int]) -> list[Job]:
    """Per sample: the question, a scorer (confidence of a right answer, -1 once wrong), its clean score."""
    jobs: list[Job] = []
    for i in positions:
        s = data[i]
        refs = [s.answer or "", *[str(a) for a in s.meta.get("answers", ())]]
        score = answerer.scorer(s.load_image(), refs, key=i)
        jobs.append((i, s.question or "", score, float(score([s.question or ""])[0])))
    return jobs


def _encode(b: _Batch) -> dict[str, Any]:
    return {"records": [[i, r.to_json()] for i, r in b.records],
            "answers": [[i, q, a] for (i, q), a in b.answers.items()], "refused": b.refused}  # fmt: skip


def _decode(body: dict[str, Any]) -> _Batch:
    return _Batch(
        [(int(i), AttackRecord.from_json(r)) for i, r in body["records"]],
        {(int(i), str(q)): str(a) for i, q, a in body["answers"]}, int(body["refused"]),
    )  # fmt: skip
