"""The image attacks as executor work units, and the functions that run them on a worker.

An attack is cut into units of one batch of same-shape samples at one eps: PGD (white-box),
Square Attack (black-box, and the white-box check's masking comparison) and transfer (PGD on a
surrogate, replayed on the target). A unit names its samples by position in the attacked set and
carries its own seed (and, for a query attack, its own share of the query budget), so its result
does not depend on where or in what order it ran. A unit returns what the driver aggregates:
per-sample verdicts, counts, and the adversarial images of the samples it flipped (the worst
cases are drawn from them), all as JSON values for the run store's journal.

Everything a worker needs from the driver travels in the plan (sent once per map): the judge's
reference embeddings and truths (:class:`JudgeState`), so a worker never asks the target for
them again, and a black-box run sends exactly the queries it booked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmchaos._lazy import require
from mmchaos.attacks.gradient import AttackConfig, pgd
from mmchaos.attacks.judge import Judge, JudgeState
from mmchaos.attacks.losses import embedding_shift_loss, retrieval_loss, unit_tensor, zero_shot_loss
from mmchaos.attacks.plan import ImageArray, SampledPlan, UnitWorker, by_shape, decode_image, encode_image
from mmchaos.attacks.preprocess import ImagePath, image_path, to_images, to_tensor
from mmchaos.attacks.query import QueryBudget, square_attack
from mmchaos.errors import TargetCallError
from mmchaos.targets.wrappers import as_model_call

__all__ = [
    "AttackPlan",
    "PgdOutcome",
    "PgdResult",
    "PgdUnit",
    "SquareUnit",
    "SquareUnitResult",
    "TransferUnit",
    "decode_pgd",
    "decode_square",
    "encode_pgd",
    "encode_square",
    "pgd_units",
    "run_pgd_unit",
    "run_square_unit",
    "run_transfer_unit",
]


@dataclass(frozen=True)
class AttackPlan(SampledPlan):
    """What every unit of one attack shares; sent once to each worker."""

    judge: JudgeState | None
    batch_size: int
    clean_ok: tuple[bool, ...] = ()
    """Per attacked sample: right before any attack (flipped images are returned only for these)."""
    prepared: bool = False
    """Attack the target's prepared inputs (its image path's ``prepare``), not the uploaded images."""
    loss: str = "margin"
    surrogate: str | None = None
    """Transfer: the surrogate's target URI (loaded once per worker)."""
    surrogate_loss: str = ""
    """Transfer: ``zero_shot`` (class prompts on the surrogate) or ``shift`` (task-free)."""
    configs: dict[float, AttackConfig] = field(default_factory=dict)
    """Gradient attacks: the attack at each eps level (grey levels)."""
    local_surrogate: tuple[Any, ImagePath] | None = field(default=None, compare=False)
    """Transfer run in this process: the surrogate the driver loaded (never sent to a remote worker)."""


@dataclass(frozen=True)
class PgdUnit:
    """PGD at one eps on one batch of same-shape samples (positions in the attacked set)."""

    level: float
    positions: tuple[int, ...]
    seed: int
    """The seed of this batch's random start."""

    @property
    def key(self) -> str:
        return f"pgd/eps{self.level:g}/{self.positions[0]}+{len(self.positions)}"


TransferUnit = PgdUnit
"""Transfer units are PGD units (crafted on the surrogate instead of the target)."""


@dataclass(frozen=True)
class SquareUnit:
    """Square Attack at one eps on one batch, within its own share of the query budget."""

    tag: str
    level: float
    positions: tuple[int, ...]
    seed: int
    queries_per_image: int
    allotment: int
    """Queries this unit may send: the budget is split up front, in unit order."""
    p_init: float = 0.1

    @property
    def key(self) -> str:
        return f"{self.tag}/eps{self.level:g}/{self.positions[0]}+{len(self.positions)}"


@dataclass
class PgdResult:
    """Per sample of the batch: judged right after the attack, and its zero-gradient steps; the
    adversarial images of the samples the attack flipped."""

    correct: list[bool]
    zero_gradient_steps: list[int]
    flipped: dict[int, ImageArray]


@dataclass
class SquareUnitResult:
    """Per sample: success and queries; the batch's booking, and the flipped adversarial images."""

    success: list[bool]
    queries: list[int]
    used: int
    calls: int
    stopped: bool
    params: dict[str, Any]
    flipped: dict[int, ImageArray]


def pgd_units(levels: list[float], configs: dict[float, AttackConfig], images: list[Any], size: int) -> list[PgdUnit]:
    """Every eps x every batch of same-shape images; a batch's random start is seeded by the eps's
    attack seed plus the batch's start in its shape group (as the attack was seeded before units)."""
    groups = by_shape(images)
    return [
        PgdUnit(level, tuple(group[start : start + size]), configs[level].seed + start)
        for level in levels
        for group in groups
        for start in range(0, len(group), size)
    ]


@dataclass
class PgdOutcome:
    """The PGD units of one check, aggregated per eps: verdicts, zero-gradient steps, flipped images."""

    correct: dict[float, dict[int, bool]] = field(default_factory=dict)
    zero: dict[float, dict[int, int]] = field(default_factory=dict)
    adv_at: dict[float, dict[int, Any]] = field(default_factory=dict)

    def add(self, unit: PgdUnit, res: PgdResult) -> None:
        self.correct.setdefault(unit.level, {}).update(zip(unit.positions, res.correct, strict=True))
        self.zero.setdefault(unit.level, {}).update(zip(unit.positions, res.zero_gradient_steps, strict=False))
        self.adv_at.setdefault(unit.level, {}).update(res.flipped)

    def curve(self, levels: list[float], clean_ok: Any) -> tuple[dict[float, float], dict[int, float]]:
        """Robust accuracy per eps (right clean and under attack), and the smallest eps that flips each sample."""
        robust: dict[float, float] = {}
        flip_at: dict[int, float] = {}
        idx = range(len(clean_ok))
        for level in levels:
            ok = np.array([self.correct.get(level, {}).get(i, False) for i in idx], bool) & clean_ok
            robust[level] = float(ok.mean())
            for i in idx:
                if clean_ok[i] and not ok[i]:
                    flip_at.setdefault(i, level)
        return robust, flip_at


# --- on a worker ---------------------------------------------------------------------------------


def _judge(worker: UnitWorker, plan: AttackPlan, budget: QueryBudget | None = None) -> Judge:
    assert plan.judge is not None
    return Judge(worker.target, plan.data(worker), batch_size=plan.batch_size, budget=budget, state=plan.judge)


def _path(worker: UnitWorker, plan: AttackPlan) -> ImagePath:
    """The target's differentiable image path, built as the driver built it (its first clean image)."""

    def make() -> ImagePath:
        data = plan.data(worker)
        path = image_path(worker.target, data[0].load_image())
        if path is None:
            raise TargetCallError("the target gives no differentiable image path on this worker", code="attack_no_path")
        return path

    return worker.memo(f"adv/{plan.key}/path", make)


def _inputs(worker: UnitWorker, plan: AttackPlan, positions: tuple[int, ...]) -> list[ImageArray]:
    data = plan.data(worker)
    clean = [data[i].load_image() for i in positions]
    return _path(worker, plan).inputs(clean) if plan.prepared else clean


def _flipped(plan: AttackPlan, positions: tuple[int, ...], wrong: list[bool], images: list[Any]) -> dict[int, Any]:
    ok = plan.clean_ok or (True,) * len(plan.indices)
    return {i: img for i, w, img in zip(positions, wrong, images, strict=True) if w and ok[i]}


def run_pgd_unit(worker: UnitWorker, plan: AttackPlan, unit: PgdUnit) -> PgdResult:
    """PGD on the target's own image path, then judged through its public API."""
    torch = require("torch")
    path = _path(worker, plan)
    judge = _judge(worker, plan)
    inputs = _inputs(worker, plan, unit.positions)
    part = list(unit.positions)
    x = to_tensor(inputs, path.device)
    assert judge.refs is not None
    refs = unit_tensor(judge.refs, path.device)
    if judge.kind == "zero_shot":
        loss = zero_shot_loss(path, refs, [int(judge.truth[i]) for i in part], plan.loss)
    else:
        loss = retrieval_loss(path, refs[torch.tensor(part)])
    gen = torch.Generator(device=path.device)
    gen.manual_seed(unit.seed)
    adv, stats = as_model_call(worker.target, lambda: pgd(loss, x, plan.configs[unit.level], generator=gen))
    images = to_images(adv)
    correct = [bool(c) for c in judge.correct(images, part)]
    return PgdResult(
        correct, list(stats.zero_gradient_steps), _flipped(plan, unit.positions, [not c for c in correct], images)
    )


def run_square_unit(worker: UnitWorker, plan: AttackPlan, unit: SquareUnit) -> SquareUnitResult:
    """Square Attack through the target's public API, booking every query on the unit's share."""
    judge = _judge(worker, plan)
    inputs = _inputs(worker, plan, unit.positions)
    budget = QueryBudget(max(1, unit.allotment))
    if unit.allotment < 1:
        budget.used = 1  # nothing to spend: the attack stops before its first query
    part = list(unit.positions)
    res = square_attack(
        judge.scorer(part), inputs, unit.level / 255, budget=budget, queries_per_image=unit.queries_per_image,
        seed=unit.seed, p_init=unit.p_init,
    )  # fmt: skip
    success = [bool(s) for s in res.success]
    used = budget.used if unit.allotment >= 1 else 0
    return SquareUnitResult(
        success, [int(q) for q in res.queries], used, budget.calls, bool(res.stopped_by_budget), dict(res.params),
        _flipped(plan, unit.positions, success, list(res.images)),
    )  # fmt: skip


def _surrogate(worker: UnitWorker, plan: AttackPlan) -> tuple[Any, ImagePath]:
    """The surrogate target and its image path, loaded once per worker (the target itself when it is one)."""

    if plan.local_surrogate is not None:
        return plan.local_surrogate

    def make() -> tuple[Any, ImagePath]:
        from mmchaos.targets import load_target
        from mmchaos.targets.wrappers import unwrap

        assert plan.surrogate is not None
        inner = unwrap(worker.target)
        surrogate = inner if getattr(inner, "uri", "") == plan.surrogate else load_target(plan.surrogate)
        path = image_path(surrogate, plan.data(worker)[0].load_image(), exact=False)
        if path is None:
            raise TargetCallError(f"the surrogate {plan.surrogate} gives no differentiable image path",
                                  code="attack_no_path")  # fmt: skip
        return surrogate, path

    return worker.memo(f"adv/{plan.key}/surrogate", make)


def _surrogate_loss(
    worker: UnitWorker, plan: AttackPlan, surrogate: Any, path: ImagePath
) -> Callable[[list[int]], Any]:
    """The surrogate's loss for a batch (positions): zero-shot margin, or a push away from the clean embedding."""
    torch = require("torch")
    data = plan.data(worker)
    if plan.surrogate_loss == "zero_shot":

        def make_refs() -> Any:
            return unit_tensor(
                surrogate.embed_texts([data.prompt_template.format(c) for c in data.classes]), path.device
            )

        refs = worker.memo(f"adv/{plan.key}/surrogate-refs", make_refs)
        index = {c: i for i, c in enumerate(data.classes)}
        return lambda part: zero_shot_loss(path, refs, [index[data[i].label or ""] for i in part])

    def shift(part: list[int]) -> Any:
        with torch.no_grad():
            clean = to_tensor([data[i].load_image() for i in part], path.device)
            feats = unit_tensor(path.features(clean), path.device)
        return embedding_shift_loss(path, feats)

    return shift


def run_transfer_unit(worker: UnitWorker, plan: AttackPlan, unit: TransferUnit) -> PgdResult:
    """PGD crafted on the surrogate, replayed on the target through its public API."""
    torch = require("torch")
    surrogate, path = _surrogate(worker, plan)
    judge = _judge(worker, plan)
    part = list(unit.positions)
    data = plan.data(worker)
    clean = [data[i].load_image() for i in part]
    make_loss = _surrogate_loss(worker, plan, surrogate, path)
    gen = torch.Generator(device=path.device)
    gen.manual_seed(unit.seed)
    adv, _ = pgd(make_loss(part), to_tensor(clean, path.device), plan.configs[unit.level], generator=gen)
    images = to_images(adv)
    correct = [bool(c) for c in judge.correct(images, part)]
    return PgdResult(correct, [], _flipped(plan, unit.positions, [not c for c in correct], images))


# --- JSON codec (the run store's journal) --------------------------------------------------------


def _images(flipped: dict[int, ImageArray]) -> dict[str, Any]:
    return {str(i): encode_image(img) for i, img in flipped.items()}


def _from_images(body: dict[str, Any]) -> dict[int, ImageArray]:
    return {int(i): decode_image(v) for i, v in body.items()}


def encode_pgd(r: PgdResult) -> dict[str, Any]:
    return {"correct": r.correct, "zero": r.zero_gradient_steps, "flipped": _images(r.flipped)}


def decode_pgd(body: dict[str, Any]) -> PgdResult:
    return PgdResult([bool(c) for c in body["correct"]], [int(z) for z in body["zero"]], _from_images(body["flipped"]))


def encode_square(r: SquareUnitResult) -> dict[str, Any]:
    return {"success": r.success, "queries": r.queries, "used": r.used, "calls": r.calls, "stopped": r.stopped,
            "params": r.params, "flipped": _images(r.flipped)}  # fmt: skip


def decode_square(body: dict[str, Any]) -> SquareUnitResult:
    return SquareUnitResult(
        [bool(s) for s in body["success"]], [int(q) for q in body["queries"]], int(body["used"]), int(body["calls"]),
        bool(body["stopped"]), dict(body["params"]), _from_images(body["flipped"]),
    )  # fmt: skip
