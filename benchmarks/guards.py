"""Per-call overhead of the mmchaos.guard guards, in microseconds (median and p99).

    python benchmarks/guards.py            # full run, a few minutes on a laptop core
    python benchmarks/guards.py --quick    # fewer repetitions, for a smoke run
    python benchmarks/guards.py --json out.json

Each row times the guarded call and the bare call interleaved in the same loop (alternating which
goes first) and reports the difference of their medians and p99s, so noise and CPU frequency drift
hit both alike. Times are this thread's CPU time (``--clock wall`` for wall time), so on a busy
machine the time the OS gives to other processes is not counted.
The breaker's baseline is pybreaker's per-call overhead, measured in the same run.
Preflight is compared with a bare decode of the same 512x512 JPEG (open + RGB array) and the same
short prompt (UTF-8 round trip). BLAS is pinned to one thread (as a serving worker would be) unless
the environment says otherwise. The server half (requests/s with guards on vs off) is
:func:`bench_server`, filled in by the reference-server work.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from mmchaos.guard import (  # noqa: E402
    BurnRateSLO,
    CallNotPermitted,
    CircuitBreaker,
    DriftMonitor,
    Preflight,
    check_compatible,
)
from mmchaos.targets.base import Fingerprint  # noqa: E402

PROMPT = "a photo of a red bicycle leaning against a brick wall"
#: The clock per-call times are read from: this thread's CPU time by default, so time the OS gives
#: to other processes on a busy machine is not counted; ``--clock wall`` for wall time.
CLOCK: list[Callable[[], int]] = [time.thread_time_ns]


@dataclass
class Row:
    guard: str
    case: str
    median_us: float
    p99_us: float
    baseline: str
    baseline_median_us: float
    note: str = ""


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed_pair(
    guarded: Callable[[], object], bare: Callable[[], object], n: int, warmup: int = 200
) -> tuple[list[float], list[float]]:
    """Per-call times (us) of ``guarded`` and ``bare``, interleaved call by call."""
    clock = CLOCK[0]
    for _ in range(warmup):
        guarded()
        bare()
    g: list[float] = []
    b: list[float] = []
    for i in range(n):  # alternate which runs first, so cache and order effects cancel
        first, second, into_first, into_second = (guarded, bare, g, b) if i % 2 else (bare, guarded, b, g)
        t0 = clock()
        first()
        t1 = clock()
        second()
        t2 = clock()
        into_first.append((t1 - t0) / 1000.0)
        into_second.append((t2 - t1) / 1000.0)
    return g, b


def overhead(guarded: Callable[[], object], bare: Callable[[], object], n: int) -> tuple[float, float, float]:
    """(median overhead, p99 overhead, bare median) in microseconds."""
    g, b = timed_pair(guarded, bare, n)
    return (
        statistics.median(g) - statistics.median(b),
        _pct(g, 0.99) - _pct(b, 0.99),
        statistics.median(b),
    )


def noop() -> None:
    return None


def bench_breaker(n: int) -> list[Row]:
    try:
        import pybreaker
    except ImportError:  # pragma: no cover - a benchmark-only dependency
        sys.exit("pybreaker is the breaker's baseline: pip install pybreaker")
    rows = []
    ours = CircuitBreaker("bench", registry=CollectorRegistry(), tracer=False)
    theirs = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=60)
    pyb_med, pyb_p99, _ = overhead(lambda: theirs.call(noop), noop, n)
    rows.append(Row("pybreaker", "call(fn), closed", pyb_med, pyb_p99, "bare call", 0.0, "baseline"))
    wrapped = ours(noop)
    for case, fn in (
        ("call(fn), closed", lambda: ours.call(noop)),
        ("@decorator, closed", wrapped),
        ("with breaker:, closed", lambda: _with(ours)),
    ):
        med, p99, _ = overhead(fn, noop, n)
        rows.append(Row("CircuitBreaker", case, med, p99, "pybreaker call", pyb_med, f"{med / pyb_med:.2f}x pybreaker"))
    traced = CircuitBreaker("bench-otel", registry=CollectorRegistry())  # tracer=None: OTel if installed
    med, p99, _ = overhead(lambda: traced.call(noop), noop, n)
    has_otel = traced._tracer is not None
    rows.append(
        Row(
            "CircuitBreaker",
            "call(fn), OTel API installed, no active span" if has_otel else "call(fn), default tracer (no OTel)",
            med,
            p99,
            "pybreaker call",
            pyb_med,
            f"{med / pyb_med:.2f}x pybreaker",
        )
    )
    rejecting = CircuitBreaker("open", registry=CollectorRegistry(), tracer=False)
    rejecting.transition_to_forced_open()

    def reject() -> None:
        with contextlib.suppress(CallNotPermitted):
            rejecting.call(noop)

    med, p99, _ = overhead(reject, noop, n)
    rows.append(Row("CircuitBreaker", "rejected call (OPEN)", med, p99, "bare call", 0.0, "raise + catch included"))

    loop = asyncio.new_event_loop()

    async def anoop() -> None:
        return None

    async def guarded_many(k: int) -> float:
        start = CLOCK[0]()
        for _ in range(k):
            await ours.call_async(anoop)
        return (CLOCK[0]() - start) / 1000.0 / k

    async def bare_many(k: int) -> float:
        start = CLOCK[0]()
        for _ in range(k):
            await anoop()
        return (CLOCK[0]() - start) / 1000.0 / k

    per = [loop.run_until_complete(guarded_many(200)) - loop.run_until_complete(bare_many(200)) for _ in range(50)]
    loop.close()
    rows.append(
        Row("CircuitBreaker", "await call_async(fn)", statistics.median(per), _pct(per, 0.99), "await fn", 0.0,
            "per-call mean of 200-call batches")
    )  # fmt: skip
    return rows


def _with(breaker: CircuitBreaker) -> None:
    with breaker:
        pass


def make_jpeg(side: int = 512) -> bytes:
    rng = np.random.default_rng(0)
    x = np.linspace(0.0, 1.0, side)
    smooth = np.stack([np.outer(x, x), np.outer(x[::-1], x), np.outer(x, x[::-1])], axis=-1) * 200
    texture = rng.normal(0.0, 12.0, (side, side, 3))
    pixels = np.clip(smooth + texture, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def bench_preflight(n: int) -> list[Row]:
    data = make_jpeg()
    pf = Preflight(registry=CollectorRegistry(), tracer=False)

    def bare() -> object:
        # The least a server can do: decode to an array (the JPEG is RGB already: no convert).
        image = np.asarray(Image.open(io.BytesIO(data)))
        return image, PROMPT.encode("utf-8").decode("utf-8")

    def typical() -> object:
        image = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        return image, PROMPT.encode("utf-8").decode("utf-8")

    def guarded() -> object:
        return pf.image(data).array, pf.text(PROMPT)

    g, b = timed_pair(guarded, bare, n, warmup=20)
    med_g, med_b = statistics.median(g), statistics.median(b)
    rows = [
        Row(
            "Preflight",
            f"512x512 JPEG ({len(data) // 1024} KiB) + short prompt",
            med_g - med_b,
            _pct(g, 0.99) - _pct(b, 0.99),
            "bare decode",
            med_b,
            f"total {med_g:.0f} us = {100.0 * (med_g / med_b - 1.0):+.1f}% vs bare decode",
        )
    ]
    variants: list[tuple[str, dict[str, Any]]] = [
        ("OTel API installed, default tracer, no active span", {}),
        ("draft_min_side=224", {"tracer": False, "draft_min_side": 224}),
    ]
    for label, kwargs in variants:
        variant = Preflight(registry=CollectorRegistry(), **kwargs)
        if label.startswith("OTel") and variant._tracer is None:
            continue  # opentelemetry-api is not installed: the default is the no-op above

        def guarded_variant(variant: Preflight = variant) -> object:
            return variant.image(data).array, variant.text(PROMPT)

        g, b = timed_pair(guarded_variant, bare, n, warmup=20)
        med_g, med_b = statistics.median(g), statistics.median(b)
        rows.append(
            Row("Preflight", f"same, {label}", med_g - med_b, _pct(g, 0.99) - _pct(b, 0.99), "bare decode", med_b,
                f"total {med_g:.0f} us = {100.0 * (med_g / med_b - 1.0):+.1f}% vs bare decode")
        )  # fmt: skip
    g, b = timed_pair(guarded, typical, n, warmup=20)
    med_g, med_b = statistics.median(g), statistics.median(b)
    rows.append(
        Row("Preflight", "same, vs open().convert('RGB')", med_g - med_b, _pct(g, 0.99) - _pct(b, 0.99),
            "typical decode", med_b, f"total {med_g:.0f} us = {100.0 * (med_g / med_b - 1.0):+.1f}% vs typical decode")
    )  # fmt: skip
    text_only = Preflight(registry=CollectorRegistry(), tracer=False)
    med, p99, base = overhead(lambda: text_only.text(PROMPT), lambda: PROMPT.encode().decode(), n * 20)
    rows.append(Row("Preflight", "text only (short prompt)", med, p99, "UTF-8 round trip", base))
    return rows


def bench_drift(n: int) -> tuple[list[Row], dict[str, Any]]:
    rng = np.random.default_rng(0)
    dim = 512
    mean = rng.normal(size=dim)
    monitor = DriftMonitor(registry=CollectorRegistry(), tracer=False)
    monitor.update("image", mean + rng.normal(scale=0.8, size=(1000, dim)))
    one = (mean + rng.normal(scale=0.8, size=(4096, dim))).astype(np.float32)
    batch = [one[i : i + 32] for i in range(0, 4096, 32)]
    i = iter(range(10**9))
    rows = []
    med, p99, _ = overhead(lambda: monitor.update("image", one[next(i) % 4096]), noop, n)
    rows.append(Row("DriftMonitor", "update(1 x 512-d)", med, p99, "bare call", 0.0, "64 RFF features, window 200"))
    med, p99, _ = overhead(lambda: monitor.update("image", batch[next(i) % len(batch)]), noop, max(100, n // 10))
    rows.append(
        Row("DriftMonitor", "update(32 x 512-d)", med, p99, "bare call", 0.0, f"{med / 32:.1f} us per embedding")
    )
    # False alarms on clean traffic, and detection of the 002 write-up's norm jump.
    clean = DriftMonitor(registry=CollectorRegistry(), tracer=False, seed=1)
    clean.update("image", mean + rng.normal(scale=0.8, size=(1000, dim)))
    windows = 300
    results = []
    for _ in range(windows):
        results.extend(clean.update("image", mean + rng.normal(scale=0.8, size=(200, dim))))
    kl_rate = sum(any(a.test == "kl" for a in r.alarms) for r in results) / len(results)
    mmd_rate = sum(any(a.test == "mmd" for a in r.alarms) for r in results) / len(results)
    any_rate = sum(bool(r.alarms) for r in results) / len(results)
    shifted = clean.update("image", (mean + rng.normal(scale=0.8, size=(2000, dim))) * 1.2)
    detected = sum(bool(r.alarms) for r in shifted) / len(shifted)
    stats = {
        "clean_windows": len(results),
        "false_alarm_rate_kl": kl_rate,
        "false_alarm_rate_mmd": mmd_rate,
        "false_alarm_rate_any": any_rate,
        "detection_rate_norm_x1.2": detected,
    }
    return rows, stats


def bench_slo(n: int) -> list[Row]:
    slo = BurnRateSLO(name="bench", objective=0.999, registry=CollectorRegistry(), tracer=False)
    slo_latency = BurnRateSLO(
        name="bench-latency", objective=0.99, latency_threshold=0.3, registry=CollectorRegistry(), tracer=False
    )
    rows = []
    med, p99, _ = overhead(lambda: slo.record(True), noop, n)
    rows.append(Row("BurnRateSLO", "record(ok)", med, p99, "bare call", 0.0, "alerts evaluated every 10 s"))
    med, p99, _ = overhead(lambda: slo_latency.record(True, 0.1), noop, n)
    rows.append(Row("BurnRateSLO", "record(ok, latency)", med, p99, "bare call", 0.0))
    med, p99, _ = overhead(slo.alerts, noop, max(100, n // 10))
    rows.append(Row("BurnRateSLO", "alerts() (4 alerts, 7 windows)", med, p99, "bare call", 0.0))
    return rows


def bench_fingerprint(n: int) -> list[Row]:
    a = Fingerprint(weights="w" * 64, tokenizer="t" * 64, processor="p" * 64, config="c" * 64)
    b = Fingerprint(weights="w" * 64, tokenizer="t" * 64, processor="p" * 64, config="c" * 64)
    med, p99, _ = overhead(lambda: check_compatible(a, b), noop, n)
    return [Row("fingerprint", "check_compatible(a, b), equal", med, p99, "bare call", 0.0, "a startup check")]


def bench_server(
    quick: bool | None = None, *, requests: int | None = None, concurrency: int = 4, rounds: int = 3, **_: Any
) -> list[Row]:
    """Requests/s and latency of ``/v1/embeddings`` on builtin:tiny-clip, guards on vs off.

    Two reference servers (guards on, guards off) on free loopback ports in this process, the same
    target object behind both; ``concurrency`` client threads send the same bounded load (``requests``
    per round, and never more than 20 s per round) to each in turn, ``rounds`` times, alternating
    which goes first. Latency is wall time per request at the client; the figure is the guards-on /
    guards-off throughput ratio. Falls back to the numpy hash_embed fake when tiny-clip is absent.
    """
    import base64
    import threading

    import httpx

    from mmchaos.server import ServerConfig, ServerThread
    from mmchaos.targets import load_target
    from mmchaos.targets.builtin import TINY_CLIP_DIR

    quick = "--quick" in sys.argv if quick is None else quick
    requests = requests or (60 if quick else 400)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.fakes.targets, for the fallback
    fallback = "py:tests.fakes.targets:hash_embed"
    uri = "builtin:tiny-clip" if (TINY_CLIP_DIR / "model.safetensors").is_file() else fallback
    target = load_target(uri)
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (224, 224, 3), dtype=np.uint8)).save(buf, "PNG")
    image = {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()},
    }
    bodies = {
        "image": {"input": [image], "encoding_format": "base64"},
        "text": {"input": [PROMPT], "encoding_format": "base64"},
    }

    def drive(url: str, body: dict[str, Any]) -> tuple[list[float], float]:
        """Latencies (us) of ``requests`` requests from ``concurrency`` threads, and their wall time."""
        lock = threading.Lock()
        todo = [requests]
        lat: list[float] = []
        deadline = time.monotonic() + 20.0

        def worker() -> None:
            with httpx.Client(base_url=url, timeout=30.0) as client:
                while True:
                    with lock:
                        if todo[0] <= 0 or time.monotonic() > deadline:
                            return
                        todo[0] -= 1
                    t0 = time.perf_counter_ns()
                    resp = client.post("/v1/embeddings", json=body)
                    t1 = time.perf_counter_ns()
                    if resp.status_code != 200:
                        raise RuntimeError(f"benchmark request failed: {resp.status_code} {resp.text[:200]}")
                    with lock:
                        lat.append((t1 - t0) / 1000.0)

        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return lat, time.perf_counter() - start

    rows: list[Row] = []
    configs = {
        "on": ServerConfig(max_concurrency=concurrency, max_queue=4 * concurrency),
        "off": ServerConfig(guards=False, max_concurrency=concurrency),
    }
    try:
        with ServerThread(target, configs["on"]) as on, ServerThread(target, configs["off"]) as off:
            servers = {"on": on, "off": off}
            for kind, body in bodies.items():
                lat: dict[str, list[float]] = {"on": [], "off": []}
                wall: dict[str, float] = {"on": 0.0, "off": 0.0}
                for name in ("on", "off"):  # warm-up: JIT-free, but caches, pools and the drift reference
                    drive(servers[name].url, body)
                for r in range(rounds):
                    for name in ("on", "off") if r % 2 == 0 else ("off", "on"):
                        got, seconds = drive(servers[name].url, body)
                        lat[name] += got
                        wall[name] += seconds
                rps = {k: len(lat[k]) / wall[k] for k in lat}
                med = {k: statistics.median(lat[k]) for k in lat}
                p99 = {k: _pct(lat[k], 0.99) for k in lat}
                rows.append(
                    Row(
                        "server",
                        f"/v1/embeddings, 1 {kind} ({'224x224 PNG' if kind == 'image' else 'short prompt'}), "
                        f"{uri}, {concurrency} clients",
                        med["on"] - med["off"],
                        p99["on"] - p99["off"],
                        "guards off",
                        med["off"],
                        f"{rps['on']:.0f} vs {rps['off']:.0f} req/s: guards on/off = {rps['on'] / rps['off']:.2f}x; "
                        f"p50 {med['on'] / 1000:.2f} vs {med['off'] / 1000:.2f} ms, n={len(lat['on'])}",
                    )
                )
    finally:
        target.close()
    return rows


def table(rows: list[Row]) -> str:
    lines = [
        "| guard | case | overhead median (us) | overhead p99 (us) | baseline | baseline median (us) | note |",
        "|---|---|---:|---:|---|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.guard} | {r.case} | {r.median_us:.2f} | {r.p99_us:.2f} | {r.baseline} | "
            f"{r.baseline_median_us:.2f} | {r.note} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="thread CPU time or wall time")
    args = parser.parse_args(argv)
    CLOCK[0] = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns
    n = 2_000 if args.quick else 20_000
    rows = bench_breaker(n)
    rows += bench_preflight(max(100, n // 20))
    drift_rows, drift_stats = bench_drift(max(500, n // 4))
    rows += drift_rows
    rows += bench_slo(n)
    rows += bench_fingerprint(n)
    rows += bench_server()
    print(
        f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, n={n}, "
        f"{args.clock} clock, load average {os.getloadavg()[0]:.1f}"
    )
    print(table(rows))
    print()
    print("DriftMonitor on clean / shifted traffic (512-d, reference 1000, window 200):")
    for key, value in drift_stats.items():
        print(f"  {key}: {value:.4f}" if isinstance(value, float) else f"  {key}: {value}")
    if args.json:
        args.json.write_text(json.dumps({"rows": [asdict(r) for r in rows], "drift": drift_stats}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
