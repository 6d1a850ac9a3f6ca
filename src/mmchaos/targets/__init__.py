"""Targets addressed by URI: ``builtin:NAME``, ``hf:PATH``, ``py:module:factory``, plug-in schemes.

Third-party adapters register a URI scheme in the ``mmchaos.targets`` entry-point group; the
value is a ``"module:factory"`` called as ``factory(rest_of_uri, **options)``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from mmchaos.errors import MMChaosError, TargetLoadError, UnknownNameError
from mmchaos.registry import Registry, closest
from mmchaos.targets.base import Capability, Fingerprint, Target
from mmchaos.targets.wrappers import DelegatingTarget

__all__ = ["SCHEMES", "Capability", "Fingerprint", "Target", "TargetOptions", "load_target"]


@dataclass(frozen=True)
class TargetOptions:
    """Options that apply to every scheme; a scheme ignores what it has no use for."""

    trust_remote_code: bool = False
    use_safetensors: bool = True
    device: str = "cpu"
    model: str | None = None
    """openai: targets: the served model name (default: the one the endpoint lists)."""
    allow_remote: bool = False
    """openai: targets: allow hosts that are not loopback addresses."""
    allow_missing_weights: bool = False
    """hf: targets: load a checkpoint that leaves weights newly initialised (refused by default)."""
    threads: int | None = None
    """torch intra-op threads of the process that loads the target (see :mod:`mmchaos.targets.threads`);
    None: 1 for the built-in tiny models, torch's default (one per core) for ``hf:`` models."""


TargetFactory = Callable[..., Target]
SCHEMES: Registry[TargetFactory] = Registry("target scheme", "mmchaos.targets")


def _builtin(rest: str, **options: Any) -> Target:
    """``builtin:NAME``: a model that ships inside the package and loads offline."""
    from mmchaos.targets.builtin import BUILTIN_TARGETS, load_builtin

    if rest not in BUILTIN_TARGETS:
        hint = closest(rest, BUILTIN_TARGETS, n=2, prefix="builtin:")
        raise UnknownNameError(f"unknown built-in target {rest!r}{hint} (known: {', '.join(BUILTIN_TARGETS)})")
    return load_builtin(rest, device=options.get("device", "cpu"), threads=options.get("threads"))


def _hf(rest: str, **options: Any) -> Target:
    """``hf:<dir-or-hub-id>``: a transformers model from disk or the local hub cache (CLIP/SigLIP-style or a VLM).

    Generative VLMs (their config names a generation head) go to ``hf_vlm``, the rest to ``hf``.
    """
    from mmchaos.targets.threads import apply_threads

    target = _hf_target(rest, **options)
    apply_threads(options.get("threads"))
    return target


def _hf_target(rest: str, **options: Any) -> Target:
    from mmchaos.targets.hf_vlm import is_generative_config
    from mmchaos.targets.hub import local_dir, read_config

    path = local_dir(rest)
    if is_generative_config(read_config(path)):
        from mmchaos.targets.hf_vlm import HFVisionLanguageTarget

        return HFVisionLanguageTarget(
            path,
            uri=f"hf:{rest}",
            trust_remote_code=bool(options.get("trust_remote_code", False)),
            use_safetensors=bool(options.get("use_safetensors", True)),
            device=str(options.get("device", "cpu")),
        )
    from mmchaos.targets.hf import HFContrastiveTarget

    return HFContrastiveTarget(
        rest,
        trust_remote_code=bool(options.get("trust_remote_code", False)),
        use_safetensors=bool(options.get("use_safetensors", True)),
        device=str(options.get("device", "cpu")),
        allow_missing_weights=bool(options.get("allow_missing_weights", False)),
    )


def _py(rest: str, **options: Any) -> Target:
    """``py:package.module:factory``: the user's own pipeline, as an object implementing Target."""
    module_name, sep, attr = rest.rpartition(":")
    if not sep or not module_name or not attr:
        raise TargetLoadError(f"py target must look like py:package.module:factory, got py:{rest}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TargetLoadError(f"cannot import {module_name!r} for py:{rest}: {exc}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise TargetLoadError(f"{module_name}.{attr} is not a callable factory")
    wanted = inspect.signature(factory).parameters
    kwargs = {k: v for k, v in options.items() if k in wanted}
    return _validate(factory(**kwargs), f"py:{rest}")


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


def load_target(uri: str, options: TargetOptions | None = None) -> Target:
    """Load the target at ``uri``; every failure is a TargetLoadError (or another UsageError)."""
    scheme, sep, rest = uri.partition(":")
    if not sep or not rest:
        raise TargetLoadError(f"target must be a URI like builtin:tiny-clip or hf:/path, got {uri!r}")
    factory = SCHEMES.get(scheme)
    opts = asdict(options or TargetOptions())
    try:
        target = _validate(factory(rest, **opts), uri)
        # Worker processes (contract, determinism) reload the target with the same options,
        # unless the target recorded more precise ones itself (e.g. the model it discovered).
        if not target.load_options:
            target.load_options = dict(opts)
        return target
    except MMChaosError:
        raise
    except Exception as exc:  # a third-party factory may raise anything; that is a load failure
        raise TargetLoadError(f"cannot load target {uri}: {type(exc).__name__}: {exc}") from exc
