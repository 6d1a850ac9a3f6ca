"""Build the ``results.json`` document of a run from the store (schema: docs/results-schema.md)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from mmchaos.findings import AVAILABLE_STEPS, Finding, Step, Verdict
from mmchaos.report.strict_json import replace_non_finite
from mmchaos.store import RunStore

__all__ = ["SCHEMA_VERSION", "build_results", "exit_code_for"]

SCHEMA_VERSION = 3
NOT_AVAILABLE = "not available in this version"


def _iso(ts: float | None) -> str | None:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds") if ts else None


def exit_code_for(findings: list[Finding], *, strict: bool = False) -> int:
    """0 when every gate passes, 1 when any finding failed or errored (or warned, under ``strict``)."""
    gating = (Verdict.FAIL, Verdict.ERROR, Verdict.WARN) if strict else (Verdict.FAIL, Verdict.ERROR)
    return 1 if any(f.verdict in gating for f in findings) else 0


def _finding_json(finding: Finding) -> dict[str, Any]:
    """A finding as strict JSON: non-finite numbers are null, listed under ``non_finite``."""
    doc, reasons = replace_non_finite(finding.to_dict())
    if reasons:
        doc["non_finite"] = reasons
    return dict(doc)


def build_results(store: RunStore, run_id: str, *, strict: bool = False) -> dict[str, Any]:
    """The results document of ``run_id``: strict JSON (no NaN/Infinity), see docs/results-schema.md."""
    run = store.get_run(run_id)
    findings = store.findings(run_id)
    checks = store.checks(run_id)
    verdicts = {v.value: 0 for v in Verdict}
    for f in findings:
        verdicts[f.verdict.value] += 1
    steps = []
    for step in Step:
        mine = [f for f in findings if f.step == step]
        counts = {v.value: sum(f.verdict == v for f in mine) for v in Verdict}
        if mine:
            if counts["fail"] or counts["error"]:
                status = "fail"
            elif counts["warn"]:
                status = "warn"
            else:
                status = "pass" if counts["pass"] else "skipped"
        elif step not in AVAILABLE_STEPS:
            status = NOT_AVAILABLE
        else:
            status = "not in this suite"
        steps.append({"step": int(step), "name": step.label, "status": status, "verdicts": counts})
    # A step whose every check was skipped went untested: a warn (exit 1 under --strict), never "all pass".
    untested = [{"step": s["step"], "name": s["name"]} for s in steps if s["status"] == "skipped"]
    code = exit_code_for(findings, strict=strict)
    if strict and untested:
        code = 1
    incomplete = [c.check_id for c in checks if c.status != "done"]
    if incomplete:  # an interrupted or killed run has not passed the gates it did not get to
        code = 1
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run.run_id,
        "status": run.status,
        "created": _iso(run.created),
        "finished": _iso(run.finished),
        "seed": run.config.get("seed") if run.config.get("seed") is not None else run.config["suite"]["seed"],
        "target": {"uri": run.target_uri, **{k: v for k, v in run.target.items() if k != "uri"}},
        "suite": run.config["suite"],
        "config": {k: v for k, v in run.config.items() if k != "suite"},
        "dataset": run.dataset,
        "environment": run.environment,
        "summary": {
            "verdicts": verdicts,
            "gates_passed": code == 0 and not incomplete,
            "exit_code": code,
            "strict": strict,
            "incomplete_checks": incomplete,
            "untested_steps": untested,
            "wall_seconds": sum(c.wall_seconds for c in checks),
            "model_seconds": sum(c.model_seconds for c in checks),
            "target_load_seconds": run.environment.get("target_load_seconds"),
        },
        "steps": steps,
        "checks": [
            {
                "id": c.check_id,
                "status": c.status,
                "wall_seconds": c.wall_seconds,
                "model_seconds": c.model_seconds,
                "model_calls": c.model_calls,
            }
            for c in checks
        ],
    }
    doc, reasons = replace_non_finite(doc)
    if reasons:
        doc["non_finite"] = reasons
    doc["findings"] = [_finding_json(f) for f in findings]
    return doc
