"""Reports of a run: results.json, report.html, junit.xml and evidence/, all rebuilt from the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmchaos.errors import ConfigError
from mmchaos.report.files import prepare_out_dir, safe_file_name, unique_file_names
from mmchaos.report.junit import render_junit
from mmchaos.report.results import build_results, exit_code_for
from mmchaos.report.strict_json import dumps
from mmchaos.store import RunStore

__all__ = ["build_results", "exit_code_for", "prepare_out_dir", "render_junit", "write_reports"]


def write_reports(store: RunStore, run_id: str, out: Path, *, strict: bool = False) -> dict[str, Any]:
    """Write every report file of ``run_id`` into ``out`` and return the results document."""
    from mmchaos.report.html import render_html

    results = build_results(store, run_id, strict=strict)
    evidence = prepare_out_dir(out) / "evidence"
    artifacts = {a.name: a for a in store.artifacts(run_id)}
    files = unique_file_names(list(artifacts))
    try:
        for name, artifact in artifacts.items():
            (evidence / files[name]).write_bytes(artifact.data)
        for i, finding in enumerate(results["findings"]):
            if finding["verdict"] in ("fail", "error", "warn"):
                repro = {"run_id": run_id, "seed": results["seed"], "target": results["target"]["uri"], **finding}
                name = safe_file_name(f"{i:03d}-{finding['check']}.json")
                (evidence / name).write_text(dumps(repro), "utf-8")
        (out / "results.json").write_text(dumps(results), "utf-8")
        (out / "junit.xml").write_text(render_junit(results), "utf-8")
        (out / "report.html").write_text(render_html(results, {n: a.data for n, a in artifacts.items()}), "utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write reports to {out}: {exc.strerror or exc}", code="output_unusable") from exc
    return results
