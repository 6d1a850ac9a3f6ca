"""``junit.xml``: one testsuite per step, one testcase per finding, for CI dashboards."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

__all__ = ["render_junit"]


def _metric(finding: dict[str, Any], name: str, value: float | None) -> str:
    if value is None:
        return f"{name} = null ({finding.get('non_finite', {}).get(f'metrics.{name}', 'not measured')})"
    return f"{name} = {value:.6g}"


def render_junit(results: dict[str, Any]) -> str:
    root = ET.Element("testsuites", name=f"mmchaos {results['suite']['name']}", run_id=results["run_id"])
    strict = bool(results["summary"].get("strict"))
    by_step: dict[str, list[dict[str, Any]]] = {}
    for finding in results["findings"]:
        by_step.setdefault(f"{finding['step']}-{finding['step_name']}", []).append(finding)
    for step_name, findings in by_step.items():
        suite = ET.SubElement(
            root,
            "testsuite",
            name=step_name,
            tests=str(len(findings)),
            failures=str(sum(f["verdict"] == "fail" or (f["verdict"] == "warn" and strict) for f in findings)),
            errors=str(sum(f["verdict"] == "error" for f in findings)),
            skipped=str(sum(f["verdict"] == "skipped" for f in findings)),
        )
        for i, f in enumerate(findings):
            case = ET.SubElement(suite, "testcase", classname=f"mmchaos.{f['check']}", name=f"{i:03d} {f['title']}")
            body = "\n".join(
                [f"{f['message']}", f"gate: {f['gate']}", f"suggestion: {f['suggestion']}"]
                + [_metric(f, k, v) for k, v in sorted(f["metrics"].items())]
            )
            if f["verdict"] == "fail":
                ET.SubElement(case, "failure", message=f["title"], type=f["severity"]).text = body
            elif f["verdict"] == "error":
                ET.SubElement(case, "error", message=f["title"], type=f["severity"]).text = body
            elif f["verdict"] == "warn" and results["summary"].get("strict"):
                ET.SubElement(case, "failure", message=f"warning (strict): {f['title']}", type="warning").text = body
            elif f["verdict"] == "warn":
                ET.SubElement(case, "system-out").text = f"WARNING: {f['title']}\n{body}"
            elif f["verdict"] == "skipped":
                ET.SubElement(case, "skipped", message=f["message"] or f["title"])
            else:
                ET.SubElement(case, "system-out").text = body
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
