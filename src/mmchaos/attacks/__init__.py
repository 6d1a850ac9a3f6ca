"""Adversarial attacks: white-box FGSM/PGD on torch, task losses, and a black-box query attack.

A library layer like :mod:`mmchaos.perturb`: it speaks to targets and never imports checks,
chaos, server, cli, report or runner. Torch is imported inside the calls that need it.
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
