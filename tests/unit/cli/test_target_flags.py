"""The target flags, declared once: ``validate``, ``serve``, ``export`` and ``fuzz-replay`` take the
same ones, pass on only what was set, and refuse an option the target's scheme does not take
(exit 2, one line, naming the scheme's options) before anything loads or listens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer.main

from mmchaos.cli import app
from mmchaos.cli.target_flags import gather_options

TARGET_FLAGS = {
    "--model", "--device", "--threads", "--trust-remote-code", "--allow-pickle-weights",
    "--allow-missing-weights", "--allow-remote", "--target-config",
}  # fmt: skip


def _flags(command: str) -> set[str]:
    group: Any = typer.main.get_command(app)
    return {opt for param in group.commands[command].params for opt in param.opts if opt.startswith("--")}


@pytest.mark.parametrize("command", ["validate", "serve", "export", "fuzz-replay"])
def test_every_command_that_loads_a_target_takes_the_same_target_flags(command: str) -> None:
    assert _flags(command) >= TARGET_FLAGS


def test_serve_takes_the_target_flags_validate_takes() -> None:
    own = {"--suite", "--data", "--out", "--store", "--seed", "--resume", "--strict", "--executor", "--ray-address",
           "--workers", "--target", "--reference", "--baseline", "--tolerances", "--tolerance", "--help"}  # fmt: skip
    assert _flags("validate") - own == TARGET_FLAGS
    assert _flags("serve") >= TARGET_FLAGS


def test_only_the_flags_given_become_options_and_flags_win_over_the_file(tmp_path: Path) -> None:
    assert gather_options() == {}
    assert gather_options(allow_pickle_weights=True, threads=2) == {"use_safetensors": False, "threads": 2}
    config = tmp_path / "t.yaml"
    config.write_text("timeout: 5\nmodel: from-file\n")
    assert gather_options(target_config=config, model="from-flag") == {"timeout": 5, "model": "from-flag"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["validate", "--target", "onnx:/no/such/dir", "--trust-remote-code"], "its options: device, threads"),
        (["validate", "--target", "builtin:tiny-clip", "--allow-remote"], "'allow_remote' does not apply to builtin:"),
        (["serve", "--target", "builtin:tiny-clip", "--model", "m"], "'model' does not apply to builtin: targets"),
        (["serve", "--target", "onnx:/no/such/dir", "--threads", "0"], "Invalid value for '--threads'"),
        (["export", "builtin:tiny-clip", "{tmp}/out", "--allow-remote"], "its options: device, threads"),
        (
            ["fuzz-replay", "{tmp}/x.png", "--target", "onnx:/x", "--option", "trust_remote_code=true"],
            "'trust_remote_code' does not apply to onnx: targets",
        ),
        (
            ["fuzz-replay", "{tmp}/x.png", "--target", "py:tests.fakes.targets:hash_embed", "--threads", "2"],
            "'threads' does not apply to py:tests.fakes.targets:hash_embed",
        ),
        (["validate", "--resume", "latest", "--threads", "2"], "drop the target options (threads)"),
        (["validate", "--target", "openai:http://127.0.0.1:1/v1", "--target-config", "{tmp}/none"], "cannot read"),
    ],
)
def test_an_option_the_scheme_does_not_take_exits_2_in_one_line(
    run_cli: Any, tmp_path: Path, argv: list[str], message: str
) -> None:
    (tmp_path / "x.png").write_bytes(b"\x89PNG")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, out, err = run_cli(*argv, *(["--store", str(tmp_path / "r.db")] if argv[0] == "validate" else []))
    assert code == 2, out + err
    assert message in " ".join(err.split()) and "Traceback" not in out + err
