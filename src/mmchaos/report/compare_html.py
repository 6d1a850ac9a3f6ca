"""``compare.html``: run B against run A on one page, each perturbation's two curves on one plot.

It draws with the run report's own chart code (:mod:`mmchaos.report.html`), so a comparison and
a run plot the same axes, colours and severities the same way.
"""

from __future__ import annotations

from html import escape
from typing import Any

from mmchaos.report.html import _CSS, _badge, _legend, _meta, _num, _svg

__all__ = ["render_compare_html"]

Json = dict[str, Any]

_EXTRA_CSS = """
td.reg{background:#ffebe9;color:#cf222e;font-weight:600}td.imp{background:#dafbe1;color:#1a7f37}
ul.lines{margin:4px 0 0 18px;padding:0}ul.lines li{margin:2px 0}
"""


def _e(value: object) -> str:
    return escape("" if value is None else str(value))


def _series(curve: Json, labels: tuple[str, str]) -> list[tuple[str, list[tuple[float, float]]]]:
    out = []
    for side, label in zip(("a", "b"), labels, strict=True):
        pts = [(0.0, float(curve["clean"][side]))] if (curve.get("clean") or {}).get(side) is not None else []
        pts += [(float(p["severity"]), float(p[side])) for p in curve["points"]]
        out.append((label, pts))
    return out


def _chart(curve: Json, labels: tuple[str, str]) -> str:
    status = "regressed" if curve["regressed"] else "improved" if curve["improved"] else "within tolerance"
    cls = "fail" if curve["regressed"] else "pass" if curve["improved"] else ""
    badge = f'<span class="badge {cls}">{status}</span>'
    direction = "higher is better" if curve["higher_is_better"] else "lower is better"
    series = _series(curve, labels)
    return (
        f'<div class="chart"><h3>{_e(curve["perturbation"])} {badge}</h3>'
        f'<div class="muted">{_e(curve["check"])} · {_e(curve["task"])} · {_e(curve["metric"])} ({direction})</div>'
        f"{_svg(str(curve['metric']), series)}{_legend([n for n, _ in series])}</div>"
    )


def _cell(point: Json) -> str:
    cls = ' class="reg"' if point["regressed"] else ' class="imp"' if point["improved"] else ' class="num"'
    title = f"A {point['a']:.4g} → B {point['b']:.4g}, allowed drop {point['allowed_drop']:.3g}"
    return f'<td{cls} title="{_e(title)}">{point["delta"]:+.3f}</td>'


def _delta_table(curves: list[Json]) -> str:
    sevs = sorted({p["severity"] for c in curves for p in c["points"]})
    head = "".join(f"<th>{'clean' if s == 0 else f's{s}'}</th>" for s in sevs)
    rows = []
    for c in curves:
        by_sev = {p["severity"]: p for p in c["points"]}
        cells = "".join(_cell(by_sev[s]) if s in by_sev else "<td></td>" for s in sevs)
        rows.append(f"<tr><td>{_e(c['perturbation'])}</td><td>{_e(c['check'])} · {_e(c['task'])} · "
                    f"{_e(c['metric'])}</td>{cells}</tr>")  # fmt: skip
    return (
        "<h3>Change B − A per severity (red: lost more than the tolerance allows)</h3>"
        f"<table><tr><th>perturbation</th><th>check · task · metric</th>{head}</tr>{''.join(rows)}</table>"
    )


def _findings(pairs: list[Json]) -> str:
    rows = []
    for p in pairs:
        cls = ' class="reg"' if p["regressed"] else ' class="imp"' if p["improved"] else ""
        metrics = ", ".join(f"{k} {m['a']:.3g} → {m['b']:.3g}" for k, m in p["metrics"].items() if m["delta"] != 0)
        rows.append(
            f"<tr><td>{_e(p['check'])}</td><td>{_e(p['title']['b'])}</td><td>{_badge(p['verdict']['a'])}</td>"
            f"<td{cls}>{_badge(p['verdict']['b'])}</td><td>{_e(metrics or 'unchanged')}</td></tr>"
        )
    head = "<tr><th>check</th><th>finding (B)</th><th>A</th><th>B</th><th>metrics that changed</th></tr>"
    return f"<section><h2>Other findings ({len(pairs)})</h2><table>{head}{''.join(rows)}</table></section>"


def _side(label: str, side: Json) -> str:
    rows = [("run", f"<code>{_e(side['run_id'])}</code>"), ("target", f"<code>{_e(side['target'])}</code>"),
            ("fingerprint", f"<code>{_e(side['fingerprint'] or '—')}</code>"), ("suite", _e(side["suite"])),
            ("data", _e(side["dataset"])), ("seed", _e(side["seed"])), ("from", _e(side["source"]))]  # fmt: skip
    return f"<div><h3>{_e(label)}</h3>{_meta(rows)}</div>"


def _banner(doc: Json) -> str:
    s = doc["summary"]
    ok = s["exit_code"] == 0
    label = "NO REGRESSION" if ok else f"{s['regressions']} REGRESSION{'S' if s['regressions'] != 1 else ''}"
    return (
        f'<div class="banner {"pass" if ok else "fail"}"><b>{label}</b>'
        f"<div>{_e(s['compared_points'])} curve points, {_e(s['compared_findings'])} findings compared</div>"
        f"<div>{_e(s['improvements'])} improved · {_e(s['not_compared'])} not compared</div>"
        f"<div>exit code {_e(s['exit_code'])}</div></div>"
    )


def _lines(title: str, items: list[str]) -> str:
    if not items:
        return ""
    return f'<h3>{_e(title)}</h3><ul class="lines">{"".join(f"<li>{_e(i)}</li>" for i in items)}</ul>'


def render_compare_html(doc: Json) -> str:
    """The comparison document as one self-contained HTML page; every string is escaped."""
    a, b = doc["a"], doc["b"]
    labels = (f"A {a['run_id']}", f"B {b['run_id']}")
    curves = doc["curves"]
    regressed = [r["line"] for r in doc["regressions"]]
    missing = [f"only in {'A' if n['only_in'] == 'a' else 'B'}: {n['check']}: {n['what']}" for n in doc["not_compared"]]
    head = (
        f"<section><h1>mmchaos compare · {_e(b['target'])} against {_e(a['target'])}</h1>"
        f'<div class="top">{_side(labels[0], a)}{_side(labels[1], b)}{_banner(doc)}</div>'
        f"{_lines('Regressions', regressed)}{_lines('Caveats', doc['caveats'])}"
        f"{_lines('Not compared', missing)}</section>"
    )
    tol = doc["tolerances"]["default"]
    curves_html = ""
    if curves:
        charts = "".join(_chart(c, labels) for c in curves if c["perturbation"] != "clean")
        curves_html = (
            f'<section><h2>Degradation curves, A and B</h2><p class="sub">default tolerance: a drop larger than '
            f"{_num(tol['relative'])} of A's quality and larger than {_num(tol['absolute'])} regresses</p>"
            f'<div class="charts">{charts}</div>{_delta_table(curves)}</section>'
        )
    body = head + curves_html + (_findings(doc["findings"]) if doc["findings"] else "")
    title = f"mmchaos compare {a['run_id']} .. {b['run_id']}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}{_EXTRA_CSS}</style></head><body><main>{body}</main></body></html>\n"
    )
