"""CLI exit codes (0 pass, 1 gate failed, 2 bad input) and the report files it writes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import _snapshot, _validate


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["validate", "--target", "nonsense"], "target must be a URI"),
        (["validate", "--target", "builtin:tiny-clp"], "did you mean builtin:tiny-clip"),
        (["validate", "--suite", "nope"], "unknown suite"),
        pytest.param(  # loads torch and transformers before it can refuse: not the fast tier
            ["validate", "--target", "hf:/nonexistent/model"],
            "neither a directory nor in the local hub cache",
            marks=pytest.mark.integration,
        ),
        (
            ["validate", "--target", "py:tests.fakes.targets:hash_embed", "--data", "/no/such.jsonl"],
            "dataset not found",
        ),
        (["report", "nope"], "no run store"),
        (["list", "bogus"], "unknown kind"),
        (["validate", "--bogus-flag"], "No such option"),
    ],
)
def test_bad_input_exits_2_with_one_line(run_cli, tmp_path: Path, argv: list[str], message: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(*argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err + out


def _as_unprivileged() -> list[str]:
    """A command prefix under which file modes apply: nothing for a normal user; as root (who
    ignores modes), a user namespace (``unshare --user``), else the test cannot run here."""
    if os.geteuid() != 0:
        return []
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "--user", "true"], capture_output=True, timeout=30).returncode == 0:
        return [unshare, "--user"]
    pytest.skip("running as root without unshare --user: file modes cannot be enforced")


def _cli_unprivileged(env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    proc = subprocess.run(
        [*_as_unprivileged(), sys.executable, "-m", "mmchaos", *argv],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.integration  # runs the CLI in child processes under unshare
def test_read_only_store_is_listed_and_rerendered_but_not_run_into(  # type: ignore[no-untyped-def]
    run_cli, tmp_path: Path, suite_file: Path, subprocess_env: dict[str, str]
) -> None:
    assert _validate(run_cli, tmp_path, suite_file, "py:tests.fakes.targets:padding_leak")[0] == 1
    run_id = json.loads((tmp_path / "out" / "results.json").read_text())["run_id"]
    folder = tmp_path / "ro"
    folder.mkdir()
    store = folder / "runs.db"
    store.write_bytes((tmp_path / "runs.db").read_bytes())
    store.chmod(0o444)
    folder.chmod(0o555)
    try:
        before = _snapshot(store)
        code, out, err = _cli_unprivileged(subprocess_env, "runs", "--store", str(store))
        assert code == 0 and run_id[:15] in out, err
        code, _, err = _cli_unprivileged(
            subprocess_env, "report", run_id, "--store", str(store), "--out", str(tmp_path / "again")
        )
        assert code == 1 and (tmp_path / "again" / "results.json").is_file(), err
        code, _, err = _cli_unprivileged(
            subprocess_env, "validate", "--target", "py:tests.fakes.targets:hash_embed", "--suite", str(suite_file),
            "--data", "builtin:shapes?n=6", "--out", str(tmp_path / "o2"), "--store", str(store),
        )  # fmt: skip
        assert code == 2 and "read-only" in err, err
        assert _snapshot(store) == before
    finally:
        folder.chmod(0o755)


@pytest.mark.integration  # runs the CLI in child processes under unshare
def test_unwritable_out_unreadable_data_and_export_folder_exit_2(  # type: ignore[no-untyped-def]
    tmp_path: Path, suite_file: Path, subprocess_env: dict[str, str]
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    data = tmp_path / "eval.jsonl"
    data.write_text('{"image": "x.png", "text": "a"}\n')
    data.chmod(0o000)
    locked.chmod(0o555)
    base = ["validate", "--target", "py:tests.fakes.targets:hash_embed", "--suite", str(suite_file)]
    try:
        cases = [
            ([*base, "--out", str(locked / "out"), "--store", str(tmp_path / "a.db")], "cannot write to --out"),
            ([*base, "--data", str(data), "--store", str(tmp_path / "b.db")], "cannot read --data"),
            (["export", "py:tests.fakes.targets:hash_embed", str(locked / "onnx")], "cannot write to export folder"),
        ]
        for argv, message in cases:
            code, out, err = _cli_unprivileged(subprocess_env, *argv)
            assert code == 2 and message in err, (argv, err)
            assert "Traceback" not in out + err
    finally:
        locked.chmod(0o755)
        data.chmod(0o644)
