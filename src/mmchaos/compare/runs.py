"""The two sides of a comparison: a stored run (id, prefix, ``latest``) or a results.json / report folder.

A results.json may come from anywhere (another machine's CI artifact, a hand edit), so it is
checked at the boundary: valid JSON, a results document of a schema this version reads, and
findings of the shape the comparison walks. Anything else is one line and exit 2, never a
traceback halfway through a diff.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from mmchaos.errors import StoreError, UsageError

__all__ = ["LoadedRun", "load_run"]

READABLE_SCHEMAS = frozenset({2, 3})
"""results.json schema versions a comparison reads (version 2 differs only in its NaN tokens)."""


class _FindingDoc(BaseModel):
    model_config = ConfigDict(extra="allow")

    check: str
    step: int
    verdict: str
    title: str
    metrics: dict[str, float | None] = {}
    evidence: dict[str, Any] = {}


class _TargetDoc(BaseModel):
    model_config = ConfigDict(extra="allow")

    uri: str


class _SuiteDoc(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str


class _ResultsDoc(BaseModel):
    """The part of a results document (docs/results-schema.md) a comparison reads."""

    model_config = ConfigDict(extra="allow")

    schema_version: int
    run_id: str
    target: _TargetDoc
    suite: _SuiteDoc
    findings: list[_FindingDoc]


@dataclass(frozen=True)
class LoadedRun:
    """One side of a comparison: its results document and where it came from."""

    doc: dict[str, Any]
    source: str

    @property
    def run_id(self) -> str:
        return str(self.doc["run_id"])

    @property
    def target(self) -> str:
        return str(self.doc["target"]["uri"])


def load_run(ref: str, store_path: Path | str) -> LoadedRun:
    """The run ``ref`` names: a report folder, a results.json, else a run of the store at ``store_path``."""
    path = Path(ref)
    if path.is_dir():
        if not (path / "results.json").is_file():
            raise UsageError(f"report folder {path} has no results.json", code="run_missing")
        return _from_file(path / "results.json")
    if path.is_file():
        return _from_file(path)
    if path.suffix == ".json" or "/" in ref or "\\" in ref:
        raise UsageError(f"no file {path} to compare", code="run_missing")
    return _from_store(ref, Path(store_path))


def _from_store(ref: str, store_path: Path) -> LoadedRun:
    from mmchaos.report.results import build_results
    from mmchaos.store import RunStore

    if not store_path.is_file():
        raise StoreError(
            f"{ref!r} is not a results.json or report folder, and there is no run store at {store_path} "
            "to look it up in (see --store)",
            code="run_missing",
        )
    with RunStore(store_path, read_only=True) as store:
        run_id = store.resolve(ref)
        return LoadedRun(build_results(store, run_id), f"{store_path} run {run_id}")


def _from_file(path: Path) -> LoadedRun:
    try:
        raw = json.loads(path.read_bytes())
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}", code="run_missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"{path} is not valid JSON ({exc}); give a results.json mmchaos wrote", code="results_invalid"
        ) from None
    if not isinstance(raw, dict) or "findings" not in raw or "schema_version" not in raw:
        raise UsageError(
            f"{path} is not a mmchaos results document (no schema_version and findings)", code="results_invalid"
        )
    try:
        _ResultsDoc.model_validate(raw)
    except ValidationError as exc:
        from mmchaos.suites import format_validation_error

        raise UsageError(format_validation_error(exc, str(path)), code="results_invalid") from None
    if raw["schema_version"] not in READABLE_SCHEMAS:
        raise UsageError(
            f"{path}: results schema {raw['schema_version']} is not one this version reads "
            f"({', '.join(map(str, sorted(READABLE_SCHEMAS)))})",
            code="results_invalid",
        )
    return LoadedRun(raw, str(path))
