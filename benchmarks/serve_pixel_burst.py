"""A burst of large-image requests against `mmchaos serve` (a real process on loopback): its
answers (200 / 429 / 504 counts) and the server's resident memory, sampled, cold and warm.

Issue 24's burst: 64 concurrent embeddings requests, each with two 4999x5000 PNGs (50 M declared
pixels, at `max_request_pixels`), on a fresh tiny-clip server, then the same burst again (warm).
RSS is read from /proc/PID/status every 20 ms: idle (after start-up and one small request), the
peak during each burst, and after it.

    python benchmarks/serve_pixel_burst.py [--target builtin:tiny-clip] [--requests 64] [--rounds 2]
        [--side 5000] [-- extra mmchaos serve flags]
"""

from __future__ import annotations

import argparse
import base64
import io
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
from _serve_proc import mmchaos_serve, rss_mib
from PIL import Image


def _png_url(width: int, height: int, seed: int) -> str:
    """A smooth, compressible picture (a few MB of PNG, not 75 MB of noise) of ``width x height``."""
    y, x = np.ogrid[:height, :width]
    img = np.empty((height, width, 3), np.uint8)
    img[..., 0] = (x * 255 // max(1, width - 1)).astype(np.uint8)
    img[..., 1] = (y * 255 // max(1, height - 1)).astype(np.uint8)
    img[..., 2] = ((x + y + seed) // 64 % 256).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG", compress_level=6)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


class _Sampler:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mib(self.pid))
            time.sleep(0.02)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _burst(url: str, body: dict[str, Any], n: int, timeout: float) -> tuple[Counter[int], Counter[str], float]:
    clients = [httpx.Client(base_url=url, timeout=timeout) for _ in range(n)]
    codes: Counter[str] = Counter()

    def post(c: httpx.Client) -> int:
        r = c.post("/v1/embeddings", json=body)
        if r.status_code != 200:
            codes[r.json()["error"]["code"]] += 1
        return r.status_code

    try:
        for c in clients:
            c.get("/v1/models")
        start = time.monotonic()
        with ThreadPoolExecutor(n) as pool:
            statuses = Counter(pool.map(post, clients))
        return statuses, codes, time.monotonic() - start
    finally:
        for c in clients:
            c.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="builtin:tiny-clip")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--side", type=int, default=5000, help="image height (width is one less)")
    parser.add_argument("serve_args", nargs="*", help="more mmchaos serve flags (after --)")
    args = parser.parse_args()

    with mmchaos_serve(args.target, *args.serve_args) as (proc, url):
        small = {"input": [{"type": "image_url", "image_url": {"url": _png_url(64, 64, 0)}}]}
        assert httpx.post(f"{url}/v1/embeddings", json=small, timeout=60).status_code == 200
        idle = rss_mib(proc.pid)
        side = args.side
        body = {"input": [{"type": "image_url", "image_url": {"url": _png_url(side - 1, side, s)}} for s in (1, 2)]}
        size = sum(len(p["image_url"]["url"]) for p in body["input"]) / 2**20
        shape = f"2x {side - 1}x{side} PNG ({size:.1f} MiB body)"
        print(f"{args.target}: idle RSS {idle:.0f} MiB; {args.requests} requests of {shape}")
        for i in range(args.rounds):
            with _Sampler(proc.pid) as sampler:
                statuses, codes, took = _burst(url, body, args.requests, 120.0)
            time.sleep(1.0)
            after = rss_mib(proc.pid)
            label = "cold" if i == 0 else "warm"
            counts = ", ".join(f"{k}x{s}" for s, k in sorted(statuses.items()))
            print(
                f"  {label}: {counts} ({dict(codes)}) in {took:.1f}s; peak RSS {sampler.peak:.0f} MiB "
                f"({sampler.peak / idle:.2f}x idle), {after:.0f} MiB after"
            )


if __name__ == "__main__":
    main()
