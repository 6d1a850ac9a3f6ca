"""Generate throughput of `mmchaos serve` (guards on, over loopback HTTP) against plain
`target.generate` in the same process and run, on the same requests.

Baseline: the target's own `generate`, called sequentially. Served: the same requests sent through
the `openai:` target to the reference server, sequentially and with concurrency. Reported as
requests/s, generated words/s and the ratio to the baseline.

    python benchmarks/serve_generate.py [--target builtin:tiny-vlm] [--requests 24] [--max-new-tokens 16]

Without --target it uses builtin:tiny-vlm when it ships, else a tiny LLaVA built from config.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _target(uri: str | None, workdir: str) -> Any:
    from mmchaos.errors import UsageError
    from mmchaos.targets import load_target

    if uri:
        return load_target(uri)
    try:
        return load_target("builtin:tiny-vlm")
    except UsageError:
        from mmchaos.targets.tiny_vlms import build_tiny_vlm

        return load_target(f"hf:{build_tiny_vlm('llava', os.path.join(workdir, 'llava'))}")


def _requests(n: int) -> list[tuple[str, list[Any]]]:
    from mmchaos.data.shapes import make_shapes

    data = make_shapes(n, seed=1)
    return [("What colour is the shape?", [s.image]) for s in data.samples[:n]]


def _tokens(result: Any) -> int:
    # Counted the same way on both paths (HTTP answers carry no token ids): words of the answer.
    return len(result.completions[0].text.split())


def _run(fn: Any, reqs: list[tuple[str, list[Any]]], concurrency: int) -> tuple[float, int]:
    start = time.perf_counter()
    if concurrency == 1:
        results = [fn(r) for r in reqs]
    else:
        with ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(fn, reqs))
    return time.perf_counter() - start, sum(_tokens(r) for r in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()

    from mmchaos.server import ServerConfig, ServerThread
    from mmchaos.targets import load_target
    from mmchaos.targets.generation import GenerationParams

    params = GenerationParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    with tempfile.TemporaryDirectory() as workdir:
        target = _target(args.target, workdir)
        reqs = _requests(args.requests)
        target.generate(*reqs[0], params)  # warm-up
        rows: list[tuple[str, float, int]] = []
        wall, toks = _run(lambda r: target.generate(r[0], r[1], params), reqs, 1)
        rows.append(("plain generate (baseline)", wall, toks))
        with ServerThread(target, ServerConfig.build(max_concurrency=args.concurrency)) as server:
            client = load_target(f"openai:{server.url}/v1")
            client.generate(*reqs[0], params)  # warm-up
            for c in (1, args.concurrency):
                wall, toks = _run(lambda r: client.generate(r[0], r[1], params), reqs, c)
                rows.append((f"mmchaos serve, concurrency {c}", wall, toks))
            client.close()
        target.close()
    base_rps = len(reqs) / rows[0][1]
    print(f"{len(reqs)} requests, max_new_tokens={args.max_new_tokens}, target {target.uri}")
    print(f"{'':32} {'req/s':>8} {'words/s':>8} {'vs baseline':>12}")
    for name, wall, toks in rows:
        rps = len(reqs) / wall
        print(f"{name:32} {rps:8.2f} {toks / wall:8.1f} {rps / base_rps:11.2f}x")


if __name__ == "__main__":
    main()
