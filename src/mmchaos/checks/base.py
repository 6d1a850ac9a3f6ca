"""What a check is, what it yields, and what it gets to work with.

A check is one experiment against a target. It declares the capabilities it needs (it is skipped
with the reason when the target lacks them), validates its parameters and gate with pydantic
models, and yields :class:`Finding` objects. Anything it raises becomes an ``error`` finding: the
harness outlives its target.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, cast, get_args, get_origin

import numpy as np
from pydantic import BaseModel, ConfigDict

from mmchaos.findings import Finding, Step, Verdict
from mmchaos.targets.base import Capability, Target

if TYPE_CHECKING:
    from collections.abc import Sequence
    from contextlib import AbstractContextManager

    from mmchaos.data.base import Dataset
    from mmchaos.executors import Executor, UnitFn, UnitJournal
    from mmchaos.executors.forked import ForkedUnitExecutor
    from mmchaos.executors.isolated import JournaledRunner
    from mmchaos.executors.jobs import Handler, WorkerSpec
    from mmchaos.executors.resources import RunResources

__all__ = [
    "ANY_MODALITY",
    "AnyCheck",
    "Check",
    "CheckContext",
    "CheckGate",
    "CheckParams",
    "Gate",
    "NullProgress",
    "Params",
    "ProgressSink",
]


class CheckParams(BaseModel):
    """Base of every check's parameters: validated at the boundary, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class CheckGate(BaseModel):
    """Base of every check's gate: the thresholds a finding is held against."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# Short names for check modules: ``class MyParams(Params)``.
Params = CheckParams
Gate = CheckGate


class ProgressTask(Protocol):
    def advance(self, n: int = 1) -> None: ...

    def close(self) -> None: ...


class ProgressSink(Protocol):
    """Where long loops report progress; the CLI passes Rich bars, the library passes nothing."""

    def task(self, description: str, total: int) -> ProgressTask: ...


class _NullTask:
    def advance(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class NullProgress:
    def task(self, description: str, total: int) -> ProgressTask:
        return _NullTask()


@dataclass
class CheckContext:
    """Everything a check may use: the target, the data, a seeded generator and a progress sink.

    It is also a check's one way to the execution layer (:mod:`mmchaos.executors`): work units go
    through :meth:`map_units`, jobs that need an isolated worker process through :meth:`isolated`.
    Either way they run on the run's executor (here, or ``--executor ray``) and are journaled, so
    ``--resume`` reads back what had finished.
    """

    target: Target
    dataset: Dataset
    seed: int
    check_id: str
    progress: ProgressSink = field(default_factory=NullProgress)
    max_samples: int | None = None
    executor: Executor | None = None
    """Where work units run (None: in this process, on ``target``); see :mod:`mmchaos.executors`."""
    unit_executor: ForkedUnitExecutor | None = None
    """Where this check's work units run when ``executor`` is None: workers forked with the loaded target,
    one per core (:mod:`mmchaos.executors.forked`; given to checks that set ``parallel_units``)."""
    journal: UnitJournal | None = None
    """Where finished units are committed, so a resumed run does not compute them again."""
    resources: RunResources | None = None
    """What the run's checks share (reference server, worker pool); None: the check starts its own."""
    reference: Target | None = None
    """What the target claims to serve (``validate --reference``), loaded once a run; None: not given."""

    def rng(self, *stream: int | str) -> np.random.Generator:
        """A generator seeded by (run seed, check id, stream): independent of run order."""
        return seeded_rng(self.seed, self.check_id, *stream)

    def map_units(
        self,
        fn: UnitFn[S, U, R],
        shared: S,
        units: Sequence[U],
        *,
        keys: Sequence[str],
        encode: Callable[[R], Any],
        decode: Callable[[Any], R],
    ) -> Generator[R, None, None]:
        """Run work units on the run's executor (or here), results in order, committed as they come.

        ``fn`` is a module-level function ``fn(worker, shared, unit)``; ``keys`` name the units in
        the journal; ``encode``/``decode`` turn a result into JSON-able values and back.
        """
        from mmchaos.executors import LocalExecutor, Worker, run_units
        from mmchaos.timing import clock_of

        executor = self.executor
        if executor is None and self.unit_executor is not None and self.unit_executor.available():
            executor = self.unit_executor
        executor = executor or LocalExecutor(Worker(self.target, self.dataset))
        return run_units(
            executor, fn, shared, units, keys=keys, encode=encode, decode=decode, journal=self.journal,
            what=f"{self.check_id} units", clock=clock_of(self.target),
        )  # fmt: skip

    def isolated(
        self,
        handler: Handler,
        spec: WorkerSpec,
        *,
        workers: int,
        start_timeout: float,
        overlay: dict[str, Any] | None = None,
        in_process: bool = False,
    ) -> AbstractContextManager[JournaledRunner]:
        """Worker processes that load the target by ``spec`` and run ``handler(target, spec, payload)``
        jobs, surviving the target's crashes and hangs: the run's shared pool of ``workers`` processes
        (``--executor ray``: a pool on each actor), or with ``in_process`` this process (for a target
        that cannot be loaded by URI). Jobs given keys are journaled. ``overlay``: spec fields of this
        check's jobs (context, accepted errors). Entering raises :class:`~mmchaos.errors.TargetLoadError`
        when the workers cannot load the target.
        """
        from mmchaos.executors.isolated import open_isolated
        from mmchaos.targets.wrappers import unwrap
        from mmchaos.timing import clock_of

        return open_isolated(
            spec, handler, workers=workers, start_timeout=start_timeout, overlay=overlay, executor=self.executor,
            resources=self.resources, journal=self.journal, clock=clock_of(self.target),
            in_process=unwrap(self.target) if in_process else None, what=f"{self.check_id} jobs",
        )  # fmt: skip

    def prefetch_isolated(self, spec: WorkerSpec, *, workers: int, start_timeout: float) -> None:
        """Start now, in the background, the worker pool :meth:`isolated` will give (a check's
        ``prepare``); nothing when the check runs alone or its jobs go to a Ray executor."""
        from mmchaos.executors.isolated import prefetch_isolated

        prefetch_isolated(
            spec, workers=workers, start_timeout=start_timeout, executor=self.executor, resources=self.resources
        )


def seeded_rng(seed: int, check_id: str, *stream: int | str) -> np.random.Generator:
    """:meth:`CheckContext.rng` for code that runs away from the context (a work unit on a worker)."""
    words = [seed, _stable_int(check_id)]
    words += [s if isinstance(s, int) else _stable_int(s) for s in stream]
    return np.random.default_rng(words)


def _stable_int(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


ANY_MODALITY: tuple[frozenset[Capability], ...] = (
    frozenset({Capability.EMBED_IMAGE}),
    frozenset({Capability.EMBED_TEXT}),
    frozenset({Capability.READ_TEXT}),
)
"""``requires`` of checks that work on whatever single modality the target handles."""


S = TypeVar("S")
U = TypeVar("U")
R = TypeVar("R")
P = TypeVar("P", bound=BaseModel)
G = TypeVar("G", bound=BaseModel)


class Check(Generic[P, G]):
    """Base class: subclasses set the class attributes and implement :meth:`run`.

    Generic over its parameter and gate models, so ``self.params`` and ``self.gate`` have the
    subclass's types: ``class Robustness(Check[RobustnessParams, RobustnessGate])``. The class
    attributes ``Params`` and ``Gate`` (what suites validate against) are read from those generic
    arguments when the subclass is defined; a check without either names ``CheckParams`` or
    ``CheckGate``.
    """

    name: ClassVar[str] = ""
    step: ClassVar[Step]
    requires: ClassVar[tuple[frozenset[Capability], ...]] = ()
    """Alternatives: the check runs when the target has every capability of at least one set."""
    parallel_units: ClassVar[bool] = False
    """Whether the run may run this check's work units on forked workers, one per core (units that
    are many, independent and model-bound, like a robustness sweep's; see :mod:`mmchaos.executors.forked`)."""
    Params: ClassVar[type[BaseModel]]
    """The parameter model, from ``Check[Params, Gate]`` (set by :meth:`__init_subclass__`)."""
    Gate: ClassVar[type[BaseModel]]
    """The gate model, from ``Check[Params, Gate]``."""
    _models: ClassVar[tuple[object, object]]
    """What ``Params`` and ``Gate`` are in this class: models, or type variables while it is generic."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        params, gate = _generic_models(cls)
        models = (cls.__dict__.get("Params", params), cls.__dict__.get("Gate", gate))
        cls._models = models
        still_generic = [m for m in models if isinstance(m, TypeVar)]
        if still_generic and all(m in getattr(cls, "__parameters__", ()) for m in still_generic):
            return  # a generic base of checks: its own subclasses name the models
        wrong = [
            f"{what} {'nothing' if isinstance(m, TypeVar) else repr(m)}"
            for what, m in zip(("parameters", "gate"), models, strict=True)
            if not (isinstance(m, type) and issubclass(m, BaseModel))
        ]
        if wrong:
            raise TypeError(
                f"check class {cls.__qualname__} must name its parameter and gate models as "
                f"Check[ParamsModel, GateModel] (CheckParams/CheckGate for none); got {', '.join(wrong)}"
            )
        cls.Params, cls.Gate = cast("tuple[type[BaseModel], type[BaseModel]]", models)

    def __init__(self, params: P | None = None, gate: G | None = None) -> None:
        self.params: P = params if params is not None else cast(P, self.Params())
        self.gate: G = gate if gate is not None else cast(G, self.Gate())

    def missing_capabilities(self, target: Target) -> str | None:
        """Why this check cannot run on ``target``, or None when it can."""
        if not self.requires or any(target.has(*alt) for alt in self.requires):
            return None
        wanted = " or ".join("+".join(sorted(c.value for c in alt)) for alt in self.requires)
        have = ", ".join(sorted(c.value for c in target.capabilities)) or "none"
        return f"needs {wanted}; target has {have}"

    def prepare(self, ctx: CheckContext) -> None:
        """Called for every check of a run before the first one runs: start, in the background
        (``ctx.resources.prefetch``), what :meth:`run` will need, so it overlaps with earlier checks."""

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        raise NotImplementedError

    def finding(self, ctx: CheckContext, verdict: Verdict, title: str, **kw: Any) -> Finding:
        return Finding(check=ctx.check_id, step=self.step, verdict=verdict, title=title, **kw)


Check._models = (P, G)


def _generic_models(cls: type) -> tuple[object, object]:
    """``(Params, Gate)`` as the first check base of ``cls`` states them, its generic arguments
    put in for the type variables that base is generic in."""
    for base in cls.__dict__.get("__orig_bases__", cls.__bases__):
        origin = get_origin(base) or base
        if not (isinstance(origin, type) and issubclass(origin, Check)):
            continue
        bound = dict(zip(getattr(origin, "__parameters__", ()), get_args(base), strict=False))
        params, gate = origin._models
        return bound.get(params, params), bound.get(gate, gate)
    return P, G  # unreachable for a subclass of Check: one of its bases is a check class


AnyCheck = Check[Any, Any]
"""A check of any parameter and gate types (what registries and suites hold)."""

CheckFactory = Callable[[dict[str, Any], dict[str, Any]], AnyCheck]
