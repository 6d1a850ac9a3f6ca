"""PromQL steady-state probes: scrape ``/metrics`` through an experiment, judge expressions on it.

A probe is a PromQL expression that must *hold* (return a non-empty vector, as an alert rule fires)
at the end of each phase it names: ``sum without (state) (mmchaos_breaker_state{state="closed"}) == 1``
(the breaker is closed), ``sum(increase(mmchaos_server_requests_total[2s])) > 0`` (requests keep
being counted). It catches a server whose SLO holds while its telemetry lies: a breaker gauge stuck
open, a counter that never moves, a drift alarm raised by the fault and never cleared.

Engines. ``promtool`` (Prometheus's own PromQL engine, offline): the scrapes become a
``promtool test rules`` input (scrape *k* at ``k * interval``, a series missing from a scrape is
``stale``), each probe an alert ``absent((expr))`` expected not to fire at the last scrape; a
failing case names the probe. ``python``: the subset in :mod:`mmchaos.chaos.promql`. ``auto``:
promtool where it is on PATH, else the subset. The engine used is in each result.
"""

from __future__ import annotations

import logging
import math
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from mmchaos.chaos.promql import Labels, PromQLError, Scrape, evaluate, holds, parse_scrape
from mmchaos.chaos.spec import PromQLProbeSpec, PromQLSpec

__all__ = ["MetricsScraper", "PromQLProbes", "describe_failures", "evaluate_probes", "promtool_input", "promtool_path"]

log = logging.getLogger("mmchaos.chaos")


def promtool_path() -> str | None:
    return shutil.which("promtool")


class MetricsScraper:
    """Scrapes ``url`` every ``interval_s`` on a thread until :meth:`stop` (at most ``max_scrapes``
    kept, the oldest dropped). A failed scrape is counted, not fatal: a server that stops answering
    ``/metrics`` shows as missing series, which is what a probe then sees."""

    def __init__(self, url: str, interval_s: float, max_scrapes: int, *, verify: Any = True) -> None:
        self.url, self.interval_s = url, interval_s
        self._scrapes: deque[Scrape] = deque(maxlen=max_scrapes)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._verify = verify
        self.failures = 0
        self.last_error = ""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mmchaos-metrics-scraper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=max(1.0, self.interval_s * 4), verify=self._verify) as client:
            while not self._stop.is_set():
                self.scrape_once(client)
                self._stop.wait(self.interval_s)

    def scrape_once(self, client: Any) -> None:
        t = time.monotonic()
        try:
            resp = client.get(self.url)
            resp.raise_for_status()
            scrape = parse_scrape(t, resp.text)
        except Exception as exc:  # a refused connection, a 5xx, unparseable text: all "no scrape"
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            return
        with self._lock:
            self._scrapes.append(scrape)

    def scrapes(self) -> list[Scrape]:
        with self._lock:
            return list(self._scrapes)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)

    def summary(self) -> dict[str, Any]:
        got = self.scrapes()
        return {"url": self.url, "scrapes": len(got), "failures": self.failures, "last_error": self.last_error}


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Inf" if v > 0 else "-Inf"
    return repr(v)


def _series_name(labels: Labels) -> str:
    d = dict(labels)
    name = d.pop("__name__", "")
    body = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34)).replace(chr(10), "")}"'
        for k, v in sorted(d.items())
    )
    return f"{name}{{{body}}}"


def promtool_input(scrapes: Sequence[Scrape], interval_s: float) -> tuple[list[dict[str, str]], float]:
    """The scrapes as promtool input series on a grid of ``interval_s`` and the last slot's time (s)."""
    t0 = scrapes[0].t
    slots: dict[int, Scrape] = {}
    for s in scrapes:
        slots[round((s.t - t0) / interval_s)] = s  # two scrapes in one slot: the later wins
    last = max(slots)
    keys: dict[Labels, None] = {}
    for s in scrapes:
        keys.update(dict.fromkeys(s.samples))
    series = []
    for key in keys:
        values: list[str] = []
        seen = False
        for i in range(last + 1):
            slot = slots.get(i)
            if slot is None:
                values.append("_")
            elif key in slot.samples:
                values.append(_fmt(slot.samples[key]))
                seen = True
            else:
                values.append("stale" if seen else "_")
        series.append({"series": _series_name(key), "values": " ".join(values)})
    return series, last * interval_s


def _referenced(probes: Sequence[PromQLProbeSpec], scrapes: Sequence[Scrape]) -> list[Scrape]:
    """Only the series whose name appears in some probe (every word of the expressions counts, so
    this keeps a superset); all of them where a probe selects by ``__name__``. A real /metrics has
    hundreds of series, and promtool reads every value of each."""
    words = {w for p in probes for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", p.expr)}
    if "__name__" in words:
        return list(scrapes)
    return [Scrape(s.t, {k: v for k, v in s.samples.items() if dict(k).get("__name__") in words}) for s in scrapes]


def _promtool(probes: Sequence[PromQLProbeSpec], scrapes: Sequence[Scrape], interval_s: float) -> list[dict[str, Any]]:
    exe = promtool_path()
    assert exe is not None
    series, eval_s = promtool_input(_referenced(probes, scrapes), interval_s)
    ms = max(1, round(interval_s * 1000))
    rules = {
        "groups": [
            {
                "name": "mmchaos-probes",
                "rules": [{"alert": f"MMChaosProbe{i}", "expr": f"absent(({p.expr}))"} for i, p in enumerate(probes)],
            }
        ]
    }
    tests = {
        "rule_files": ["probes.rules.yml"],
        "evaluation_interval": f"{ms}ms",
        "tests": [
            {
                "interval": f"{ms}ms",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": f"{round(eval_s * 1000)}ms", "alertname": f"MMChaosProbe{i}", "exp_alerts": []}
                    for i in range(len(probes))
                ],
            }
        ],
    }
    with tempfile.TemporaryDirectory(prefix="mmchaos-promql-") as tmp:
        (Path(tmp) / "probes.rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False, width=10_000))
        (Path(tmp) / "probes.test.yml").write_text(yaml.safe_dump(tests, sort_keys=False, width=10_000))
        try:
            proc = subprocess.run(
                [exe, "test", "rules", "probes.test.yml"], capture_output=True, text=True, timeout=120, cwd=tmp
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [{"holds": False, "error": f"promtool did not run: {exc}"} for _ in probes]
    out = proc.stdout + proc.stderr
    failed = {int(m.group(1)) for m in re.finditer(r"alertname: MMChaosProbe(\d+),", out)}
    if proc.returncode != 0 and not failed:
        error = "promtool refused the probes: " + " ".join(out.split())[:500]
        return [{"holds": False, "error": error} for _ in probes]
    return [{"holds": i not in failed, "error": None} for i in range(len(probes))]


def _python(probes: Sequence[PromQLProbeSpec], scrapes: Sequence[Scrape]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in probes:
        try:
            value = evaluate(p.expr, scrapes)
        except PromQLError as exc:
            out.append({"holds": False, "error": f"outside the PromQL subset: {exc}"})
            continue
        shown: Any = (
            {",".join(f"{k}={v}" for k, v in sorted(labels)): x for labels, x in list(value.items())[:10]}
            if isinstance(value, dict)
            else value
        )
        out.append({"holds": holds(value), "error": None, "value": shown})
    return out


def evaluate_probes(spec: PromQLSpec, scrapes: Sequence[Scrape], phase: str) -> list[dict[str, Any]]:
    """Each probe that names ``phase``, judged on ``scrapes``: name, expr, engine, holds, error."""
    probes = [p for p in spec.probes if phase in p.phases]
    if not probes:
        return []
    engine = spec.engine
    if engine == "auto":
        engine = "promtool" if promtool_path() is not None else "python"
    if not scrapes:
        results: list[dict[str, Any]] = [{"holds": False, "error": "no scrape of /metrics succeeded"} for _ in probes]
    elif engine == "promtool":
        if promtool_path() is None:
            results = [{"holds": False, "error": "engine promtool: promtool is not on PATH"} for _ in probes]
        else:
            results = _promtool(probes, scrapes, spec.scrape_interval_s)
    else:
        results = _python(probes, scrapes)
    return [
        {"name": p.name or p.expr, "expr": p.expr, "phase": phase, "engine": engine, "scrapes": len(scrapes), **r}
        for p, r in zip(probes, results, strict=True)
    ]


class PromQLProbes:
    """The probes of one experiment: a scraper from the experiment's start to its rollback, and the
    results of every phase judged so far (a probe that failed ``during`` a fault fails ``after``)."""

    def __init__(self, spec: PromQLSpec, root: str, *, verify: Any = True) -> None:
        self.spec = spec
        self.scraper = MetricsScraper(root + spec.metrics_path, spec.scrape_interval_s, spec.max_scrapes, verify=verify)
        self.failed: list[dict[str, Any]] = []

    def start(self) -> None:
        self.scraper.start()

    def check(self, phase: str, label: str) -> list[dict[str, Any]]:
        """The probes for ``phase`` at the end of the phase ``label`` (one fresh scrape first, so the
        phase's last moments are in)."""
        if not any(phase in p.phases for p in self.spec.probes):
            return []
        import httpx

        with httpx.Client(timeout=5.0, verify=self.scraper._verify) as client:
            self.scraper.scrape_once(client)
        results = evaluate_probes(self.spec, self.scraper.scrapes(), phase)
        for r in results:
            r["at"] = label
            if not r["holds"]:
                self.failed.append(r)
        return results

    def stop(self) -> dict[str, Any]:
        self.scraper.stop()
        return {**self.scraper.summary(), "probes": [p.model_dump() for p in self.spec.probes]}


def describe_failures(failed: Sequence[dict[str, Any]]) -> str:
    """One line for the journal's ``why``."""
    parts = [f"{r['name']} ({r['at']}{': ' + r['error'] if r.get('error') else ''})" for r in failed[:5]]
    more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
    return "PromQL probes did not hold: " + "; ".join(parts) + more
