"""Adversarial attacks: white-box FGSM/PGD on torch, task losses, and a black-box query attack.

Also the machinery the step-3 checks run them with: a judge that scores attacked images through
the target's public API (:mod:`~mmchaos.attacks.judge`), and the attacks cut into work units an
executor runs anywhere (:mod:`~mmchaos.attacks.plan`, :mod:`~mmchaos.attacks.units`,
:mod:`~mmchaos.attacks.vlm`). A library layer like :mod:`mmchaos.perturb`: it speaks to targets
and never imports checks, executors, chaos, server, cli, report or runner (a unit names the
worker it needs as a protocol). Torch is imported inside the calls that need it.
"""

from __future__ import annotations

from mmchaos.attacks.gradient import EPS_MAX, EPS_MIN, AttackConfig, AttackStats, fgsm, pgd
from mmchaos.attacks.preprocess import ImagePath, image_path, to_images, to_tensor
from mmchaos.attacks.query import QueryBudget, SquareResult, square_attack

__all__ = [
    "EPS_MAX",
    "EPS_MIN",
    "AttackConfig",
    "AttackStats",
    "ImagePath",
    "QueryBudget",
    "SquareResult",
    "fgsm",
    "image_path",
    "pgd",
    "square_attack",
    "to_images",
    "to_tensor",
]
