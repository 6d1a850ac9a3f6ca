"""``junit.xml`` of a comparison: one testcase per compared curve or finding, a regression is a failure.

The same shape as a run's junit.xml (Jenkins' junit-10.xsd): a testsuite per check, the two run
ids and targets as ``<properties>``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

__all__ = ["render_compare_junit"]

Json = dict[str, Any]


def _curve_case(suite: ET.Element, c: Json) -> None:
    name = f"{c['perturbation']} {c['task']} {c['metric']}"
    case = ET.SubElement(suite, "testcase", classname=f"mmchaos.compare.{c['check']}", name=name, time="0.000")
    lines = [
        f"{'clean' if p['severity'] == 0 else 's' + str(p['severity'])}: {p['a']:.6g} -> {p['b']:.6g} "
        f"(delta {p['delta']:+.6g}, lost {p['quality_drop']:.6g}, allowed {p['allowed_drop']:.6g})"
        + (" REGRESSED" if p["regressed"] else "")
        for p in c["points"]
    ]
    if c["regressed"]:
        bad = [f"s{p['severity']}" if p["severity"] else "clean" for p in c["points"] if p["regressed"]]
        ET.SubElement(
            case, "failure", message=f"{name} regressed at {', '.join(bad)}", type="regression"
        ).text = "\n".join(lines)
    else:
        ET.SubElement(case, "system-out").text = "\n".join(lines)


def _finding_case(suite: ET.Element, p: Json) -> None:
    case = ET.SubElement(suite, "testcase", classname=f"mmchaos.compare.{p['check']}", name=p["key"], time="0.000")
    text = "\n".join(
        [f"verdict: {p['verdict']['a']} -> {p['verdict']['b']}", f"A: {p['title']['a']}", f"B: {p['title']['b']}"]
        + [f"{k}: {m['a']:.6g} -> {m['b']:.6g}" for k, m in p["metrics"].items()]
    )
    if p["regressed"]:
        ET.SubElement(case, "failure", message=f"{p['verdict']['a']} -> {p['verdict']['b']}: {p['title']['b']}",
                      type="regression").text = text  # fmt: skip
    else:
        ET.SubElement(case, "system-out").text = text


def render_compare_junit(doc: Json) -> str:
    """The junit.xml text of a comparison document."""
    by_check: dict[str, list[tuple[str, Json]]] = {}
    for c in doc["curves"]:
        by_check.setdefault(c["check"], []).append(("curve", c))
    for p in doc["findings"]:
        by_check.setdefault(p["check"], []).append(("finding", p))
    total = sum(len(v) for v in by_check.values())
    failures = sum(item["regressed"] for v in by_check.values() for _, item in v)
    root = ET.Element("testsuites", name=f"mmchaos compare {doc['a']['run_id']} {doc['b']['run_id']}",
                      time="0.000", tests=str(total), failures=str(failures), errors="0")  # fmt: skip
    properties = {
        "run_a": doc["a"]["run_id"],
        "run_b": doc["b"]["run_id"],
        "target_a": doc["a"]["target"],
        "target_b": doc["b"]["target"],
    }
    for check, items in by_check.items():
        suite = ET.SubElement(
            root, "testsuite", name=f"compare-{check}", tests=str(len(items)),
            failures=str(sum(i["regressed"] for _, i in items)), errors="0", skipped="0", time="0.000",
        )  # fmt: skip
        props = ET.SubElement(suite, "properties")
        for name, value in properties.items():
            ET.SubElement(props, "property", name=name, value=str(value))
        for kind, item in items:
            (_curve_case if kind == "curve" else _finding_case)(suite, item)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
