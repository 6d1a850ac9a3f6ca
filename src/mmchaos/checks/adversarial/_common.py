"""What the adversarial checks share on the driver: the samples they attack (drawn from the
check's context) and the worst-case evidence. The attack machinery itself (judge, units, plans)
lives in :mod:`mmchaos.attacks`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mmchaos.attacks.gradient import eps_label
from mmchaos.attacks.judge import Judge
from mmchaos.attacks.plan import ImageArray
from mmchaos.checks.evidence import image_artifact, safe_name
from mmchaos.data.base import Dataset
from mmchaos.findings import Artifact
from mmchaos.targets.base import Capability

if TYPE_CHECKING:
    from mmchaos.checks.base import CheckContext

__all__ = ["JUDGED_IMAGE_TASKS", "AttackSet", "attack_set", "flip_cases", "sampled", "worst_records"]

#: What a check that scores images through :class:`Judge` requires: zero-shot/retrieval
#: embeddings or OCR reads (the two families ``Judge`` knows how to score). One tuple so the
#: black-box, transfer and occlusion checks cannot drift apart on what they accept.
JUDGED_IMAGE_TASKS = (
    frozenset({Capability.EMBED_IMAGE, Capability.EMBED_TEXT}),
    frozenset({Capability.READ_TEXT}),
)


@dataclass(frozen=True)
class AttackSet:
    """The samples an adversarial check attacks: drawn once on the driver, named by position.

    ``indices`` are positions in the run's dataset (a worker rebuilds ``data`` from them);
    ``clean`` the decoded images (empty when the set has none); ``kind`` the image task a
    :class:`Judge` would score (None: none fits the target and data).
    """

    indices: tuple[int, ...]
    data: Dataset
    clean: list[ImageArray]
    kind: str | None


def sampled(ctx: CheckContext, samples: int, *, cap: bool = True) -> tuple[tuple[int, ...], Dataset]:
    """The seeded, label-stratified sample of ``samples`` items (capped by the run's max_samples when
    ``cap``): its positions in the run's dataset (what a worker rebuilds it from) and the sample itself."""
    n = min(ctx.max_samples or samples, samples) if cap else samples
    full = ctx.dataset
    indices = tuple(range(len(full))) if n >= len(full) else tuple(full.sample_indices(n, ctx.seed))
    return indices, full.sample(n, ctx.seed)


def attack_set(ctx: CheckContext, samples: int, *, cap: bool = True) -> AttackSet:
    """:func:`sampled`, its clean images and the judge task that fits it: the image attacks' preamble."""
    indices, data = sampled(ctx, samples, cap=cap)
    clean = [s.load_image() for s in data] if data.has_images else []
    return AttackSet(indices, data, clean, Judge.choose(ctx.target, data))


def flip_cases(data: Dataset, flip_at: dict[int, float], n: int) -> list[dict[str, Any]]:
    """The ``n`` samples flipped at the smallest eps, as worst-case records."""
    cases = []
    for i in sorted(flip_at, key=lambda i: (flip_at[i], i))[:n]:
        lv = flip_at[i]
        truth = data[i].label or data[i].caption or data[i].text
        cases.append({"sample": data[i].id, "index": i, "eps_255": lv, "label": f"eps {eps_label(lv)}",
                      "severity": eps_label(lv), "truth": truth})  # fmt: skip
    return cases


def worst_records(
    check_id: str,
    data: Dataset,
    cases: list[dict[str, Any]],
    clean: Sequence[ImageArray],
    adv_at: dict[float, dict[int, ImageArray]],
) -> list[Artifact]:
    """Clean and adversarial PNGs (and their 8x amplified difference) for each case; the case dicts
    get the artifact names the HTML report shows."""
    artifacts: list[Artifact] = []
    for rank, case in enumerate(cases, 1):
        i = int(case["index"])
        adv = adv_at[case["eps_255"]][i]
        stem = safe_name(f"{check_id}-worst{rank:02d}-eps{case['eps_255']:g}-{data[i].id}")
        diff = np.clip(127 + 8 * (adv.astype(np.int16) - clean[i].astype(np.int16)), 0, 255).astype(np.uint8)
        case["rank"] = rank
        case["clean_artifact"] = f"{stem}-clean.png"
        case["perturbed_artifact"] = f"{stem}-adversarial.png"
        case["difference_artifact"] = f"{stem}-difference-x8.png"
        artifacts += [
            image_artifact(case["clean_artifact"], np.ascontiguousarray(clean[i])),
            image_artifact(case["perturbed_artifact"], adv),
            image_artifact(case["difference_artifact"], diff),
        ]
    return artifacts
