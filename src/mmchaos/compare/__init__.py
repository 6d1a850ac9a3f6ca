"""Compare two runs: did run B (a new model version, a quantisation, another backend) regress against run A?

``mmchaos compare RUN_A RUN_B`` and ``mmchaos validate --baseline RUN`` are thin layers over
:func:`load_run`, :func:`compare_runs` and :func:`write_compare_reports`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmchaos.compare.diff import SCHEMA_VERSION, compare_runs
from mmchaos.compare.runs import LoadedRun, load_run
from mmchaos.compare.tolerances import Tolerance, Tolerances, load_tolerances
from mmchaos.errors import ConfigError

__all__ = [
    "REPORT_FILES",
    "SCHEMA_VERSION",
    "LoadedRun",
    "Tolerance",
    "Tolerances",
    "compare_runs",
    "load_run",
    "load_tolerances",
    "write_compare_reports",
]

REPORT_FILES = ("compare.json", "compare.html", "compare-junit.xml")
"""What :func:`write_compare_reports` writes; names that never clash with a run's own reports."""


def write_compare_reports(doc: dict[str, Any], out: Path) -> None:
    """Write the comparison as JSON, HTML and JUnit XML into the folder ``out`` (created when missing)."""
    from mmchaos.report.compare_html import render_compare_html
    from mmchaos.report.compare_junit import render_compare_junit
    from mmchaos.report.files import writable_dir
    from mmchaos.report.strict_json import dumps, replace_non_finite

    writable_dir(out)
    clean, _ = replace_non_finite(doc)
    try:
        (out / REPORT_FILES[0]).write_text(dumps(clean), "utf-8")
        (out / REPORT_FILES[1]).write_text(render_compare_html(clean), "utf-8")
        (out / REPORT_FILES[2]).write_text(render_compare_junit(clean), "utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot write the comparison to {out}: {exc.strerror or exc}", code="output_unusable"
        ) from exc
