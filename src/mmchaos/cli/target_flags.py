"""The target option flags, declared once for every command that loads a target.

``validate``, ``serve``, ``export`` and ``fuzz-replay`` take the same flags: the few options
people set by hand (``--model``, ``--device``, ``--threads``, ...) and ``--target-config FILE.yaml``
for the rest of a scheme's options (timeouts, retries, concurrency, the API key variable, the image
form...). A flag left out is not an option given, so a scheme never sees an option the user did
not set; one that does not apply to the scheme is refused when the target's options are checked.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from mmchaos.targets.options import TargetOptions, load_target_config

__all__ = ["FLAG_NAMES", "gather_options", "with_target_flags"]

R = TypeVar("R")

ModelOpt = Annotated[
    str | None, typer.Option("--model", help="openai: targets: the served model name", show_default=False)
]
DeviceOpt = Annotated[
    str | None,
    typer.Option(
        "--device", help="builtin:/hf: targets: the torch device; onnx: targets: cpu or cuda[:N]", show_default=False
    ),
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        min=1,
        help="builtin:/hf: targets: torch intra-op threads of this process (default: 1 for the built-in tiny "
        "models, torch's own for hf:); onnx: targets: ONNX Runtime intra-op threads",
        show_default=False,
    ),
]
TrustOpt = Annotated[bool, typer.Option("--trust-remote-code", help="let hf: targets run code from the model repo")]
PickleOpt = Annotated[bool, typer.Option("--allow-pickle-weights", help="let hf: targets load non-safetensors weights")]
MissingOpt = Annotated[
    bool, typer.Option("--allow-missing-weights", help="let hf: targets load with weights left newly initialised")
]
RemoteOpt = Annotated[
    bool, typer.Option("--allow-remote", help="let openai: targets send requests to non-loopback hosts")
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--target-config",
        help="YAML mapping of more target options, checked against the scheme's (openai: timeout, "
        "max_retries, max_concurrency, api_key_env, image_input, ...); flags win over the file",
        show_default=False,
    ),
]

_FLAGS: dict[str, tuple[Any, Any]] = {
    "model": (ModelOpt, None),
    "device": (DeviceOpt, None),
    "threads": (ThreadsOpt, None),
    "trust_remote_code": (TrustOpt, False),
    "allow_pickle_weights": (PickleOpt, False),
    "allow_missing_weights": (MissingOpt, False),
    "allow_remote": (RemoteOpt, False),
    "target_config": (ConfigOpt, None),
}
FLAG_NAMES = tuple(_FLAGS)
"""The parameter names :func:`with_target_flags` adds to a command."""


def gather_options(
    *,
    model: str | None = None,
    device: str | None = None,
    threads: int | None = None,
    trust_remote_code: bool = False,
    allow_pickle_weights: bool = False,
    allow_missing_weights: bool = False,
    allow_remote: bool = False,
    target_config: Path | None = None,
    extra: dict[str, Any] | None = None,
) -> TargetOptions:
    """The options the flags gave: the file's, then ``extra`` (``fuzz-replay --option``), then the flags set."""
    given: dict[str, Any] = load_target_config(target_config) if target_config is not None else {}
    given.update(extra or {})
    flags: dict[str, Any] = {
        "model": model,
        "device": device,
        "threads": threads,
        "trust_remote_code": trust_remote_code or None,
        "use_safetensors": False if allow_pickle_weights else None,
        "allow_missing_weights": allow_missing_weights or None,
        "allow_remote": allow_remote or None,
    }
    given.update({k: v for k, v in flags.items() if v is not None})
    return TargetOptions(given)


def with_target_flags(command: Callable[..., R]) -> Callable[..., R]:
    """Give a Typer command the target flags; it receives them gathered as ``options: TargetOptions``.

    The command declares an ``options`` parameter (and, for ``fuzz-replay``, may take ``extra``
    pairs itself and pass them on through :func:`gather_options`); the flags are added to the
    signature Typer reads, after the command's own parameters.
    """
    signature = inspect.signature(command, eval_str=True)
    own = [p for name, p in signature.parameters.items() if name != "options"]
    if "options" not in signature.parameters:
        raise TypeError(f"{command.__name__} must take an 'options' parameter to receive the target flags")
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
        for name, (annotation, default) in _FLAGS.items()
    ]
    kinds = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]

    @functools.wraps(command)
    def run(**kwargs: Any) -> R:
        # a call from Python (not Typer) may leave flags out: they take their declared defaults
        flags = {name: kwargs.pop(name, default) for name, (_, default) in _FLAGS.items()}
        return command(**kwargs, options=gather_options(**flags))

    params = [*kinds, *added]
    run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}  # resolved: nothing for Typer to evaluate
    del run.__wrapped__  # Typer must read the signature above, not the command's own
    return run
