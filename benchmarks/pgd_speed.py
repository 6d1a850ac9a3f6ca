"""PGD steps/s on builtin:tiny-clip through the harness vs a bare torch PGD loop, in one run.

    python benchmarks/pgd_speed.py [--batch 32] [--steps 20] [--repeats 5]

The harness path is what ``adversarial_whitebox`` runs: :func:`mmchaos.attacks.image_path` (the
mirror of the model's image processor), the zero-shot loss and :func:`mmchaos.attacks.pgd`
(projection, range clamp, zero-gradient bookkeeping). The bare loop is the same attack written
inline against ``model.get_image_features``. Runs alternate (and the order flips every repeat) so load
on a shared machine hits both alike; the medians are compared. Goal: ratio <= 1.2.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
import torch.nn.functional as F

from mmchaos.attacks import AttackConfig, image_path, pgd, to_tensor
from mmchaos.attacks.losses import unit_tensor, zero_shot_loss
from mmchaos.data import load_dataset
from mmchaos.targets.builtin import load_builtin


def bare_pgd(model, x, mean, std, classes, truth, eps, alpha, steps, scale, gen):  # type: ignore[no-untyped-def]
    delta = (torch.rand(x.shape, generator=gen) * 2 - 1) * eps
    x_adv = (x + delta).clamp(0, 1)
    for _ in range(steps):
        x_adv.requires_grad_(True)
        feats = model.get_image_features(pixel_values=(x_adv - mean) / std)
        feats = feats if hasattr(feats, "detach") else feats.pooler_output
        logits = scale * F.normalize(feats, dim=-1) @ classes.T
        loss = F.cross_entropy(logits, truth, reduction="none").sum()
        (grad,) = torch.autograd.grad(loss, x_adv)
        with torch.no_grad():
            x_adv = (x + (x_adv + alpha * grad.sign() - x).clamp(-eps, eps)).clamp(0, 1)
    return x_adv.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    target = load_builtin("tiny-clip")
    data = load_dataset(f"builtin:shapes?n={args.batch}")
    images = [s.load_image() for s in data]
    path = image_path(target, images[0])
    assert path is not None
    classes = unit_tensor(target.embed_texts([data.prompt_template.format(c) for c in data.classes]))
    index = {c: i for i, c in enumerate(data.classes)}
    truth = [index[s.label or ""] for s in data]
    x = to_tensor(images)
    cfg = AttackConfig(eps=4 / 255, steps=args.steps, seed=0)
    proc = target.image_processor
    mean = torch.tensor(proc.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(proc.image_std).view(1, 3, 1, 1)
    truth_t = torch.tensor(truth)

    def harness() -> None:
        pgd(zero_shot_loss(path, classes, truth), x, cfg)

    def bare() -> None:
        gen = torch.Generator().manual_seed(0)
        bare_pgd(target.model, x, mean, std, classes, truth_t, cfg.eps, cfg.alpha, cfg.steps, path.logit_scale, gen)

    harness(), bare()  # warm up
    times: dict[str, list[float]] = {"harness": [], "bare": []}
    pair = (("harness", harness), ("bare", bare))
    for r in range(args.repeats):
        for name, fn in pair if r % 2 == 0 else pair[::-1]:  # the order flips, so neither always goes first
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    h, b = statistics.median(times["harness"]), statistics.median(times["bare"])
    print(f"builtin:tiny-clip, batch {args.batch}, {args.steps} steps, {args.repeats} alternating repeats, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")  # fmt: skip
    print("| loop | median s | PGD steps/s | image-steps/s |")
    print("|---|---|---|---|")
    for name, t in (("harness", h), ("bare torch", b)):
        print(f"| {name} | {t:.3f} | {args.steps / t:.1f} | {args.steps * args.batch / t:.0f} |")
    print(f"harness / bare = {h / b:.3f} (goal <= 1.2)")


if __name__ == "__main__":
    main()
