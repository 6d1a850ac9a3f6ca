"""Why the continuous engine is slower inside `mmchaos serve` than in a bare process: the GIL.

Two measurements in one run, on one model (default builtin:tiny-vlm):

1. A bare decoding step of 4 rows (``StepDecoder.step``, median of 200), alone, next to a
   pure-Python thread of this process busy ``--duty`` of the time (what request threads are), and
   next to a busy *process* (what another core's work is). torch releases the GIL around each op
   and takes it again, so a thread that wants it slows every op of a small model; a process does not.
2. The engine's own passes inside a server on loopback (this process; the load driver, the
   benchmarks' closed-loop chat clients, in a child process): the mean time of a prefill (with the
   processor) and of a step, the rows a step and the joiners a prefill, against the bare ones.

    python benchmarks/serve_contention.py [--target builtin:tiny-vlm] [--requests 192] [--concurrency 4]
        [--duty 0.2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import serve_generate as sg  # noqa: E402  (the benchmarks' request bodies and load driver)


def _median_ms(fn: Callable[[], Any], runs: int = 200) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def _busy_thread(duty: float, stop: threading.Event) -> None:
    """Pure Python for ``duty`` of each millisecond, asleep for the rest."""
    while not stop.is_set():
        start = time.perf_counter()
        while time.perf_counter() - start < 0.001 * duty:
            sum(range(100))
        time.sleep(0.001 * (1 - duty))


def bare_steps(target: Any, duty: float) -> dict[str, float]:
    from mmchaos.targets.generation import Message

    decoder = target.step_decoder()
    chats = [[Message("user", (img, sg.QUESTION))] for img in sg._images(4)]
    inputs = decoder.inputs(chats)
    batch = decoder.new_batch()
    decoder.join(batch, inputs)

    def step() -> None:
        decoder.step(batch, [5] * len(batch))
        batch.keep(range(len(batch)))

    def prefill() -> None:
        decoder.join(decoder.new_batch(), decoder.inputs(chats[:1]))

    out = {"prefill_alone_ms": _median_ms(prefill, 30), "step_alone_ms": _median_ms(step)}
    stop = threading.Event()
    thread = threading.Thread(target=_busy_thread, args=(duty, stop), daemon=True)
    thread.start()
    try:
        out["step_with_thread_ms"] = _median_ms(step)
    finally:
        stop.set()
        thread.join()
    hog = subprocess.Popen([sys.executable, "-c", "while True: sum(range(1000))"])
    try:
        out["step_with_process_ms"] = _median_ms(step)
    finally:
        hog.kill()
        hog.wait()
    return out


def served_passes(target: Any, requests: int, concurrency: int) -> dict[str, float]:
    from mmchaos.server.thread import ServerThread

    with ServerThread(target) as srv:
        engine = srv.state.continuous
        if engine is None:
            raise SystemExit(f"{target.uri} does not decode step by step: no continuous engine to time")
        passes: dict[str, list[float]] = {"prefill": [], "step": []}

        def timed(kind: str, fn: Callable[..., None]) -> Callable[..., None]:
            def run(*args: Any) -> None:
                start = time.perf_counter()
                fn(*args)
                passes[kind].append(time.perf_counter() - start)

            return run

        engine._join = timed("prefill", engine._join)  # type: ignore[method-assign]
        engine._step = timed("step", engine._step)  # type: ignore[method-assign]
        driver = (
            f"import sys; sys.path.insert(0, {str(HERE)!r}); import serve_generate as sg\n"
            f"images = sg._images({requests}); sg._warm({srv.url!r}, images, 16)\n"
            f"r = sg._served({srv.url!r}, images, {concurrency}, {requests // concurrency}, 16)\n"
            "assert r['answered'] == len(images), r\n"
        )
        for kind in passes:
            passes[kind].clear()
        steps_before, joins_before = engine.steps, len(engine.joins)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        subprocess.run([sys.executable, "-c", driver], check=True, env=env)
        sizes = engine.sizes[-(engine.steps - steps_before) :] if engine.steps > steps_before else [0]
        joins = engine.joins[joins_before:] or [0]
    return {
        "prefill_served_ms": statistics.mean(passes["prefill"]) * 1000,
        "step_served_ms": statistics.mean(passes["step"]) * 1000,
        "rows_a_step": statistics.mean(sizes),
        "joiners_a_prefill": statistics.mean(joins),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="builtin:tiny-vlm")
    ap.add_argument("--requests", type=int, default=192)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--duty", type=float, default=0.2, help="share of each ms the Python thread is busy")
    args = ap.parse_args()
    from mmchaos.targets import load_target

    target = load_target(args.target)
    bare = bare_steps(target, args.duty)
    served = served_passes(target, args.requests, args.concurrency)
    print(f"{args.target}, 4 rows a bare step; served: {args.requests} requests at concurrency {args.concurrency}")
    step, prefill = bare["step_alone_ms"], bare["prefill_alone_ms"]
    rows = [
        ("bare step alone", step, step, ""),
        (f"bare step, Python thread {args.duty:.0%}", bare["step_with_thread_ms"], step, ""),
        ("bare step, busy process", bare["step_with_process_ms"], step, ""),
        ("served step", served["step_served_ms"], step, f", {served['rows_a_step']:.2f} rows a step"),
        ("bare prefill of 1 (+inputs)", prefill, prefill, ""),
        ("served prefill", served["prefill_served_ms"], prefill, f", {served['joiners_a_prefill']:.2f} joiners each"),
    ]
    for label, ms, base, extra in rows:
        print(f"  {label:<29} {ms:6.2f} ms ({ms / base:.2f}x){extra}")


if __name__ == "__main__":
    main()
