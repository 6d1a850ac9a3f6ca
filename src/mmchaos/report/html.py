"""``report.html``: one self-contained page per run (inline CSS, inline SVG, base64 PNG images)."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from html import escape
from typing import Any

from mmchaos import __version__
from mmchaos.report.results import NOT_AVAILABLE

__all__ = ["render_html"]

Json = dict[str, Any]
Series = tuple[str, list[tuple[float, float]]]

_STATUS_CLASS = {"pass": "pass", "fail": "fail", "error": "error", NOT_AVAILABLE: "na"}
_SEVERITIES = ("info", "low", "medium", "high", "critical")
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
            "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip
_DASHES = ("", "6 3", "2 2", "8 3 2 3")
_W, _H, _ML, _MR, _MT, _MB = 360, 210, 46, 12, 12, 34

_CSS = """
body{margin:0;background:#f6f8fa;color:#1f2328;font:14px/1.45 system-ui,"Segoe UI",Arial,sans-serif}
main{max-width:1200px;margin:0 auto;padding:20px}*{box-sizing:border-box}code{font-size:12px}
section{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:14px 18px;margin:0 0 16px}
h1{font-size:22px;margin:0 0 2px}h2{font-size:17px;margin:0 0 10px}h3{font-size:14px;margin:8px 0}
.sub{color:#59636e;margin:0 0 10px}.muted{color:#8c959f}tr.na td{color:#8c959f;font-style:italic}
.top{display:flex;gap:18px;flex-wrap:wrap}.top>dl{flex:1;min-width:420px}
dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:0}
dl.meta dt{color:#59636e}dl.meta dd{margin:0;word-break:break-word}
.banner{align-self:flex-start;min-width:260px;border-radius:8px;padding:12px 18px;color:#fff}
.banner{text-align:center}.banner.pass{background:#1a7f37}.banner.fail{background:#cf222e}
.banner b{display:block;font-size:40px;letter-spacing:2px;line-height:1.1}
.bar{height:8px;background:#ffffff59;border-radius:4px;margin:6px 0 2px;overflow:hidden}
.bar i{display:block;height:100%;background:#fff}table{border-collapse:collapse;width:100%}
th,td{padding:4px 8px;border-bottom:1px solid #eaeef2;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.num,td.heat{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:0 7px;border-radius:10px;font-size:12px;font-weight:600}
.badge{background:#eaeef2;color:#59636e;white-space:nowrap}.badge.pass{background:#dafbe1;color:#1a7f37}
.badge.fail{background:#ffebe9;color:#cf222e}.badge.warn{background:#fff8c5;color:#9a6700}.badge.error{background:#fff1e5;color:#bc4c00}
.badge.na{background:#f6f8fa;color:#8c959f;font-weight:400;font-style:italic}
.sev{font-size:12px;font-weight:600}.sev-critical,.sev-high{color:#cf222e}.sev-medium{color:#bc4c00}
.sev-low{color:#9a6700}.sev-info{color:#8c959f}.charts{display:flex;flex-wrap:wrap;gap:16px}
.chart{border:1px solid #eaeef2;border-radius:6px;padding:8px}svg line{stroke:#eaeef2}
.legend{display:flex;flex-wrap:wrap;gap:2px 12px;max-width:360px;font-size:12px}
svg text{font:11px sans-serif;fill:#59636e}details>summary{cursor:pointer;color:#0969da}
pre{background:#f6f8fa;border:1px solid #eaeef2;border-radius:6px;padding:6px 8px;margin:4px 0}
pre{max-height:360px;overflow:auto;font-size:12px;white-space:pre-wrap;word-break:break-word}
.cases{display:flex;flex-wrap:wrap;gap:12px;margin:8px 0}details.case{margin:6px 0}
.card{border:1px solid #d0d7de;border-radius:6px;padding:8px;min-width:300px;max-width:560px}
.card{font-size:12px}.pair{display:flex;flex-wrap:wrap;gap:8px}figure{margin:0;text-align:center}
figcaption{font-size:11px;color:#59636e}img{height:auto;border:1px solid #d0d7de}
img.px{image-rendering:pixelated}.texts pre{max-height:120px}tr.detail td{border-bottom-width:2px}
"""


def _e(value: object) -> str:
    return escape("" if value is None else str(value))


def _json(value: object, compact: bool = False) -> str:
    text = json.dumps(value, indent=None if compact else 2, default=str, ensure_ascii=False)
    return _e(text)


def _num(value: object, fmt: str = ".3g") -> str:
    return format(value, fmt) if isinstance(value, int | float) else _e(value)


def _badge(status: object) -> str:
    cls = _STATUS_CLASS.get(str(status), "")
    return f'<span class="badge {cls}">{_e(status)}</span>'


def _img(name: object, artifacts: Mapping[str, bytes], alt: str) -> str:
    data = artifacts.get(str(name))
    if data is None:
        return f'<span class="muted">missing artifact {_e(name)}</span>'
    b64 = base64.b64encode(data).decode("ascii")
    width = int.from_bytes(data[16:20], "big") if data[:8] == b"\x89PNG\r\n\x1a\n" else 128
    cls, shown = ("px", width * (128 // width)) if 0 < width < 128 else ("", min(width, 520))
    return f'<img class="{cls}" width="{shown}" alt="{_e(alt)}" src="data:image/png;base64,{b64}">'


def _meta(rows: list[tuple[str, str]]) -> str:
    """A definition list; values are already-escaped HTML."""
    return '<dl class="meta">' + "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


def _fingerprint(fp: Json) -> str:
    rows = [(k, f'<code title="{_e(fp[k])}">{_e(str(fp[k])[:16])}</code>') for k in
            ("weights", "tokenizer", "processor", "config") if fp.get(k)]  # fmt: skip
    rows += [(str(k), _e(v)) for k, v in (fp.get("versions") or {}).items()]
    body = _meta(rows) if rows else '<span class="muted">no component hashes</span>'
    return f"<details><summary>components</summary>{body}</details>"


def _dataset(ds: Json) -> str:
    size = f"{ds.get('size')} samples, {ds.get('classes')} classes"
    parts = [ds.get("source"), size, ", ".join(map(str, ds.get("fields") or []))]
    return f"<b>{_e(ds.get('name'))}</b> · " + " · ".join(_e(p) for p in parts if p) if ds else "—"


def _banner(summary: Json) -> str:
    ok = bool(summary.get("gates_passed"))
    v = summary.get("verdicts") or {}
    counts = " · ".join(f"{_e(v.get(k, 0))} {k}" for k in ("pass", "warn", "fail", "error", "skipped"))
    wall, model = float(summary.get("wall_seconds") or 0), float(summary.get("model_seconds") or 0)
    share = min(1.0, model / wall) if wall > 0 else 0.0
    incomplete = summary.get("incomplete_checks") or []
    extra = f"<div>not finished: {_e(', '.join(map(str, incomplete)))}</div>" if incomplete else ""
    untested = [f"{u.get('step')} {u.get('name')}" for u in summary.get("untested_steps") or []]
    label = ("PASS, BUT STEPS UNTESTED" if untested else "PASS") if ok else "INCOMPLETE" if incomplete else "FAIL"
    if untested:
        extra += f"<div>untested steps (every check skipped): {_e(', '.join(untested))}</div>"
    return (
        f'<div class="banner {"pass" if ok else "fail"}"><b>{label}</b>'
        f"<div>{counts}</div>{extra}<div>exit code {_e(summary.get('exit_code'))}</div>"
        f'<div class="bar" title="model time / wall time"><i style="width:{share:.0%}"></i></div>'
        f"<div>wall {wall:.1f} s · model {model:.1f} s ({share:.0%})</div></div>"
    )


def _header(r: Json) -> str:
    suite, target = r.get("suite") or {}, r.get("target") or {}
    fp = target.get("fingerprint") or {}
    version = (r.get("environment") or {}).get("mmchaos", __version__)
    rows = [
        ("target", f"<code>{_e(target.get('uri'))}</code>"),
        ("run id", f"<code>{_e(r.get('run_id'))}</code>"),
        ("status", _e(r.get("status"))),
        ("created", _e(r.get("created"))),
        ("finished", _e(r.get("finished") or "—")),
        ("seed", _e(r.get("seed"))),
        ("fingerprint", f"<code>{_e(fp.get('digest') or '—')}</code> {_fingerprint(fp)}"),
        ("dataset", _dataset(r.get("dataset") or {})),
        ("mmchaos", _e(version)),
    ]
    return (
        f"<section><h1>mmchaos · {_e(suite.get('name'))}</h1>"
        f'<p class="sub">{_e(suite.get("description") or "")}</p>'
        f'<div class="top">{_meta(rows)}{_banner(r.get("summary") or {})}</div>'
        f"{_checks(r.get('checks') or [])}</section>"
    )


def _checks(checks: list[Json]) -> str:
    rows = "".join(
        f"<tr><td>{_e(c.get('id'))}</td><td>{_badge(c.get('status'))}</td>"
        f'<td class="num">{_num(c.get("wall_seconds"), ".2f")}</td>'
        f'<td class="num">{_num(c.get("model_seconds"), ".2f")}</td>'
        f'<td class="num">{_e(c.get("model_calls"))}</td></tr>'
        for c in checks
    )
    head = "".join(f"<th>{c}</th>" for c in ("check", "status", "wall s", "model s", "calls"))
    table = f"<table><tr>{head}</tr>{rows}</table>"
    return f"<details><summary>checks and timings</summary>{table}</details>"


def _steps(steps: list[Json]) -> str:
    rows = []
    for st in steps:
        status = str(st.get("status", ""))
        counts = ", ".join(f"{n} {k}" for k, n in (st.get("verdicts") or {}).items() if n)
        cls = ' class="na"' if status == NOT_AVAILABLE else ""
        rows.append(
            f"<tr{cls}><td>{_e(st.get('step'))}</td><td>{_e(st.get('name'))}</td>"
            f"<td>{_badge(status)}</td><td>{_e(counts)}</td></tr>"
        )
    head = "<tr><th>step</th><th>name</th><th>status</th><th>findings</th></tr>"
    return f"<section><h2>Steps</h2><table>{head}{''.join(rows)}</table></section>"


def _points(f: Json) -> list[tuple[float, float]]:
    m = f["metrics"]
    keys = ("clean", "s1", "s2", "s3", "s4", "s5")
    pts = [(float(s), float(m[k])) for s, k in enumerate(keys) if isinstance(m.get(k), int | float)]
    return [(x, y) for x, y in pts if math.isfinite(y)]


def _group_key(f: Json) -> str:
    ev = f["evidence"]
    return f"{ev.get('task', '?')} · {ev.get('metric', '?')}"


def _style(i: int) -> tuple[str, str]:
    return _PALETTE[i % len(_PALETTE)], _DASHES[i // len(_PALETTE) % len(_DASHES)]


def _svg(
    metric: str, series: list[Series], x_label: str = "severity (0 = clean)", x_ticks: list[float] | None = None
) -> str:
    values = [y for _, pts in series for _, y in pts] or [0.0]
    lo, hi = min(0.0, *values), max(values)
    hi = 1.0 if 0.0 < hi <= 1.0 else hi if hi > lo else lo + 1.0
    x_max = max(x_ticks) if x_ticks else max([5.0] + [x for _, pts in series for x, _ in pts])
    ticks = x_ticks or [float(x) for x in range(int(x_max) + 1)]

    def px(x: float) -> float:
        return _ML + x / x_max * (_W - _ML - _MR)

    def py(y: float) -> float:
        return _MT + (hi - y) / (hi - lo) * (_H - _MT - _MB)

    out = [f'<svg width="{_W}" height="{_H}" role="img">']
    for i in range(5):
        y = lo + i * (hi - lo) / 4
        out.append(f'<line x1="{_ML}" x2="{_W - _MR}" y1="{py(y):.1f}" y2="{py(y):.1f}"/>')
        out.append(f'<text x="{_ML - 4}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.3g}</text>')
    for x in ticks:
        out.append(f'<text x="{px(x):.1f}" y="{_H - _MB + 14}" text-anchor="middle">{x:g}</text>')
    mid = (_ML + _W) / 2
    out.append(f'<text x="{mid:.0f}" y="{_H - 4}" text-anchor="middle">{_e(x_label)}</text>')
    out.append(f'<text x="12" y="{_MT + 40}" transform="rotate(-90 12 {_MT + 40})" '
               f'text-anchor="end">{_e(metric)}</text>')  # fmt: skip
    for i, (name, pts) in enumerate(series):
        colour, dash = _style(i)
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2" '
                   f'stroke-dasharray="{dash}"><title>{_e(name)}</title></polyline>')  # fmt: skip
        out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{colour}">'
                f"<title>{_e(name)} {x:g}: {y:.4g}</title></circle>" for x, y in pts]  # fmt: skip
    return "".join(out) + "</svg>"


def _legend(names: list[str]) -> str:
    keys = [(*_style(i), name) for i, name in enumerate(names)]
    return '<div class="legend">' + "".join(
        f'<span><svg width="18" height="8"><path d="M0 4H18" stroke="{c}" stroke-width="2" '
        f'stroke-dasharray="{d}"/></svg> {_e(n)}</span>' for c, d, n in keys
    ) + "</div>"  # fmt: skip


def _chart(key: str, group: list[Json]) -> str:
    ev = group[0]["evidence"]
    direction = "higher is better" if ev.get("higher_is_better", True) else "lower is better"
    series = [(str(f["evidence"].get("perturbation", f["title"])), _points(f)) for f in group]
    return (
        f'<div class="chart"><h3>{_e(key)} <span class="muted">({direction})</span></h3>'
        f"{_svg(str(ev.get('metric', '')), series)}{_legend([n for n, _ in series])}</div>"
    )


def _heat(value: float | None) -> str:
    if not isinstance(value, float | int) or not math.isfinite(value):
        return f'<td class="heat">{_e(value)}</td>'
    hue = 120 * max(0.0, min(1.0, value))
    return f'<td class="heat" style="background:hsl({hue:.0f},65%,82%)">{value:.2f}</td>'


def _relative_key(metrics: Json) -> str:
    """The per-severity relative a row shows: the one its gate and ``mean_relative`` use.

    A perturbation that removes content (missing_modality) is judged on the items it left
    intact (``intact_relative_sN``); showing the all-items relative next to a mean of the intact
    ones made that row's mean disagree with its own cells.
    """
    return "intact_relative_s{}" if any(k.startswith("intact_relative_s") for k in metrics) else "relative_s{}"


def _mean_of(values: list[object]) -> float | None:
    nums = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return sum(nums) / len(nums) if nums else None


def _relative_table(curves: list[Json]) -> str:
    sevs = sorted({s for f in curves for s in range(1, 6) if _relative_key(f["metrics"]).format(s) in f["metrics"]})
    head = "".join(f"<th>s{s}</th>" for s in sevs)
    rows = []
    for f in curves:
        m, ev = f["metrics"], f["evidence"]
        key = _relative_key(m)
        values = [m.get(key.format(s)) for s in sevs]
        cells = "".join(_heat(v) for v in values)
        name = _e(ev.get("perturbation"))
        if key.startswith("intact"):
            name += ' <span class="muted" title="quality of the items it left intact">(intact items)</span>'
        mean = m.get("mean_relative", _mean_of(values))
        rows.append(
            f"<tr><td>{name}</td><td>{_e(_group_key(f))}</td>"
            f'<td>{_badge(f.get("verdict"))}</td><td class="num">{_num(m["clean"], ".4g")}</td>'
            f'{cells}<td class="num">{_num(mean, ".2f")}</td></tr>'
        )
    return (
        "<h3>Relative to clean (quality at severity / quality clean)</h3><table><tr>"
        f"<th>perturbation</th><th>task · metric</th><th>verdict</th><th>clean</th>{head}"
        f"<th>mean</th></tr>{''.join(rows)}</table>"
    )


def _degradation(findings: list[Json]) -> str:
    curves = [f for f in findings if "clean" in (f.get("metrics") or {})
              and "severities" in (f.get("evidence") or {})]  # fmt: skip
    if not curves:
        return ""
    groups: dict[str, list[Json]] = {}
    for f in curves:
        groups.setdefault(_group_key(f), []).append(f)
    charts = "".join(_chart(k, g) for k, g in groups.items())
    return f'<section><h2>Degradation curves</h2><div class="charts">{charts}</div>{_relative_table(curves)}</section>'


def _adversarial(findings: list[Json]) -> str:
    """Robust quality against eps (grey levels, 0 = clean) for every attack finding that has a curve."""
    curves = [f for f in findings if (f.get("evidence") or {}).get("eps_curve")]
    if not curves:
        return ""
    groups: dict[str, list[Json]] = {}
    for f in curves:
        groups.setdefault(f"{f['evidence'].get('task', '?')} · {f['evidence'].get('metric', '?')}", []).append(f)
    charts, rows = [], []
    for key, group in groups.items():
        series: list[Series] = []
        ticks = {0.0}
        for f in group:
            pts = [(0.0, float(f["metrics"].get("clean", float("nan"))))]
            pts += [(float(p["eps_255"]), float(p["robust"])) for p in f["evidence"]["eps_curve"]]
            pts = [(x, y) for x, y in pts if math.isfinite(y)]
            ticks |= {x for x, _ in pts}
            series.append((f"{f.get('check')}: {f['evidence'].get('perturbation', '')}", pts))
            cells = "".join(f'<td class="num">{_e(f"{p[0]:g}")}: {_num(p[1], ".2f")}</td>' for p in pts[1:])
            rows.append(f"<tr><td>{_e(f.get('check'))}</td><td>{_e(f['evidence'].get('perturbation'))}</td>"
                        f"<td>{_badge(f.get('verdict'))}</td><td class=\"num\">{_num(f['metrics'].get('clean'), '.3g')}"
                        f"</td>{cells}</tr>")  # fmt: skip
        charts.append(
            f'<div class="chart"><h3>{_e(key)} <span class="muted">(higher is better)</span></h3>'
            f"{_svg('robust ' + key.split(' · ')[-1], series, 'eps (grey levels /255, 0 = clean)', sorted(ticks))}"
            f"{_legend([n for n, _ in series])}</div>"
        )
    table = ("<table><tr><th>check</th><th>attack</th><th>verdict</th><th>clean</th><th colspan=\"8\">"
             f"robust at eps (/255)</th></tr>{''.join(rows)}</table>")  # fmt: skip
    return (f'<section><h2>Robust accuracy under attack</h2><div class="charts">{"".join(charts)}</div>'
            f"{table}</section>")  # fmt: skip


def _case(case: Json, artifacts: Mapping[str, bytes]) -> str:
    sev = case.get("severity")
    label = str(case.get("label") or f"s{sev}")
    parts = []
    if case.get("clean_artifact") or case.get("perturbed_artifact"):
        figs = [
            (case.get("clean_artifact"), f"clean · {_num(case.get('clean_score'))}"),
            (case.get("perturbed_artifact"), f"{label} · {_num(case.get('perturbed_score'))}"),
        ]
        if case.get("difference_artifact"):
            figs.append((case.get("difference_artifact"), "difference ×8"))
        imgs = "".join(f"<figure>{_img(n, artifacts, c)}<figcaption>{_e(c)}</figcaption></figure>" for n, c in figs)
        parts.append(f'<div class="pair">{imgs}</div>')
    if "clean_text" in case or "perturbed_text" in case:
        parts.append(
            f'<div class="texts"><b>clean</b><pre>{_e(case.get("clean_text"))}</pre>'
            f"<b>perturbed s{_e(sev)}</b><pre>{_e(case.get('perturbed_text'))}</pre></div>"
        )
    rows = [("sample", f"{_e(case.get('sample'))} (#{_e(case.get('index'))})"),
            ("truth", _e(case.get("truth")))]  # fmt: skip
    for key in ("clean_output", "perturbed_output"):
        if key in case:
            rows.append((key.replace("_", " "), f"<code>{_json(case[key], compact=True)}</code>"))
    rows.append(("score", f"{_num(case.get('clean_score'))} → {_num(case.get('perturbed_score'))}"))
    rows.append(("params", f"<code>{_json(case.get('params'), compact=True)}</code>"))
    return f'<div class="card">{"".join(parts)}{_meta(rows)}</div>'


def _worst_cases(findings: list[Json], artifacts: Mapping[str, bytes]) -> str:
    blocks = []
    for f in findings:
        ev = f.get("evidence") or {}
        cases = ev.get("worst_cases") or []
        if not cases:
            continue
        opened = " open" if f.get("verdict") in ("fail", "error") else ""
        blocks.append(
            f'<details class="case"{opened}><summary>{_badge(f.get("verdict"))} '
            f"<b>{_e(ev.get('perturbation'))}</b> · {_e(ev.get('metric'))} · {len(cases)} worst "
            f'case(s)</summary><div class="cases">{"".join(_case(c, artifacts) for c in cases)}'
            "</div></details>"
        )
    return f"<section><h2>Worst cases</h2>{''.join(blocks)}</section>" if blocks else ""


def _evidence(f: Json, artifacts: Mapping[str, bytes]) -> str:
    ev = dict(f.get("evidence") or {})
    parts = []
    if ev.get("input_artifact"):
        parts.append(f"<div>{_img(ev['input_artifact'], artifacts, 'input')}</div>")
    if isinstance(ev.get("traceback"), str):
        parts.append(f"<b>traceback</b><pre>{_e(ev.pop('traceback'))}</pre>")
    metrics = "\n".join(f"{k:<24} {_num(v, '.6g')}" for k, v in (f.get("metrics") or {}).items())
    parts.append(f"<b>metrics</b><pre>{metrics or '—'}</pre>")
    parts.append(f"<b>evidence</b><pre>{_json(ev)}</pre>")
    return f"<details><summary>metrics and evidence</summary>{''.join(parts)}</details>"


def _findings(findings: list[Json], artifacts: Mapping[str, bytes]) -> str:
    cols = ("verdict", "step", "check", "title", "severity", "gate", "message", "suggestion")
    rows = []
    for f in findings:
        sev = str(f.get("severity"))
        sev_cls = sev if sev in _SEVERITIES else "info"
        rows.append(
            f"<tr><td>{_badge(f.get('verdict'))}</td>"
            f"<td>{_e(f.get('step'))} {_e(f.get('step_name'))}</td>"
            f"<td>{_e(f.get('check'))}</td><td>{_e(f.get('title'))}</td>"
            f'<td><span class="sev sev-{sev_cls}">{_e(sev)}</span></td><td>{_e(f.get("gate"))}</td>'
            f"<td>{_e(f.get('message'))}</td><td>{_e(f.get('suggestion'))}</td></tr>"
            f'<tr class="detail"><td></td><td colspan="7">{_evidence(f, artifacts)}</td></tr>'
        )
    head = "".join(f"<th>{c}</th>" for c in cols)
    table = f"<table><tr>{head}</tr>{''.join(rows)}</table>"
    return f"<section><h2>All findings ({len(findings)})</h2>{table}</section>"


def render_html(results: dict[str, Any], artifacts: Mapping[str, bytes]) -> str:
    """The whole report as one HTML document; every string from ``results`` is escaped."""
    findings: list[Json] = list(results.get("findings") or [])
    title = f"mmchaos {results.get('suite', {}).get('name', '')} · {results.get('run_id', '')}"
    body = (
        _header(results)
        + _steps(results.get("steps") or [])
        + _degradation(findings)
        + _adversarial(findings)
        + _worst_cases(findings, artifacts)
        + _findings(findings, artifacts)
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body><main>{body}</main></body></html>\n"
    )
