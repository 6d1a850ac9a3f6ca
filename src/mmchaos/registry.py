"""Name -> plugin registries: built-ins registered lazily, third parties through entry points.

A built-in is registered as a ``"module:attr"`` string so that listing names never imports a
heavy module; third-party plugins come from the entry-point group given to the registry. Unknown
names answer with the closest known names.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from mmchaos.errors import ConfigError, UnknownNameError

T = TypeVar("T")

__all__ = ["Registry", "closest"]


def closest(name: str, known: Iterable[str], *, n: int = 3, prefix: str = "", cutoff: float = 0.6) -> str:
    """The "; did you mean ...?" hint for an unknown ``name`` (empty when nothing is close).

    The one spelling of that hint, for registries and for every other closed set of names.
    """
    close = difflib.get_close_matches(name, list(known), n=n, cutoff=cutoff)
    return f"; did you mean {', '.join(prefix + c for c in close)}?" if close else ""


class Registry(Generic[T]):
    """A lazily imported mapping from names to plugin objects of one kind."""

    def __init__(self, kind: str, entry_point_group: str | None = None) -> None:
        self.kind = kind
        self._group = entry_point_group
        self._specs: dict[str, str | T] = {}
        self._loaded: dict[str, T] = {}
        self._entry_points_read = False

    def register(self, name: str, spec: str | T) -> None:
        """Register ``spec`` (an object, or a lazy ``"module:attr"`` string) under ``name``."""
        if name in self._specs:
            raise ConfigError(f"{self.kind} {name!r} is registered twice")
        self._specs[name] = spec

    def decorator(self, name: str) -> Callable[[T], T]:
        def wrap(obj: T) -> T:
            self.register(name, obj)
            return obj

        return wrap

    def _read_entry_points(self) -> None:
        if self._entry_points_read or self._group is None:
            return
        self._entry_points_read = True
        for ep in entry_points(group=self._group):
            self._specs.setdefault(ep.name, ep.value)

    def names(self) -> list[str]:
        self._read_entry_points()
        return sorted(self._specs)

    def __contains__(self, name: object) -> bool:
        self._read_entry_points()
        return name in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str) -> T:
        """Return the plugin registered as ``name``, importing it on first use."""
        if name in self._loaded:
            return self._loaded[name]
        self._read_entry_points()
        if name not in self._specs:
            hint = closest(name, self._specs, cutoff=0.5)
            known = ", ".join(sorted(self._specs))
            raise UnknownNameError(f"unknown {self.kind} {name!r}{hint} (known: {known})")
        spec = self._specs[name]
        obj: T = _load(spec) if isinstance(spec, str) else spec
        self._loaded[name] = obj
        return obj


def _load(spec: str) -> T:  # type: ignore[type-var]
    module_name, _, attr = spec.partition(":")
    module = importlib.import_module(module_name)
    obj = module
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj  # type: ignore[return-value]
