"""The comparison of two runs: per check, per perturbation and severity, what run B lost against run A.

Findings are matched by what they measured, never by their titles (which carry the numbers):
a degradation curve by (check, perturbation, task, metric), any other finding by its check and
the evidence that names it (``perturbation``, ``task``, ``case``...), then by its place among
the findings that share those. Curve points are judged against the tolerances; other findings
by their verdict (passed in A, fails or errors in B). What only one run has is listed, never
silently dropped, and a pair of runs with nothing in common is refused (exit 2): "no regression"
over nothing compared would be a lie.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from mmchaos.compare.runs import LoadedRun
from mmchaos.compare.tolerances import Tolerances
from mmchaos.errors import UsageError

__all__ = ["SCHEMA_VERSION", "compare_runs"]

SCHEMA_VERSION = 1
"""Version of the comparison document (docs/compare.md)."""

Json = dict[str, Any]
_SEVERITIES = tuple(range(1, 6))
_NAMING = ("perturbation", "probe", "task", "metric", "case", "part", "dtype")
_FAILED = frozenset({"fail", "error"})
_EPS = 1e-9


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _is_curve(f: Json) -> bool:
    ev, m = f.get("evidence") or {}, f.get("metrics") or {}
    return bool(ev.get("perturbation")) and bool(ev.get("metric")) and any(f"s{s}" in m for s in _SEVERITIES)


def _curve_key(f: Json) -> tuple[str, str, str, str]:
    ev = f["evidence"]
    return (f["check"], str(ev["perturbation"]), str(ev.get("task") or ev.get("probe") or ""), str(ev["metric"]))


def _finding_keys(findings: Iterable[Json]) -> dict[tuple[str, ...], Json]:
    """Every non-curve finding under (check, naming evidence..., occurrence)."""
    seen: dict[tuple[str, ...], int] = {}
    out: dict[tuple[str, ...], Json] = {}
    for f in findings:
        if _is_curve(f):
            continue
        ev = f.get("evidence") or {}
        base = (f["check"], *(f"{k}={ev[k]}" for k in _NAMING if isinstance(ev.get(k), str | int)))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out[(*base, f"#{n}")] = f
    return out


def _quality(value: float, higher_is_better: bool) -> float:
    return value if higher_is_better else 1.0 - value


def _point(severity: int, a: float, b: float, curve: Json, tolerances: Tolerances, n: int | None) -> Json:
    higher = curve["higher_is_better"]
    tol = tolerances.for_point(curve["metric"], curve["perturbation"])
    qa, qb = _quality(a, higher), _quality(b, higher)
    allowed = tol.allowed(qa, n)
    drop = qa - qb
    return {
        "severity": severity,
        "a": a,
        "b": b,
        "delta": b - a,
        "quality_drop": drop,
        "allowed_drop": allowed,
        "regressed": drop > allowed + _EPS,
        "improved": -drop > allowed + _EPS,
    }


def _curve(fa: Json, fb: Json, tolerances: Tolerances) -> tuple[Json, list[int], list[int]]:
    """The compared curve of one perturbation, and the severities only A / only B measured."""
    check, pert, task, metric = _curve_key(fa)
    ma, mb = fa["metrics"], fb["metrics"]
    curve: Json = {
        "check": check,
        "perturbation": pert,
        "task": task,
        "metric": metric,
        "higher_is_better": bool(fa["evidence"].get("higher_is_better", True)),
        "samples": _samples(fa, fb),
        "clean": {"a": _number(ma.get("clean")), "b": _number(mb.get("clean"))},
        "verdict": {"a": fa["verdict"], "b": fb["verdict"]},
    }
    points, only_a, only_b = [], [], []
    for s in _SEVERITIES:
        a, b = _number(ma.get(f"s{s}")), _number(mb.get(f"s{s}"))
        if a is not None and b is not None:
            points.append(_point(s, a, b, curve, tolerances, curve["samples"]))
        elif a is not None:
            only_a.append(s)
        elif b is not None:
            only_b.append(s)
    curve["points"] = points
    curve["regressed"] = any(p["regressed"] for p in points)
    curve["improved"] = any(p["improved"] for p in points)
    return curve, only_a, only_b


def _samples(fa: Json, fb: Json) -> int | None:
    """The smaller sample count of the two curves (each point is a mean over it), None when unknown."""
    counts = [f["evidence"].get("samples") for f in (fa, fb)]
    known = [int(c) for c in counts if isinstance(c, int) and c > 0]
    return min(known) if known else None


def _clean_curves(curves: list[Json], tolerances: Tolerances) -> list[Json]:
    """The clean score once per (check, task, metric): every perturbation of a task shares it."""
    out: dict[tuple[str, str, str], Json] = {}
    for c in curves:
        key = (c["check"], c["task"], c["metric"])
        a, b = c["clean"]["a"], c["clean"]["b"]
        if key in out or a is None or b is None:
            continue
        clean = {k: c[k] for k in ("check", "task", "metric", "higher_is_better", "samples")}
        clean["perturbation"] = "clean"
        point = _point(0, a, b, clean, tolerances, c["samples"])
        out[key] = {**clean, "points": [point], "regressed": point["regressed"], "improved": point["improved"]}
    return list(out.values())


def _finding_pair(key: tuple[str, ...], fa: Json, fb: Json, tolerances: Tolerances) -> Json:
    va, vb = fa["verdict"], fb["verdict"]
    shared = sorted(set(fa.get("metrics") or {}) & set(fb.get("metrics") or {}))
    metrics = {}
    for name in shared:
        a, b = _number(fa["metrics"][name]), _number(fb["metrics"][name])
        if a is not None and b is not None:
            metrics[name] = {"a": a, "b": b, "delta": b - a}
    return {
        "check": fa["check"],
        "key": "/".join(key),
        "title": {"a": fa["title"], "b": fb["title"]},
        "verdict": {"a": va, "b": vb},
        "metrics": metrics,
        "regressed": tolerances.verdicts and va not in _FAILED and va != "skipped" and vb in _FAILED,
        "improved": va in _FAILED and vb not in _FAILED and vb != "skipped",
    }


def _side(run: LoadedRun) -> Json:
    d = run.doc
    fp = (d.get("target") or {}).get("fingerprint") or {}
    return {
        "run_id": run.run_id,
        "source": run.source,
        "status": d.get("status"),
        "target": run.target,
        "fingerprint": fp.get("digest") if isinstance(fp, dict) else None,
        "suite": (d.get("suite") or {}).get("name"),
        "seed": d.get("seed"),
        "dataset": (d.get("dataset") or {}).get("source") or (d.get("dataset") or {}).get("name"),
        "checks": sorted({f["check"] for f in d["findings"]}),
    }


def _caveats(a: Json, b: Json) -> list[str]:
    """What makes the two runs measure different things (deltas are still given, read them so)."""
    out = []
    for key, what in (("dataset", "data"), ("seed", "seed"), ("suite", "suite")):
        if a[key] != b[key]:
            out.append(f"the runs differ in {what}: {a[key]} (A) vs {b[key]} (B)")
    for name, side in (("A", a), ("B", b)):
        if side["status"] not in (None, "complete"):
            out.append(f"run {name} ({side['run_id']}) is {side['status']}: its unfinished checks are not compared")
    return out


def compare_runs(a: LoadedRun, b: LoadedRun, tolerances: Tolerances | None = None) -> Json:
    """The comparison document of run B against run A (JSON-ready; schema in docs/compare.md)."""
    tol = tolerances or Tolerances()
    fa_all, fb_all = a.doc["findings"], b.doc["findings"]
    curves_a = {_curve_key(f): f for f in fa_all if _is_curve(f)}
    curves_b = {_curve_key(f): f for f in fb_all if _is_curve(f)}
    side_a, side_b = _side(a), _side(b)
    not_compared: list[Json] = []
    curves = []
    for key, fa in curves_a.items():
        if key not in curves_b:
            continue
        curve, only_a, only_b = _curve(fa, curves_b[key], tol)
        curves.append(curve)
        for run, sevs in (("a", only_a), ("b", only_b)):
            if sevs:
                not_compared.append({"only_in": run, "check": key[0], "what": f"{key[1]} at severities "
                                     f"{', '.join(map(str, sevs))}"})  # fmt: skip
    for run, mine, other in (("a", curves_a, curves_b), ("b", curves_b, curves_a)):
        not_compared += [{"only_in": run, "check": k[0], "what": f"{k[1]} ({k[3]})"} for k in mine if k not in other]
    keys_a, keys_b = _finding_keys(fa_all), _finding_keys(fb_all)
    pairs = [_finding_pair(k, f, keys_b[k], tol) for k, f in keys_a.items() if k in keys_b]
    for run, mine_f, other_f in (("a", keys_a, keys_b), ("b", keys_b, keys_a)):
        not_compared += [
            {"only_in": run, "check": k[0], "what": f["title"]} for k, f in mine_f.items() if k not in other_f
        ]
    checks_a = {f["check"] for f in fa_all}
    new_failures = [
        {"check": k[0], "key": "/".join(k), "title": f["title"], "verdict": f["verdict"],
         "perturbation": (f.get("evidence") or {}).get("perturbation")}
        for k, f in keys_b.items()
        if k not in keys_a and k[0] in checks_a and f["verdict"] in _FAILED and tol.verdicts
    ]  # fmt: skip
    for p in pairs:
        if "skipped" in (p["verdict"]["a"], p["verdict"]["b"]) and p["verdict"]["a"] != p["verdict"]["b"]:
            side = "a" if p["verdict"]["b"] == "skipped" else "b"
            not_compared.append(
                {"only_in": side, "check": p["check"], "what": f"{p['title'][side]} (skipped in the other run)"}
            )
    if not curves and not pairs:
        raise UsageError(
            f"runs {a.run_id} ({', '.join(side_a['checks']) or 'no findings'}) and {b.run_id} "
            f"({', '.join(side_b['checks']) or 'no findings'}) measured nothing in common; compare runs of one suite",
            code="runs_disjoint",
        )
    cleans = _clean_curves(curves, tol)
    regressions = _regressions(cleans + curves, pairs, new_failures)
    return {
        "schema_version": SCHEMA_VERSION,
        "a": side_a,
        "b": side_b,
        "tolerances": tol.model_dump(),
        "summary": {
            "exit_code": 1 if regressions else 0,
            "regressions": len(regressions),
            "regressed": sorted({r["name"] for r in regressions}),
            "improvements": sum(c["improved"] for c in cleans + curves) + sum(p["improved"] for p in pairs),
            "compared_points": sum(len(c["points"]) for c in cleans + curves),
            "compared_findings": len(pairs),
            "not_compared": len(not_compared),
        },
        "caveats": _caveats(side_a, side_b),
        "regressions": regressions,
        "curves": cleans + curves,
        "findings": pairs,
        "new_failures": new_failures,
        "not_compared": not_compared,
    }


def _finding_name(pair: Json) -> str:
    """``robustness[task=zero_shot]``: the check and the evidence that named the finding (no numbers)."""
    parts = [p for p in str(pair["key"]).split("/")[1:] if not p.startswith("#")]
    return f"{pair['check']}[{', '.join(parts)}]" if parts else str(pair["check"])


def _regressions(curves: list[Json], pairs: list[Json], new_failures: list[Json]) -> list[Json]:
    """One line per regressed point, per finding that passed in A and fails in B, and per finding
    that fails in B where A, running the same check, had none like it (a perturbation B could
    not measure, a contract case B crashes on)."""
    out: list[Json] = []
    for c in curves:
        for p in c["points"]:
            if p["regressed"]:
                where = "clean" if p["severity"] == 0 else f"{c['perturbation']} severity {p['severity']}"
                out.append({
                    "name": c["perturbation"], "check": c["check"], "severity": p["severity"], "metric": c["metric"],
                    "a": p["a"], "b": p["b"],
                    "line": f"{where}: {c['task']} {c['metric']} {p['a']:.3f} -> {p['b']:.3f} "
                    f"(lost {p['quality_drop']:.3f}, allowed {p['allowed_drop']:.3f})",
                })  # fmt: skip
    for p in pairs:
        if p["regressed"]:
            out.append({
                "name": _finding_name(p), "check": p["check"], "severity": None, "metric": "verdict",
                "a": p["verdict"]["a"], "b": p["verdict"]["b"],
                "line": f"{p['check']}: {p['verdict']['a']} -> {p['verdict']['b']}: {p['title']['b']}",
            })  # fmt: skip
    for f in new_failures:
        name = f["perturbation"] or _finding_name(f)
        out.append({
            "name": name, "check": f["check"], "severity": None, "metric": "verdict", "a": None, "b": f["verdict"],
            "line": f"{f['check']}: {f['verdict']} in B only: {f['title']}",
        })  # fmt: skip
    return out
