"""Target options per scheme: what a user may set for ``onnx:``, ``openai:``, ... and nothing else.

A scheme's factory names the pydantic model of its options (:func:`takes_options`); an option the
model does not have is refused with a one-line :class:`~mmchaos.errors.ConfigError` that names the
scheme's options, instead of being dropped. :class:`TargetOptions` is what a user *gave* (CLI
flags, a ``--target-config`` file, a stored run, a worker's reload spec); :func:`resolve_options`
checks it against the scheme when the target is about to load. Its JSON form is what
``Target.load_options`` holds, so a worker process rebuilds the same options from a plain dict.

A factory that names no model (a third-party scheme written before models existed) takes
:class:`GenericOptions`, the one bag every scheme used to get, as keyword arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from mmchaos.errors import ConfigError
from mmchaos.registry import closest

__all__ = [
    "GenericOptions",
    "OptionValues",
    "ResolvedOptions",
    "SchemeOptions",
    "TargetOptions",
    "TorchOptions",
    "load_target_config",
    "options_model_of",
    "resolve_options",
    "takes_options",
]

F = TypeVar("F", bound=Callable[..., Any])

OptionValues = dict[str, JsonValue]
"""Target options as data (a suite file's ``target_options``, ``Target.load_options``): JSON values by name."""

OPTIONS_ATTR = "options_model"
"""The factory attribute :func:`takes_options` sets (absent: :class:`GenericOptions`; None: as given)."""


class SchemeOptions(BaseModel):
    """Base of every scheme's options model: unknown fields refused, values JSON, frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TorchOptions(SchemeOptions):
    """Options of a target that runs a torch model in this process."""

    device: str = Field("cpu", description="torch device: cpu, cuda, cuda:N, mps")
    threads: int | None = Field(
        None,
        ge=1,
        description="torch intra-op threads of the process that loads the target "
        "(None: 1 for the built-in tiny models, torch's default for hf: models)",
    )


class GenericOptions(SchemeOptions):
    """The options of a scheme whose factory names no model: every field, as before per-scheme models."""

    trust_remote_code: bool = False
    use_safetensors: bool = True
    device: str = "cpu"
    model: str | None = None
    allow_remote: bool = False
    allow_missing_weights: bool = False
    threads: int | None = Field(None, ge=1)


def takes_options(model: type[SchemeOptions] | None) -> Callable[[F], F]:
    """Register ``model`` as the options of the decorated scheme factory.

    The factory is then called ``factory(rest_of_uri, options)`` with a validated ``model``
    instance. ``None`` means the factory checks its keyword options itself and gets them as given
    (``py:``, whose options are the user's factory's parameters).
    """

    def mark(factory: F) -> F:
        setattr(factory, OPTIONS_ATTR, model)
        return factory

    return mark


def options_model_of(factory: Callable[..., Any]) -> type[SchemeOptions] | None:
    """The options model a scheme factory registered (:class:`GenericOptions` when it names none)."""
    model = getattr(factory, OPTIONS_ATTR, GenericOptions)
    if model is not None and not (isinstance(model, type) and issubclass(model, SchemeOptions)):
        raise ConfigError(
            f"{getattr(factory, '__qualname__', factory)}.{OPTIONS_ATTR} must be a SchemeOptions subclass",
            code="target_options_model_invalid",
        )
    return model


class TargetOptions(Mapping[str, Any]):
    """The options given for a target, as given: only what the user set, checked when it loads.

    ``TargetOptions(threads=2)``, ``TargetOptions({"model": "m"})`` or ``TargetOptions(**load_options)``;
    immutable, picklable, and a plain JSON dict through :meth:`to_dict`.
    """

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any] | None = None, /, **options: Any) -> None:
        self._values: dict[str, Any] = {**dict(values or {}), **options}

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._values) == dict(other)

    def __hash__(self) -> int:
        return hash(repr(self))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in sorted(self._values.items()))
        return f"TargetOptions({inner})"

    def __getstate__(self) -> dict[str, Any]:
        return self._values

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._values = dict(state)

    @property
    def device(self) -> str:
        """The device the options name (``"cpu"`` when none): where an executor places the target."""
        return str(self._values.get("device") or "cpu")

    def merged(self, other: Mapping[str, Any]) -> TargetOptions:
        """These options with ``other``'s on top."""
        return TargetOptions({**self._values, **dict(other)})

    def to_dict(self) -> dict[str, Any]:
        return dict(self._values)


class ResolvedOptions:
    """Options checked against a scheme: what its factory gets and what a worker reloads it with."""

    def __init__(self, scheme: str, model: SchemeOptions | None, given: Mapping[str, Any]) -> None:
        self.scheme = scheme
        self.model = model
        """The validated model (None: the factory takes its options as given)."""
        self.load_options: dict[str, Any] = (
            model.model_dump(mode="json", exclude_defaults=True) if model is not None else dict(given)
        )
        """The JSON form: ``TargetOptions(**load_options)`` resolves to the same options again."""


def option_names(model: type[SchemeOptions]) -> list[str]:
    return list(model.model_fields)


def resolve_options(scheme: str, factory: Callable[..., Any], given: Mapping[str, Any] | None) -> ResolvedOptions:
    """Check ``given`` against the options of ``scheme`` (whose factory is ``factory``).

    An unknown option is a :class:`ConfigError` (``target_option_unknown``) naming the closest and all
    of the scheme's options; a bad value one (``target_option_invalid``) naming the option.
    """
    values = dict(given or {})
    model = options_model_of(factory)
    if model is None:
        return ResolvedOptions(scheme, None, values)
    names = option_names(model)
    unknown = [k for k in values if k not in model.model_fields]
    if unknown:
        raise unknown_option_error(f"{scheme}:", unknown[0], names)
    try:
        return ResolvedOptions(scheme, model.model_validate(values), values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "options"
        got = first.get("input")
        why = str(first["msg"]).removeprefix("Value error, ")
        raise ConfigError(
            f"{scheme}: target option {where}: {why} (got {got!r})",
            code="target_option_invalid",
        ) from None


def unknown_option_error(where: str, name: str, known: list[str]) -> ConfigError:
    """The one wording of "no such option here": ``where`` is ``"onnx:"`` (a scheme) or a whole URI."""
    hint = closest(name, known, n=2)
    label = f"{where} targets" if where.endswith(":") else where
    takes = ", ".join(sorted(known)) or "none"
    return ConfigError(
        f"target option {name!r} does not apply to {label}{hint} (its options: {takes})", code="target_option_unknown"
    )


def load_target_config(path: Path) -> dict[str, Any]:
    """The options in a ``--target-config`` YAML file: one mapping of option name to value.

    Unreadable, unparsable or not a mapping: a one-line :class:`ConfigError` (``target_config_invalid``);
    the scheme's model checks the names and values when the target loads.
    """
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise ConfigError(f"cannot read --target-config {path}: {why}", code="target_config_invalid") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"--target-config {path} is not valid YAML{at}", code="target_config_invalid") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ConfigError(
            f"--target-config {path} must be a mapping of option names to values (like 'timeout: 5')",
            code="target_config_invalid",
        )
    return data
