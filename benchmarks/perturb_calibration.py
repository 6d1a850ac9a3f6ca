"""Calibrate mmchaos' ImageNet-C corruptions against the reference implementation.

For every corruption and severity, the mean PSNR and SSIM of the corrupted image against the
clean one, over natural test images (scikit-image's bundled samples, centre-cropped to
224 x 224) and several seeds, by ``imagecorruptions`` (the reference) and by mmchaos. The gate:
|delta PSNR| <= 1.5 dB and |delta SSIM| <= 0.05. Writes a markdown table.

``imagecorruptions`` is only installed in the benchmark environment, never as a dependency of
mmchaos. It is stale (1.1.2, 2020): it uses ``np.float_``, ``pkg_resources`` and
``gaussian(..., multichannel=True)``; ``perturb_speed.load_reference`` shims those three, so it runs
in the project's venv after ``pip install imagecorruptions==1.1.2 scikit-image``::

    PYTHONPATH=src python benchmarks/perturb_calibration.py --out benchmarks/perturb_calibration.md

or, with the versions it was written for (scikit-image 0.19.3 builds from source on Python 3.11)::

    python3 -m venv /work/bench-venv
    /work/bench-venv/bin/pip install "numpy<2" "setuptools<81" "scipy<1.14" Cython"<3" wheel
    /work/bench-venv/bin/pip install --no-build-isolation "scikit-image==0.19.3"
    /work/bench-venv/bin/pip install imagecorruptions==1.1.2 albumentations==2.0.8 pydantic pyyaml
    PYTHONPATH=src /work/bench-venv/bin/python benchmarks/perturb_calibration.py \\
        --out benchmarks/perturb_calibration.md
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

PSNR_TOL = 1.5
SSIM_TOL = 0.05
PSNR_CAP = 60.0  # identical images have infinite PSNR; cap so that means stay finite
COLOUR = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "retina")
GRAY = ("camera", "brick", "grass", "gravel", "clock")


def test_images(n: int) -> list[np.ndarray]:
    import cv2
    import skimage.data

    out = []
    for name in (COLOUR + GRAY)[:n]:
        img = getattr(skimage.data, name)()
        if img.ndim == 2:
            img = np.stack([img] * 3, axis=2)
        h, w = img.shape[:2]
        side = min(h, w)
        img = img[(h - side) // 2 : (h - side) // 2 + side, (w - side) // 2 : (w - side) // 2 + side, :3]
        out.append(cv2.resize(img, (224, 224), interpolation=cv2.INTER_AREA))
    return out


def psnr(clean: np.ndarray, other: np.ndarray) -> float:
    mse = float(np.mean((clean.astype(np.float64) - other.astype(np.float64)) ** 2))
    return PSNR_CAP if mse == 0 else min(PSNR_CAP, 10 * np.log10(255.0**2 / mse))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3, help="seeds per image (glass_blur: 1, it is slow)")
    parser.add_argument("--only", nargs="*", help="corruptions to run (default: all 19)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/perturb_calibration.md"))
    args = parser.parse_args()

    warnings.simplefilter("ignore")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from perturb_speed import load_reference  # the shims that let the stale reference import

    if load_reference() is None:
        raise SystemExit("imagecorruptions is not installed: pip install imagecorruptions==1.1.2 scikit-image")
    import imagecorruptions
    from imagecorruptions import corrupt, get_corruption_names
    from skimage.metrics import structural_similarity

    from mmchaos import perturb

    images = test_images(args.images)
    names = args.only or get_corruption_names("all")
    rows = []
    start = time.perf_counter()
    for name in names:
        ours_p = perturb.get(name)
        for sev in range(1, 6):
            ref_psnr, ref_ssim, our_psnr, our_ssim = [], [], [], []
            repeats = 1 if name == "glass_blur" else args.repeats
            for k, img in enumerate(images):
                for r in range(repeats):
                    seed = 1000 * k + r
                    np.random.seed(seed)
                    ref = corrupt(img, severity=sev, corruption_name=name)
                    ours = ours_p([img], severity=sev, rng=seed)[0][0]
                    ref_psnr.append(psnr(img, ref))
                    our_psnr.append(psnr(img, ours))
                    ref_ssim.append(structural_similarity(img, ref, channel_axis=2, data_range=255))
                    our_ssim.append(structural_similarity(img, ours, channel_axis=2, data_range=255))
            row = (name, sev, np.mean(ref_psnr), np.mean(our_psnr), np.mean(ref_ssim), np.mean(our_ssim))
            rows.append(row)
            ok = abs(row[3] - row[2]) <= PSNR_TOL and abs(row[5] - row[4]) <= SSIM_TOL
            print(f"{name:18s} s{sev} PSNR {row[2]:6.2f} {row[3]:6.2f}  SSIM {row[4]:.3f} {row[5]:.3f}  "
                  f"{'ok' if ok else 'OUT'}", flush=True)  # fmt: skip
    elapsed = time.perf_counter() - start
    write(args.out, rows, len(images), args.repeats, elapsed, imagecorruptions.__file__)


def write(path: Path, rows: list[tuple], n_images: int, repeats: int, elapsed: float, ref_path: str) -> None:
    import cv2
    import scipy
    import skimage

    lines = [
        "# Calibration against ImageNet-C's reference implementation",
        "",
        f"Mean PSNR (dB, capped at {PSNR_CAP:.0f}) and SSIM of the corrupted image against the clean one, over "
        f"{n_images} natural 224 x 224 images (scikit-image's bundled samples, centre crops) x {repeats} seeds "
        "(glass_blur: 1 seed, the reference takes about a second an image). Reference: `imagecorruptions` 1.1.2. "
        f"Gate: |Δ PSNR| <= {PSNR_TOL} dB and |Δ SSIM| <= {SSIM_TOL}.",
        "",
        f"Environment: Python {platform.python_version()}, numpy {np.__version__}, scikit-image "
        f"{skimage.__version__}, scipy {scipy.__version__}, OpenCV {cv2.__version__}; {elapsed:.0f} s.",
        "Produced by `PYTHONPATH=src python benchmarks/perturb_calibration.py` "
        "(the shims of `perturb_speed.load_reference`).",
        "",
        "| corruption | severity | PSNR ref | PSNR mmchaos | Δ dB | SSIM ref | SSIM mmchaos | Δ | within |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    passed = 0
    for name, sev, rp, op, rs, os_ in rows:
        ok = abs(op - rp) <= PSNR_TOL and abs(os_ - rs) <= SSIM_TOL
        passed += ok
        lines.append(
            f"| {name} | {sev} | {rp:.2f} | {op:.2f} | {op - rp:+.2f} | {rs:.3f} | {os_:.3f} | {os_ - rs:+.3f} | "
            f"{'yes' if ok else '**no**'} |"
        )
    lines += ["", f"**{passed} of {len(rows)} (corruption, severity) pairs within the gate.**", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    print(f"{passed}/{len(rows)} within the gate; wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
