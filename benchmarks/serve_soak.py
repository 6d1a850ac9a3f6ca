"""A bounded soak of `mmchaos serve` over a generative target: mixed chat requests (text, an
image, a stream, n=2, a refused one), the server's RSS sampled after every block, and the client's
transport errors counted, to tell whether the server's memory levels off.

    python benchmarks/serve_soak.py [--target builtin:tiny-vlm] [--requests 20000] [--block 1000]
        [--concurrency 8] [--max-seconds 1800]

Each block's line: answers by status, transport errors (httpx.ReadError and the like), RSS after
the block and its growth over the block. Growth that shrinks toward 0 block after block is the
allocator and caches warming; growth that stays constant per request is a leak.
"""

from __future__ import annotations

import argparse
import base64
import io
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
from _serve_proc import mmchaos_serve, rss_mib
from PIL import Image


def _png_url(seed: int) -> str:
    img = np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _bodies() -> list[dict[str, Any]]:
    image = {"type": "image_url", "image_url": {"url": _png_url(0)}}
    user = {"role": "user", "content": "what shape is it?"}
    with_image = {"role": "user", "content": [image, {"type": "text", "text": "describe it"}]}
    return [
        {"messages": [user], "max_tokens": 8, "temperature": 0},
        {"messages": [with_image], "max_tokens": 8, "temperature": 0},
        {"messages": [with_image], "max_tokens": 8, "stream": True},
        {"messages": [user], "max_tokens": 4, "n": 2, "temperature": 1, "seed": 3},
        {"messages": [{"role": "tool", "content": "x"}], "max_tokens": 4},  # refused: 400
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="builtin:tiny-vlm")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--block", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-seconds", type=float, default=1800.0, help="stop after this long, whatever is left")
    args = parser.parse_args()

    with mmchaos_serve(args.target, "--max-queue-wait", "0") as (proc, url):
        bodies = _bodies()
        clients = [httpx.Client(base_url=url, timeout=60.0) for _ in range(args.concurrency)]

        def send(i: int) -> str:
            client, body = clients[i % len(clients)], bodies[i % len(bodies)]
            try:
                if body.get("stream"):
                    with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        for _ in r.iter_lines():
                            pass
                        return str(r.status_code)
                return str(client.post("/v1/chat/completions", json=body).status_code)
            except httpx.TransportError as exc:
                return type(exc).__name__

        start = time.monotonic()
        before = rss_mib(proc.pid)
        print(f"{args.target}: RSS {before:.0f} MiB at start; {args.requests} requests, {args.concurrency} at once")
        sent = 0
        with ThreadPoolExecutor(args.concurrency) as pool:
            while sent < args.requests and time.monotonic() - start < args.max_seconds:
                n = min(args.block, args.requests - sent)
                outcomes = Counter(pool.map(send, range(sent, sent + n)))
                sent += n
                rss = rss_mib(proc.pid)
                shown = ", ".join(f"{k}x{v}" for k, v in sorted(outcomes.items()))
                print(
                    f"  {sent:6d}: {shown}; RSS {rss:.0f} MiB ({rss - before:+.1f}) at {time.monotonic() - start:.0f}s"
                )
                before = rss
        for c in clients:
            c.close()


if __name__ == "__main__":
    main()
