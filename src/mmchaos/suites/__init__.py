"""Suites: an ordered set of checks with parameters and gates, from YAML or a built-in name."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mmchaos._yaml import describe_yaml_error
from mmchaos.checks import REGISTRY as CHECKS
from mmchaos.checks.base import AnyCheck
from mmchaos.errors import ConfigError, UnknownNameError

__all__ = [
    "BUILTIN_SUITES",
    "CheckSpec",
    "SuiteSpec",
    "build_checks",
    "builtin_suites",
    "format_validation_error",
    "load_suite",
]


def builtin_suites() -> tuple[str, ...]:
    """The built-in suite names: every ``NAME.yaml`` shipped in this package (a new suite is one file)."""
    files = resources.files("mmchaos.suites").iterdir()
    return tuple(sorted(f.name.removesuffix(".yaml") for f in files if f.name.endswith(".yaml")))


BUILTIN_SUITES = builtin_suites()
_ID = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


class CheckSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    check: str
    id: str | None = Field(None, description="unique id within the suite; defaults to the check name")
    params: dict[str, Any] = Field(default_factory=dict)
    gate: dict[str, Any] = Field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.id or self.check


class SuiteSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    seed: int = 0
    checks: list[CheckSpec]

    @model_validator(mode="after")
    def _unique_ids(self) -> SuiteSpec:
        seen: set[str] = set()
        for spec in self.checks:
            if not _ID.match(spec.key):
                raise ValueError(f"check id {spec.key!r} must be lower-case letters, digits, '_', '-', '.'")
            if spec.key in seen:
                raise ValueError(f"check id {spec.key!r} appears twice; give one an 'id'")
            seen.add(spec.key)
        return self


def format_validation_error(exc: ValidationError, where: str) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(x) for x in first["loc"]) or "(root)"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {loc}: {first['msg']}{more}"


def load_suite(name_or_path: str) -> SuiteSpec:
    """A built-in suite by name, or a YAML file; every problem is a one-line ConfigError."""
    path = Path(name_or_path)
    if name_or_path in BUILTIN_SUITES:
        text = resources.files("mmchaos.suites").joinpath(f"{name_or_path}.yaml").read_text("utf-8")
        where = f"built-in suite {name_or_path}"
    elif path.suffix in (".yaml", ".yml") or path.exists():
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read suite file {path}: {exc}") from exc
        where = str(path)
    else:
        raise UnknownNameError(
            f"unknown suite {name_or_path!r}: give a built-in name ({', '.join(BUILTIN_SUITES)}) or a YAML file"
        )
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {describe_yaml_error(exc)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a suite must be a mapping with 'name' and 'checks'")
    try:
        spec = SuiteSpec.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, where)) from exc
    build_checks(spec)  # validate every check's params and gate now, not halfway through a run
    return spec


def build_checks(spec: SuiteSpec) -> list[tuple[str, AnyCheck]]:
    """Instantiate the suite's checks, validating their params and gates."""
    out = []
    for item in spec.checks:
        cls = CHECKS.get(item.check)
        try:
            params = cls.Params.model_validate(item.params)
            gate = cls.Gate.model_validate(item.gate)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, f"suite {spec.name}, check {item.key}")) from exc
        out.append((item.key, cls(params, gate)))
    return out
