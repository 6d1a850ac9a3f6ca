"""Target options per scheme: each scheme takes its own options, refuses the others with a one-line
error that names its options, and round-trips them as the plain JSON dict workers reload from."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from mmchaos.errors import ConfigError, UsageError
from mmchaos.targets import SCHEMES, GenericOptions, TargetOptions, load_target, resolve_target_options
from mmchaos.targets.options import SchemeOptions, load_target_config, options_model_of, resolve_options, takes_options


@pytest.mark.parametrize(
    ("uri", "option", "names"),
    [
        ("onnx:/models/x", "trust_remote_code", "device, threads"),
        ("builtin:tiny-clip", "model", "device, threads"),
        (
            "hf:/models/x",
            "model",
            "allow_missing_weights, device, prompt_form, threads, trust_remote_code, use_safetensors",
        ),
        ("openai:http://127.0.0.1:1/v1", "threads", "allow_remote, api_key_env"),
    ],
)
def test_an_option_a_scheme_does_not_take_is_refused_naming_its_options(uri: str, option: str, names: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_target_options(uri, TargetOptions({option: 1}))
    message = str(info.value)
    assert info.value.code == "target_option_unknown"
    assert f"option {option!r} does not apply to {uri.partition(':')[0]}: targets" in message
    assert names in message and "\n" not in message


def test_a_misspelt_option_gets_a_did_you_mean() -> None:
    with pytest.raises(ConfigError, match="did you mean timeout") as info:
        resolve_target_options("openai:http://127.0.0.1:1/v1", {"timout": 5})
    assert "max_retries" in str(info.value)  # the scheme's options are named


@pytest.mark.parametrize(
    ("uri", "options", "where"),
    [
        ("onnx:/x", {"threads": 0}, "threads"),
        ("onnx:/x", {"device": "gpu"}, "device"),
        ("openai:http://127.0.0.1:1/v1", {"timeout": -1}, "timeout"),
        ("openai:http://127.0.0.1:1/v1", {"image_input": "jpeg"}, "image_input"),
        ("openai:http://127.0.0.1:1/v1", {"capabilities": ["fly"]}, "capabilities"),
        ("hf:/x", {"trust_remote_code": "sometimes"}, "trust_remote_code"),
    ],
)
def test_a_bad_value_names_the_option(uri: str, options: dict[str, Any], where: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_target_options(uri, options)
    assert info.value.code == "target_option_invalid"
    assert f"target option {where}" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("uri", "options"),
    [
        ("onnx:/x", {"threads": 2, "device": "cuda:1"}),
        ("builtin:tiny-clip", {"threads": 3}),
        ("hf:/x", {"use_safetensors": False, "device": "cpu", "trust_remote_code": True}),
        (
            "openai:http://127.0.0.1:1/v1",
            {"model": "m", "timeout": 2.5, "max_retries": 0, "image_input": "data_url", "capabilities": ["generate"]},
        ),
    ],
)
def test_load_options_are_json_and_resolve_to_the_same_options_again(uri: str, options: dict[str, Any]) -> None:
    """Workers reload a target from ``load_options``: a plain JSON dict that round-trips the model."""
    first = resolve_target_options(uri, TargetOptions(options))
    again = resolve_target_options(uri, TargetOptions(**json.loads(json.dumps(first.load_options))))
    assert again.model == first.model and again.load_options == first.load_options
    assert "device" not in resolve_target_options(uri, {}).load_options  # defaults are not stored


@pytest.mark.parametrize("scheme", ["builtin", "hf", "onnx", "openai"])
def test_every_builtin_scheme_registers_an_options_model_that_forbids_unknown_fields(scheme: str) -> None:
    model = options_model_of(SCHEMES.get(scheme))
    assert model is not None and issubclass(model, SchemeOptions) and model is not GenericOptions
    assert model.model_config.get("extra") == "forbid"
    assert model().model_dump(mode="json", exclude_defaults=True) == {}  # every option has a default


def test_py_targets_check_their_options_against_the_factory() -> None:
    assert options_model_of(SCHEMES.get("py")) is None


def test_onnx_device_names_the_execution_provider() -> None:
    from mmchaos.targets.onnx import OnnxOptions

    assert OnnxOptions().providers() == ["CPUExecutionProvider"]
    assert OnnxOptions(device="cuda:1").providers() == [("CUDAExecutionProvider", {"device_id": 1})]


def test_builtin_ppocr_refuses_torch_options_it_cannot_apply() -> None:
    with pytest.raises(ConfigError, match="takes no threads option") as info:
        load_target("builtin:ppocr", TargetOptions(threads=2))
    assert info.value.code == "target_option_inapplicable"


def test_a_factory_that_names_no_model_gets_the_generic_options_as_keyword_arguments() -> None:
    """Third-party schemes written before per-scheme models keep their call: every generic option."""
    got: dict[str, Any] = {}

    def legacy(rest: str, **options: Any) -> Any:
        got.update(options)
        raise RuntimeError("stop here")

    assert options_model_of(legacy) is GenericOptions
    SCHEMES.register("legacy-test", legacy)
    try:
        with pytest.raises(UsageError, match="stop here"):
            load_target("legacy-test:x", TargetOptions(threads=2))
        assert got == {**GenericOptions().model_dump(), "threads": 2}
        with pytest.raises(ConfigError, match="did you mean trust_remote_code"):
            load_target("legacy-test:x", TargetOptions(trust_remote=True))
    finally:
        SCHEMES._specs.pop("legacy-test")
        SCHEMES._loaded.pop("legacy-test", None)


def test_a_factory_with_a_model_gets_the_validated_model() -> None:
    class Opts(SchemeOptions):
        size: int = 1

    @takes_options(Opts)
    def factory(rest: str, options: Opts) -> Any:
        raise RuntimeError(f"size={options.size}")

    assert resolve_options("x", factory, {"size": "3"}).load_options == {"size": 3}
    SCHEMES.register("model-test", factory)
    try:
        with pytest.raises(UsageError, match="size=3"):
            load_target("model-test:x", {"size": 3})
        with pytest.raises(ConfigError, match=r"its options: size\)"):
            load_target("model-test:x", {"colour": "red"})
    finally:
        SCHEMES._specs.pop("model-test")
        SCHEMES._loaded.pop("model-test", None)


def test_py_targets_take_their_factorys_parameters_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "options_factory_mod.py").write_text(
        "from tests.fakes.targets import hash_embed\n\n"
        "def scaled(scale: float = 1.0):\n"
        "    target = hash_embed()\n"
        "    target.scale = scale\n"
        "    return target\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    target = load_target("py:options_factory_mod:scaled", TargetOptions(scale=2.0))
    assert target.scale == 2.0  # type: ignore[attr-defined]
    assert target.load_options == {"scale": 2.0}
    with pytest.raises(ConfigError, match=r"'threads' does not apply to py:options_factory_mod:scaled.*scale"):
        load_target("py:options_factory_mod:scaled", TargetOptions(threads=2))


def test_target_options_hold_only_what_was_given() -> None:
    given = TargetOptions({"threads": 2}, device="cuda")
    assert dict(given) == {"threads": 2, "device": "cuda"} and given.device == "cuda"
    assert TargetOptions().device == "cpu" and not TargetOptions()
    assert pickle.loads(pickle.dumps(given)) == given  # Ray sends it to its actors
    assert given.merged({"threads": 4}).to_dict() == {"threads": 4, "device": "cuda"}
    assert repr(TargetOptions(b=1, a=2)) == "TargetOptions(a=2, b=1)"


def test_target_config_files_are_read_or_refused_in_one_line(tmp_path: Path) -> None:
    good = tmp_path / "t.yaml"
    good.write_text("timeout: 5\nimage_input: data_url\n")
    assert load_target_config(good) == {"timeout": 5, "image_input": "data_url"}
    (tmp_path / "empty.yaml").write_text("")
    assert load_target_config(tmp_path / "empty.yaml") == {}
    for name, text, message in [
        ("list.yaml", "- timeout\n", "must be a mapping"),
        ("bad.yaml", "timeout: [\n", "is not valid YAML"),
        ("missing.yaml", None, "cannot read --target-config"),
    ]:
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(ConfigError, match=message) as info:
            load_target_config(path)
        assert info.value.code == "target_config_invalid" and "\n" not in str(info.value)
