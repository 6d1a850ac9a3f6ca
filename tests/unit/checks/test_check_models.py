"""A check's ``Params`` and ``Gate`` are read from ``Check[P, G]``; a check that names neither is refused."""

from __future__ import annotations

import inspect
import re
import types
from typing import Any, Generic, TypeVar, get_args

import pytest

from mmchaos.checks import REGISTRY
from mmchaos.checks.base import Check, CheckGate, CheckParams, G, P


class SizeParams(CheckParams):
    size: int = 3


class SizeGate(CheckGate):
    max_errors: int = 0


def test_the_generic_arguments_are_the_models() -> None:
    class Sized(Check[SizeParams, SizeGate]):
        name = "sized"

    assert (Sized.Params, Sized.Gate) == (SizeParams, SizeGate)
    check = Sized()
    assert check.params == SizeParams() and check.gate == SizeGate()
    assert Sized.Params.model_validate({"size": 5}) == SizeParams(size=5)


def test_a_subclass_inherits_them_and_a_generic_base_passes_them_on() -> None:
    class Sized(Check[SizeParams, SizeGate]):
        pass

    class Resized(Sized):
        pass

    assert (Resized.Params, Resized.Gate) == (SizeParams, SizeGate)

    class AnyModels(Check[P, G], Generic[P, G]):
        """A generic base of checks names nothing yet."""

    class ViaBase(AnyModels[SizeParams, SizeGate]):
        pass

    assert (ViaBase.Params, ViaBase.Gate) == (SizeParams, SizeGate)

    Q = TypeVar("Q", bound=CheckParams)

    class GateFixed(Check[Q, SizeGate], Generic[Q]):
        pass

    class ViaHalf(GateFixed[SizeParams]):
        pass

    assert (ViaHalf.Params, ViaHalf.Gate) == (SizeParams, SizeGate)


def test_models_set_in_the_class_body_still_count() -> None:
    class Plain(Check):  # type: ignore[type-arg]
        Params = SizeParams
        Gate = CheckGate

    assert (Plain.Params, Plain.Gate) == (SizeParams, CheckGate)


@pytest.mark.parametrize(
    ("base", "named"),
    [(Check, "parameters nothing, gate nothing"), (Check[Any, Any], "typing.Any"), (Check[SizeParams, int], "int")],
)
def test_a_check_that_names_no_models_is_refused_where_it_is_defined(base: Any, named: str) -> None:
    with pytest.raises(TypeError, match=r"must name its parameter and gate models as Check\[ParamsModel, GateModel\]"):
        types.new_class("Nameless", (base,))
    with pytest.raises(TypeError, match=named):
        types.new_class("Nameless", (base,))


@pytest.mark.parametrize("name", REGISTRY.names())
def test_every_built_in_check_states_its_models_once(name: str) -> None:
    cls = REGISTRY.get(name)
    base = next(b for b in cls.__orig_bases__ if getattr(b, "__origin__", None) is Check)  # type: ignore[attr-defined]
    assert (cls.Params, cls.Gate) == get_args(base)
    assert not re.search(r"^\s+(Params|Gate)\s*=", inspect.getsource(cls), re.M), f"{name} restates Params/Gate"
