"""Targets addressed by URI: ``builtin:NAME``, ``hf:PATH``, ``onnx:DIR``, ``openai:URL``,
``py:module:factory``, plug-in schemes.

Each scheme's factory names the pydantic model of its options (:mod:`mmchaos.targets.options`) and is
called ``factory(rest_of_uri, options)``. Third-party adapters register a URI scheme in the
``mmchaos.targets`` entry-point group; the value is a ``"module:factory"``, called the same way when
it names a model and as ``factory(rest_of_uri, **options)`` with :class:`GenericOptions` otherwise.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Literal

from mmchaos.errors import ConfigError, MMChaosError, TargetLoadError, UnknownNameError
from mmchaos.registry import Registry, closest
from mmchaos.targets.base import Capability, Fingerprint, Target
from mmchaos.targets.options import (
    GenericOptions,
    ResolvedOptions,
    SchemeOptions,
    TargetOptions,
    TorchOptions,
    resolve_options,
    takes_options,
    unknown_option_error,
)
from mmchaos.targets.wrappers import DelegatingTarget

__all__ = [
    "SCHEMES",
    "BuiltinOptions",
    "Capability",
    "Fingerprint",
    "GenericOptions",
    "HFOptions",
    "SchemeOptions",
    "Target",
    "TargetOptions",
    "load_target",
    "resolve_target_options",
]


TargetFactory = Callable[..., Target]
SCHEMES: Registry[TargetFactory] = Registry("target scheme", "mmchaos.targets")


class BuiltinOptions(TorchOptions):
    """``builtin:`` options: the tiny torch models take ``device`` and ``threads``; ``ppocr`` takes neither."""


class HFOptions(TorchOptions):
    """``hf:`` options: how a transformers checkpoint may be loaded, and where it runs."""

    trust_remote_code: bool = False
    """Let the model repository run its own code."""
    use_safetensors: bool = True
    """False: also load pickled (``.bin``) weights."""
    allow_missing_weights: bool = False
    """Load a contrastive checkpoint that leaves weights newly initialised (refused by default)."""
    prompt_form: Literal["chat_template", "plain"] = "chat_template"
    """How a VLM's requests become its prompt: its saved chat template, or ``plain`` (each
    request's text, for the families prompted without one: Kosmos-2, Florence-2), recorded in the run."""


@takes_options(BuiltinOptions)
def _builtin(rest: str, options: BuiltinOptions) -> Target:
    """``builtin:NAME``: a model that ships inside the package and loads offline."""
    from mmchaos.targets.builtin import BUILTIN_TARGETS, TORCH_BUILTINS, load_builtin

    if rest not in BUILTIN_TARGETS:
        hint = closest(rest, BUILTIN_TARGETS, n=2, prefix="builtin:")
        raise UnknownNameError(f"unknown built-in target {rest!r}{hint} (known: {', '.join(BUILTIN_TARGETS)})")
    if rest not in TORCH_BUILTINS:
        given = [name for name, unset in (("threads", None), ("device", "cpu")) if getattr(options, name) != unset]
        if given:
            raise ConfigError(
                f"builtin:{rest} runs on ONNX Runtime on the CPU and takes no {' or '.join(given)} option",
                code="target_option_inapplicable",
            )
    return load_builtin(rest, device=options.device, threads=options.threads)


@takes_options(HFOptions)
def _hf(rest: str, options: HFOptions) -> Target:
    """``hf:<dir-or-hub-id>``: a transformers model from disk or the local hub cache (CLIP/SigLIP-style or a VLM).

    Generative VLMs (their config names a generation head) go to ``hf_vlm``, the rest to ``hf``.
    """
    from mmchaos.targets.threads import apply_threads

    target = _hf_target(rest, options)
    apply_threads(options.threads)
    return target


def _hf_target(rest: str, options: HFOptions) -> Target:
    from mmchaos.targets.hf_vlm import is_generative_config
    from mmchaos.targets.hub import local_dir, read_config

    path = local_dir(rest)
    if is_generative_config(read_config(path)):
        from mmchaos.targets.hf_vlm import HFVisionLanguageTarget

        if options.allow_missing_weights:
            raise ConfigError(
                f"hf:{rest} is a generative VLM, which never loads with weights missing: "
                "allow_missing_weights applies to contrastive models only",
                code="target_option_inapplicable",
            )
        return HFVisionLanguageTarget(
            path,
            uri=f"hf:{rest}",
            trust_remote_code=options.trust_remote_code,
            use_safetensors=options.use_safetensors,
            device=options.device,
            prompt_form=options.prompt_form,
        )
    from mmchaos.targets.hf import HFContrastiveTarget

    if options.prompt_form != "chat_template":
        raise ConfigError(
            f"hf:{rest} is a contrastive model, which takes no prompt: prompt_form applies to generative VLMs only",
            code="target_option_inapplicable",
        )
    return HFContrastiveTarget(
        rest,
        trust_remote_code=options.trust_remote_code,
        use_safetensors=options.use_safetensors,
        device=options.device,
        allow_missing_weights=options.allow_missing_weights,
    )


@takes_options(None)
def _py(rest: str, **options: Any) -> Target:
    """``py:package.module:factory``: the user's own pipeline, as an object implementing Target.

    Its options are the factory's keyword parameters; any other option is refused."""
    factory = _py_factory(rest, options)
    return _validate(factory(**options), f"py:{rest}")


def _py_factory(rest: str, options: Mapping[str, Any]) -> Callable[..., Any]:
    """The user's factory that ``py:rest`` names, once ``options`` are known to be its parameters."""
    module_name, sep, attr = rest.rpartition(":")
    if not sep or not module_name or not attr:
        raise TargetLoadError(f"py target must look like py:package.module:factory, got py:{rest}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TargetLoadError(f"cannot import {module_name!r} for py:{rest}: {exc}") from exc
    factory: Callable[..., Any] | None = getattr(module, attr, None)
    if not callable(factory):
        raise TargetLoadError(f"{module_name}.{attr} is not a callable factory")
    wanted = inspect.signature(factory).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in wanted.values()):
        named = [n for n, p in wanted.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
        for key in options:
            if key not in named:
                raise unknown_option_error(f"py:{rest}", key, named)
    return factory


SCHEMES.register("builtin", _builtin)
SCHEMES.register("hf", _hf)
SCHEMES.register("py", _py)
SCHEMES.register("onnx", "mmchaos.targets.onnx:load_onnx")
SCHEMES.register("openai", "mmchaos.targets.openai_http:load_openai")


class _ForeignTarget(DelegatingTarget):
    """Adapts a duck-typed object (capabilities + fingerprint + methods) to the Target base."""

    def __init__(self, inner: Any, uri: str, capabilities: frozenset[Capability]) -> None:
        super().__init__(inner)
        self.uri = uri
        self.capabilities = capabilities
        self.max_image_pixels = Target.max_image_pixels
        self.load_options = Target.load_options

    def close(self) -> None:
        if hasattr(self.inner, "close"):
            self.inner.close()


def _validate(obj: Any, uri: str) -> Target:
    caps_raw = getattr(obj, "capabilities", None)
    if caps_raw is None or not callable(getattr(obj, "fingerprint", None)):
        raise TargetLoadError(
            f"{uri} gave {type(obj).__name__}, which is not a mmchaos Target "
            "(subclass mmchaos.targets.Target, or provide capabilities and fingerprint())"
        )
    try:
        caps = frozenset(Capability(c) for c in caps_raw)
    except ValueError as exc:
        raise TargetLoadError(f"{uri} declares an unknown capability: {exc}") from exc
    if not isinstance(obj, Target):
        return _ForeignTarget(obj, getattr(obj, "uri", "") or uri, caps)
    if not obj.uri:
        obj.uri = uri
    return obj


def _split(uri: str) -> tuple[str, str]:
    scheme, sep, rest = uri.partition(":")
    if not sep or not rest:
        raise TargetLoadError(f"target must be a URI like builtin:tiny-clip or hf:/path, got {uri!r}")
    return scheme, rest


def resolve_target_options(uri: str, options: Mapping[str, Any] | None = None) -> ResolvedOptions:
    """Check ``options`` against the options model of ``uri``'s scheme, without loading the target.

    Unknown or invalid options are a one-line :class:`~mmchaos.errors.ConfigError` (exit 2)."""
    scheme, rest = _split(uri)
    if scheme == "py":  # its options are the user's factory's parameters: import it to know them
        _py_factory(rest, options or {})
    return resolve_options(scheme, SCHEMES.get(scheme), options)


def load_target(uri: str, options: Mapping[str, Any] | None = None) -> Target:
    """Load the target at ``uri`` with ``options`` (a :class:`TargetOptions` or a plain dict),
    checked against its scheme's options model; every failure is a TargetLoadError (or another UsageError).
    """
    scheme, rest = _split(uri)
    factory = SCHEMES.get(scheme)
    resolved = resolve_options(scheme, factory, options)
    try:
        if resolved.model is None:
            made = factory(rest, **resolved.load_options)
        elif type(resolved.model) is GenericOptions:
            made = factory(rest, **resolved.model.model_dump())  # a factory that names no model: kwargs, as ever
        else:
            made = factory(rest, resolved.model)
        target = _validate(made, uri)
        # Worker processes (contract, determinism) reload the target with the same options, and
        # with what the target recorded more precisely itself (e.g. the model it discovered).
        target.load_options = {**resolved.load_options, **dict(target.load_options or {})}
        return target
    except MMChaosError:
        raise
    except Exception as exc:  # a third-party factory may raise anything; that is a load failure
        raise TargetLoadError(f"cannot load target {uri}: {type(exc).__name__}: {exc}") from exc
