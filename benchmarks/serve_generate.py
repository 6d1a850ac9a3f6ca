"""Generation throughput and TTFT of `mmchaos serve` (continuous batching, dynamic batching of whole
calls, no batching) against the bare batched `generate` floor on the same model, at concurrency
1, 4 and 16, in one run.

Floor: the target in this process, the same requests in batches of the concurrency
(`generate_batch`; `generate` alone at 1): completion tokens/s over the whole run, and TTFT as the
time of one batch of `max_new_tokens=1` (prefill plus the first token). Served: `mmchaos serve
--target T` in a child process (benchmarks/_serve_proc.py), default flags (continuous batching,
16 slots, shedding at 0.5 s), `--no-continuous-batching` (whole `generate_batch` calls) and
`--no-batching` (4 slots, as before batching); closed-loop clients that share `--requests` chat
requests (each sends its share one after another): completion tokens/s from the answers' usage,
the median latency, the answered and refused (429) counts, and TTFT (median time to the first
content delta) from a second, streamed pass. Only the continuous server batches streams (the
others stream one request at a time, so their streamed TTFT at concurrency > 1 is that of
requests waiting for the model in turn). The peer: `transformers serve` on the same model
directory (builtin:tiny-vlm's, or an `hf:` target's), with its default one-request-at-a-time
generation and with `--continuous-batching` (its paged-attention scheduler); left out with
`--no-transformers-serve` or where transformers' `serving` extra is not installed. Ratios are
against the floor at the same concurrency: tokens/s served / floor (>= 1 is as fast), TTFT served /
floor (<= 1 is as quick); `batch` is the mean requests per model batch the server ran, a prefill's
joiners for the continuous one (from its /metrics; nan for the peer, which has none). Every server
runs at once and each level is measured on the floor and every server in turn, so load that drifts
over the run shifts a level's rows alike.

    python benchmarks/serve_generate.py [--target builtin:tiny-vlm] [--requests 48] [--max-new-tokens 16]
        [--scaled-vlm DIR]   # a 58 M-parameter LLaVA built from tiny-vlm's config instead (SCALED_VLM)
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from _serve_proc import mmchaos_serve, transformers_serve

QUESTION = "What colour is the shape?"


def _images(n: int) -> list[Any]:
    from mmchaos.data.shapes import make_shapes

    return [s.image for s in make_shapes(n, seed=1).samples[:n]]


def _body(image: Any, max_new_tokens: int, stream: bool, model: str | None = None) -> dict[str, Any]:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]
    body: dict[str, Any] = {"messages": [{"role": "user", "content": parts}], "max_tokens": max_new_tokens,
                            "temperature": 0}  # fmt: skip
    if stream:
        body["stream"] = True
    if model is not None:  # transformers serve needs it (mmchaos serve takes its served names only)
        body["model"] = model
    return body


def _floor(target: Any, images: list[Any], concurrency: int, max_new_tokens: int) -> dict[str, float]:
    """Batches of ``concurrency`` through the target itself: tokens/s, and TTFT as a 1-token batch."""
    from mmchaos.targets.generation import GenerationParams, Message

    params = GenerationParams(max_new_tokens=max_new_tokens, logprobs=False)
    first = GenerationParams(max_new_tokens=1, logprobs=False)
    chats = [[Message("user", (img, QUESTION))] for img in images]
    chunks = [chats[i : i + concurrency] for i in range(0, len(chats), concurrency)]

    def run(chunk: list[Any], p: Any) -> list[Any]:
        return [target.generate(chunk[0], (), p)] if len(chunk) == 1 else target.generate_batch(chunk, p)

    start = time.perf_counter()
    tokens = sum(len(r.completions[0].token_ids or ()) for chunk in chunks for r in run(chunk, params))
    wall = time.perf_counter() - start
    ttfts = []
    for chunk in chunks:
        t = time.perf_counter()
        run(chunk, first)
        ttfts.append(time.perf_counter() - t)
    return {"tok_s": tokens / wall, "ttft": statistics.median(ttfts), "latency": wall / len(chunks),
            "answered": float(len(chats)), "refused": 0.0, "batch": float(concurrency)}  # fmt: skip


def _served(
    url: str, images: list[Any], concurrency: int, rounds: int, max_new_tokens: int, model: str | None = None
) -> dict[str, float]:
    import httpx

    plain = [_body(img, max_new_tokens, False, model) for img in images]
    streamed = [_body(img, max_new_tokens, True, model) for img in images]

    def client(k: int, stream: bool) -> list[tuple[int, int, float, float]]:
        """(status, completion tokens, latency, ttft) of this client's requests, one after another."""
        out = []
        with httpx.Client(base_url=url, timeout=600.0) as c:
            for r in range(rounds):
                body = (streamed if stream else plain)[k * rounds + r]
                start = time.perf_counter()
                if not stream:
                    resp = c.post("/v1/chat/completions", json=body)
                    took = time.perf_counter() - start
                    tokens = resp.json()["usage"]["completion_tokens"] if resp.status_code == 200 else 0
                    out.append((resp.status_code, tokens, took, took))
                    continue
                ttft = None
                with c.stream("POST", "/v1/chat/completions", json=body) as resp:
                    for line in resp.iter_lines():
                        if ttft is None and line.startswith("data: {"):
                            choices = json.loads(line[6:]).get("choices") or [{}]
                            if choices[0].get("delta", {}).get("content"):
                                ttft = time.perf_counter() - start
                out.append((resp.status_code, 0, time.perf_counter() - start, ttft or 0.0))
        return out

    def wave(stream: bool) -> tuple[float, list[tuple[int, int, float, float]]]:
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            rows = [row for rs in pool.map(lambda k: client(k, stream), range(concurrency)) for row in rs]
        return time.perf_counter() - start, rows

    before = _batches(url)
    wall, rows = wave(False)
    after = _batches(url)
    ok = [r for r in rows if r[0] == 200]
    _, srows = wave(True)
    sok = [r for r in srows if r[0] == 200]
    return {
        "tok_s": sum(r[1] for r in ok) / wall,
        "latency": statistics.median(r[2] for r in ok) if ok else float("nan"),
        "ttft": statistics.median(r[3] for r in sok) if sok else float("nan"),
        "answered": float(len(ok)),
        "refused": float(sum(1 for r in rows if r[0] == 429)),
        "batch": (after[0] - before[0]) / (after[1] - before[1]) if after[1] > before[1] else float("nan"),
    }


def _batches(url: str) -> tuple[float, float]:
    """(requests, batches) of chat model batches so far, from the server's /metrics ((0, 0) where it
    has none: transformers serve)."""
    import httpx

    resp = httpx.get(f"{url}/metrics", timeout=60.0)
    text = resp.text if resp.status_code == 200 else ""
    found = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        for part in found:
            if line.startswith(f'mmchaos_server_batch_size_{part}{{kind="chat"}}'):
                found[part] = float(line.split()[-1])
    return found["sum"], found["count"]


def _warm(url: str, images: list[Any], max_new_tokens: int, model: str | None = None) -> None:
    import httpx

    bodies = [_body(img, max_new_tokens, False, model) for img in images[:4]]
    with httpx.Client(base_url=url, timeout=600.0) as c:
        c.post("/v1/chat/completions", json=bodies[0])
        with ThreadPoolExecutor(4) as pool:  # batch shapes warmed too
            list(pool.map(lambda b: c.post("/v1/chat/completions", json=b), bodies))


def _peer_model_dir(target: str) -> str | None:
    """The model directory transformers serve can load for ``target`` (None: no peer run)."""
    import importlib.util

    if any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn", "openai")):
        print("transformers serve left out: transformers[serving] is not installed")
        return None
    if target == "builtin:tiny-vlm":
        from mmchaos.targets.builtin import TINY_VLM_DIR

        return str(TINY_VLM_DIR)
    if target.startswith("hf:") and os.path.isdir(target[3:].split("?")[0]):
        return target[3:].split("?")[0]
    print(f"transformers serve left out: {target} is not a model directory it can load")
    return None


SCALED_VLM = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 6, "num_attention_heads": 12,
              "num_key_value_heads": 12, "head_dim": 64}  # fmt: skip
"""builtin:tiny-vlm's LLaVA (its processor, vision tower and vocabulary) with a 58 M-parameter language
model: a model whose forward passes, not the HTTP edge, take most of a request's time. On
builtin:tiny-vlm a token takes about 1.5 ms and a bare GET to the server about 1 ms, so its floor
leaves out costs larger than the model's; this one shows the engine's own share."""


def build_scaled_vlm(out: str) -> str:
    """:data:`SCALED_VLM` with seeded random weights, saved in ``out``; its ``hf:`` target URI.

    Random weights never say end-of-sequence, so every answer is ``max_new_tokens`` long."""
    import shutil

    import torch
    from transformers import AutoConfig, LlavaForConditionalGeneration

    from mmchaos.targets.builtin import TINY_VLM_DIR

    config = AutoConfig.from_pretrained(TINY_VLM_DIR)
    for key, value in SCALED_VLM.items():
        setattr(config.text_config, key, value)
    torch.manual_seed(0)
    LlavaForConditionalGeneration(config).save_pretrained(out)
    for name in os.listdir(TINY_VLM_DIR):
        if name not in ("model.safetensors", "config.json", "training.json"):
            shutil.copy(os.path.join(TINY_VLM_DIR, name), out)
    return f"hf:{out}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="builtin:tiny-vlm")
    ap.add_argument("--requests", type=int, default=48, help="requests per concurrency level (the floor runs them too)")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--serve-args", default="", help="extra flags for both batching servers")
    ap.add_argument("--no-unbatched", action="store_true", help="leave out the --no-batching server")
    ap.add_argument("--no-transformers-serve", action="store_true", help="leave out the transformers serve peer")
    ap.add_argument("--scaled-vlm", metavar="DIR", help="build SCALED_VLM (random weights) in DIR and serve that")
    args = ap.parse_args()
    if args.scaled_vlm:
        args.target = build_scaled_vlm(args.scaled_vlm)
    levels = [int(c) for c in args.concurrency.split(",")]

    from mmchaos.targets import load_target
    from mmchaos.targets.generation import Message

    images = _images(args.requests)
    results: dict[tuple[str, int], dict[str, float]] = {}
    extra = tuple(args.serve_args.split())
    servers: list[tuple[str, tuple[str, ...]]] = [
        ("serve, continuous", extra),
        ("serve, dynamic", ("--no-continuous-batching", *extra)),
    ]
    if not args.no_unbatched:
        servers.append(("serve, --no-batching", ("--no-batching",)))
    peer = None if args.no_transformers_serve else _peer_model_dir(args.target)
    target = load_target(args.target)
    target.generate_batch([[Message("user", (images[0], QUESTION))]] * 2)  # warm-up
    with contextlib.ExitStack() as stack:
        # Every server up at once, and each level measured on all of them in turn (the floor
        # first): a machine whose load drifts over the run shifts every row of a level alike.
        urls: dict[str, tuple[str, str | None]] = {
            name: (stack.enter_context(mmchaos_serve(args.target, *flags))[1], None) for name, flags in servers
        }
        if peer is not None:
            for name, flags in (("transformers serve", ()), ("transformers serve, CB", ("--continuous-batching",))):
                urls[name] = (stack.enter_context(transformers_serve(peer, *flags)), peer)
        for url, model in urls.values():
            _warm(url, images, args.max_new_tokens, model)
        for c in levels:
            results[("floor: batched generate", c)] = _floor(target, images, c, args.max_new_tokens)
            for name, (url, model) in urls.items():
                results[(name, c)] = _served(url, images, c, args.requests // c, args.max_new_tokens, model)
    target.close()

    print(f"{args.target}, max_new_tokens={args.max_new_tokens}, {args.requests} requests per level, greedy")
    print(f"{'':26} {'conc':>4} {'tok/s':>7} {'x floor':>7} {'latency':>8} {'TTFT':>7} {'x floor':>7} "
          f"{'200':>4} {'429':>4} {'batch':>5}")  # fmt: skip
    for (name, c), r in results.items():
        floor = results[("floor: batched generate", c)]
        print(f"{name:26} {c:4d} {r['tok_s']:7.1f} {r['tok_s'] / floor['tok_s']:6.2f}x {r['latency'] * 1e3:6.0f}ms "
              f"{r['ttft'] * 1e3:5.0f}ms {r['ttft'] / floor['ttft']:6.2f}x {int(r['answered']):4d} "
              f"{int(r['refused']):4d} {r['batch']:5.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
