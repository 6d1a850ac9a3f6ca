"""``junit.xml``: one testsuite per step, one testcase per finding, for CI dashboards.

The document validates against Jenkins' junit-10.xsd (tests/data/junit-10.xsd): ``<testsuites>``
carries only name/time/tests/failures/errors, so the run id, seed and target go into each suite's
``<properties>``. A finding's ``time`` is its check's wall time shared among the check's findings,
so the times add up to the run's. A warning passes (its ``system-out`` starts with ``WARNING:``)
unless the run is strict, where it is a ``failure`` of type ``warning``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

__all__ = ["render_junit"]

Json = dict[str, Any]


def _metric(finding: Json, name: str, value: float | None) -> str:
    if value is None:
        return f"{name} = null ({finding.get('non_finite', {}).get(f'metrics.{name}', 'not measured')})"
    return f"{name} = {value:.6g}"


def _seconds(value: float) -> str:
    """junit-10.xsd's SUREFIRE_TIME: a plain decimal, never an exponent."""
    return f"{max(0.0, value):.3f}"


def _case_times(results: Json) -> list[float]:
    """Each finding's share of its check's wall time."""
    wall = {c["id"]: float(c.get("wall_seconds") or 0.0) for c in results.get("checks", [])}
    per_check: dict[str, int] = {}
    for f in results["findings"]:
        per_check[f["check"]] = per_check.get(f["check"], 0) + 1
    return [wall.get(f["check"], 0.0) / per_check[f["check"]] for f in results["findings"]]


def _is_failure(finding: Json, strict: bool) -> bool:
    return finding["verdict"] == "fail" or (finding["verdict"] == "warn" and strict)


def _testcase(suite: ET.Element, i: int, f: Json, seconds: float, strict: bool) -> None:
    case = ET.SubElement(
        suite, "testcase", classname=f"mmchaos.{f['check']}", name=f"{i:03d} {f['title']}", time=_seconds(seconds)
    )
    body = "\n".join(
        [f"{f['message']}", f"gate: {f['gate']}", f"suggestion: {f['suggestion']}"]
        + [_metric(f, k, v) for k, v in sorted(f["metrics"].items())]
    )
    verdict = f["verdict"]
    if verdict == "fail":
        ET.SubElement(case, "failure", message=f["title"], type=f["severity"]).text = body
    elif verdict == "error":
        ET.SubElement(case, "error", message=f["title"], type=f["severity"]).text = body
    elif verdict == "warn" and strict:
        ET.SubElement(case, "failure", message=f"warning (strict): {f['title']}", type="warning").text = body
    elif verdict == "warn":
        ET.SubElement(case, "system-out").text = f"WARNING: {f['title']}\n{body}"
    elif verdict == "skipped":
        ET.SubElement(case, "skipped", message=f["message"] or f["title"])
    else:
        ET.SubElement(case, "system-out").text = body


def _properties(suite: ET.Element, properties: dict[str, Any]) -> None:
    """The run's properties (id, seed, target ...) on a testsuite; junit-10.xsd allows none on the root."""
    props = ET.SubElement(suite, "properties")
    for name, value in properties.items():
        if value is not None:
            ET.SubElement(props, "property", name=name, value=str(value))


def _unfinished_suite(root: ET.Element, checks: list[str], run_id: str, properties: dict[str, Any]) -> None:
    """Checks of an interrupted or killed run that did not finish: an error each, so a dashboard
    never shows the run green over checks nobody ran to their end."""
    suite = ET.SubElement(
        root, "testsuite", name="incomplete", tests=str(len(checks)), failures="0", errors=str(len(checks)),
        skipped="0", time=_seconds(0.0),
    )  # fmt: skip
    _properties(suite, properties)
    for check in checks:
        case = ET.SubElement(suite, "testcase", classname=f"mmchaos.{check}", name=f"{check} did not finish",
                             time=_seconds(0.0))  # fmt: skip
        ET.SubElement(case, "error", message="did not finish", type="incomplete").text = (
            f"the run stopped before {check} finished; go on with `mmchaos validate --resume {run_id}`"
        )


def render_junit(results: Json) -> str:
    """The junit.xml text of a results document."""
    strict = bool(results["summary"].get("strict"))
    findings: list[Json] = results["findings"]
    times = _case_times(results)
    by_step: dict[str, list[int]] = {}
    for i, finding in enumerate(findings):
        by_step.setdefault(f"{finding['step']}-{finding['step_name']}", []).append(i)
    unfinished: list[str] = list(results["summary"].get("incomplete_checks") or [])
    root = ET.Element(
        "testsuites",
        name=f"mmchaos {results['suite']['name']}",
        time=_seconds(sum(times)),
        tests=str(len(findings) + len(unfinished)),
        failures=str(sum(_is_failure(f, strict) for f in findings)),
        errors=str(sum(f["verdict"] == "error" for f in findings) + len(unfinished)),
    )
    properties = {
        "run_id": results["run_id"],
        "seed": results.get("seed"),
        "target": results["target"]["uri"],
        "suite": results["suite"]["name"],
        "strict": str(strict).lower(),
        "mmchaos": (results.get("environment") or {}).get("mmchaos"),
    }
    for step_name, indices in by_step.items():
        mine = [findings[i] for i in indices]
        suite = ET.SubElement(
            root,
            "testsuite",
            name=step_name,
            tests=str(len(mine)),
            failures=str(sum(_is_failure(f, strict) for f in mine)),
            errors=str(sum(f["verdict"] == "error" for f in mine)),
            skipped=str(sum(f["verdict"] == "skipped" for f in mine)),
            time=_seconds(sum(times[i] for i in indices)),
        )
        _properties(suite, properties)
        for i in indices:
            _testcase(suite, i, findings[i], times[i], strict)
    if unfinished:
        _unfinished_suite(root, unfinished, results["run_id"], properties)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
