"""Build and load the guards' pydantic configuration, turning validation errors into ConfigError."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from mmchaos._yaml import describe_yaml_error
from mmchaos.errors import ConfigError

__all__ = ["build_config", "load_yaml_config"]

C = TypeVar("C", bound=BaseModel)


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def build_config(cls: type[C], base: C | None, settings: dict[str, Any], what: str) -> C:
    """``base`` with ``settings`` laid over it, validated; bad values raise ConfigError."""
    if base is not None and not isinstance(base, cls):
        raise ConfigError(f"{what}: expected a {cls.__name__}, got {type(base).__name__}")
    if not settings:
        return base if base is not None else _validate(cls, {}, what)
    data = base.model_dump() if base is not None else {}
    data.update(settings)
    return _validate(cls, data, what)


def _validate(cls: type[C], data: object, what: str) -> C:
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid {what}: {_describe(exc)}") from exc


def load_yaml_config(cls: type[C], source: str | Path, what: str) -> C:
    """A config from a YAML file path, or from YAML text when ``source`` is a str with a newline."""
    if isinstance(source, Path) or "\n" not in source:
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read {what} file {path}: {exc.strerror or exc}") from exc
    else:
        text = source
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} is not valid YAML: {describe_yaml_error(exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} must be a YAML mapping, got {type(data).__name__}")
    return _validate(cls, data, what)
