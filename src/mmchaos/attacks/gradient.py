"""FGSM and PGD written directly on torch: L-inf and L2, random start, seeded.

An attack maximises a per-sample loss ``loss_fn(x) -> (B,)`` over images ``x`` of shape
``(B, C, H, W)`` with values in ``[0, 1]``, inside an eps-ball around the clean images. The loss
carries the target's own differentiable preprocessing (see :mod:`mmchaos.attacks.preprocess`), so
the perturbation lives in pixel space, where an uploaded image lives.

Eps is given per element for both norms, so the same number means comparable strength: the L-inf
ball is ``|delta|_inf <= eps``; the L2 ball is ``|delta|_2 <= eps * sqrt(C*H*W)`` (an RMS change
of eps per element). Every random draw comes from a ``torch.Generator`` seeded from
:attr:`AttackConfig.seed`, so an attack replays bit for bit on the same device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from mmchaos._lazy import require
from mmchaos.errors import ConfigError

__all__ = ["EPS_MAX", "EPS_MIN", "AttackConfig", "AttackStats", "LossFn", "eps_label", "eps_values", "fgsm", "pgd"]

Tensor = Any
LossFn = Callable[[Tensor], Tensor]
"""Images ``(B, C, H, W)`` in [0, 1] -> per-sample loss ``(B,)`` that the attack maximises."""

EPS_MIN = 1 / 255
EPS_MAX = 16 / 255
Norm = Literal["linf", "l2"]


def eps_values(v: list[float]) -> list[float]:
    """Eps given in grey levels (1..16, i.e. k/255), sorted and unique."""
    if not v or any(not EPS_MIN * 255 - 1e-6 <= e <= EPS_MAX * 255 + 1e-6 for e in v):
        raise ValueError("eps values are grey levels in [1, 16] (eps = level / 255)")
    return sorted(set(float(e) for e in v))


def eps_label(level: float) -> str:
    return f"{level:g}/255"


@dataclass(frozen=True)
class AttackConfig:
    """One white-box attack: the ball (norm, eps), the steps, and the seed of its random start."""

    eps: float
    norm: Norm = "linf"
    steps: int = 10
    step_size: float | None = None
    """Per-step size in the same per-element units as eps; default ``2.5 * eps / steps`` (Madry et al.)."""
    random_start: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if not EPS_MIN - 1e-9 <= self.eps <= EPS_MAX + 1e-9:
            raise ConfigError(
                f"eps {self.eps:.5f} is outside [1/255, 16/255] (give eps as a fraction of the pixel range, "
                "e.g. 4/255 = 0.0157)",
                code="attack_bad_eps",
            )
        if self.norm not in ("linf", "l2"):
            raise ConfigError(f"norm must be 'linf' or 'l2', not {self.norm!r}", code="attack_bad_norm")
        if self.steps < 1:
            raise ConfigError("an attack needs at least one step", code="attack_bad_steps")

    @property
    def alpha(self) -> float:
        return self.step_size if self.step_size is not None else 2.5 * self.eps / self.steps

    def describe(self) -> dict[str, Any]:
        return {
            "norm": self.norm,
            "eps": self.eps,
            "eps_255": round(self.eps * 255, 4),
            "steps": self.steps,
            "step_size": self.alpha,
            "random_start": self.random_start,
            "seed": self.seed,
        }


@dataclass
class AttackStats:
    """What an attack saw: per-sample count of steps whose gradient was exactly zero."""

    steps: int = 0
    zero_gradient_steps: list[int] = field(default_factory=list)

    def zero_gradient_share(self) -> float:
        """Share of (sample, step) pairs with an all-zero gradient: near 1 means the gradient is masked."""
        if not self.steps or not self.zero_gradient_steps:
            return 0.0
        return sum(self.zero_gradient_steps) / (self.steps * len(self.zero_gradient_steps))


def _flat_norm(t: Tensor) -> Tensor:
    return t.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *([1] * (t.dim() - 1)))


def _project(delta: Tensor, cfg: AttackConfig) -> Tensor:
    if cfg.norm == "linf":
        return delta.clamp(-cfg.eps, cfg.eps)
    radius = cfg.eps * math.sqrt(delta[0].numel())
    return delta * (radius / _flat_norm(delta)).clamp(max=1.0)


def _random_start(x: Tensor, cfg: AttackConfig, gen: Tensor) -> Tensor:
    torch = require("torch")
    u = torch.rand(x.shape, generator=gen, device=x.device, dtype=x.dtype)
    if cfg.norm == "linf":
        return (2 * u - 1) * cfg.eps
    # A uniform point of the L2 ball: a Gaussian direction scaled by radius * U^(1/n).
    g = torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype)
    n = x[0].numel()
    r = torch.rand((x.shape[0],), generator=gen, device=x.device, dtype=x.dtype) ** (1.0 / n)
    radius = cfg.eps * math.sqrt(n)
    return g / _flat_norm(g) * (radius * r).view(-1, *([1] * (x.dim() - 1)))


def _step(grad: Tensor, cfg: AttackConfig, alpha: float) -> Tensor:
    if cfg.norm == "linf":
        return alpha * grad.sign()
    return alpha * math.sqrt(grad[0].numel()) * grad / _flat_norm(grad)


def pgd(
    loss_fn: LossFn, x: Tensor, cfg: AttackConfig, *, generator: Tensor | None = None
) -> tuple[Tensor, AttackStats]:
    """Projected gradient ascent on ``loss_fn`` inside the eps-ball around ``x`` (kept in [0, 1])."""
    torch = require("torch")
    gen = generator
    if gen is None:
        gen = torch.Generator(device=x.device)
        gen.manual_seed(cfg.seed)
    x = x.detach()
    delta = _random_start(x, cfg, gen) if cfg.random_start else torch.zeros_like(x)
    x_adv = (x + _project(delta, cfg)).clamp(0.0, 1.0)
    zero = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
    alpha = cfg.alpha
    for _ in range(cfg.steps):
        x_adv.requires_grad_(True)
        loss = loss_fn(x_adv)
        (grad,) = torch.autograd.grad(loss.sum(), x_adv)
        with torch.no_grad():
            zero += (grad.flatten(1).abs().amax(dim=1) == 0).to(torch.int64)
            delta = _project(x_adv.detach() + _step(grad, cfg, alpha) - x, cfg)
            x_adv = (x + delta).clamp(0.0, 1.0)
    return x_adv.detach(), AttackStats(steps=cfg.steps, zero_gradient_steps=[int(v) for v in zero.tolist()])


def fgsm(loss_fn: LossFn, x: Tensor, eps: float, *, norm: Norm = "linf") -> tuple[Tensor, AttackStats]:
    """The fast gradient (sign) method: one step of size eps from the clean image, no random start."""
    return pgd(loss_fn, x, AttackConfig(eps=eps, norm=norm, steps=1, step_size=eps, random_start=False))
